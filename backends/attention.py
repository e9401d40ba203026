"""The attention-kernel switch shared by every backend
(``attention_kernel=triton|triton_ws|triton_ws_f16p|triton_ws_bf16p|flashmla``).

Upstream, both engines end in FlashMLA's sparse decode on a table of device slots, so one
switch covers both backends: ``triton`` is this project's ``sparse_mla_decode``, ``triton_ws``
its warp-specialised Gluon kernel (Hopper; ``sparse_mla_decode(kernel="ws")``, float32 split
partials as FlashMLA's), ``triton_ws_f16p`` / ``triton_ws_bf16p`` the same kernel with scaled
fp16 / bf16 split partials (``split_partials="float16"`` / ``"bfloat16"``: half the bytes in
split calls, i.e. small batches; fp16 ones at the float32 partials' error, bf16 ones at a
slightly larger one; BENCHMARKS 6w, 6x),
``flashmla`` the upstream kernels (optional extra) behind the same signature.
"""
from __future__ import annotations

import functools
from typing import Callable, Tuple

import torch

from backends.base import BackendInvalid, BackendUnavailable

AttentionFn = Callable[..., Tuple[torch.Tensor, torch.Tensor]]
#: ``attention_kernel``: ours (Triton, or the warp-specialised Gluon kernel with float32 or
#: the split partials it names), or FlashMLA's (optional extra)
ATTENTION_KERNELS = ("triton", "triton_ws", "triton_ws_f16p", "triton_ws_bf16p", "flashmla")
#: the warp-specialised kernel's names and their ``split_partials``
_WS_PARTIALS = {"triton_ws": "float32", "triton_ws_f16p": "float16",
                "triton_ws_bf16p": "bfloat16"}


def heads_computed(name: str, num_heads: int, kv_dtype: str) -> int:
    """Query heads the ``name`` kernel actually computes for ``num_heads`` with KV rows of
    ``kv_dtype`` (FlashMLA pads to 64-head programs; the warp-specialised kernel serves 16 or
    32 heads a program up to a per-format count, else 64: ``block_heads``)."""
    if name == "flashmla":
        from backends.kernels.flashmla_peer import PeerUnsupported, padded_heads
        try:
            return padded_heads(num_heads)
        except PeerUnsupported:
            return num_heads
    if name in _WS_PARTIALS:
        from backends.kernels.sparse_mla_decode_ws import block_heads
        block_h = block_heads(num_heads, kv_dtype)
        return -(-num_heads // block_h) * block_h
    return num_heads


def resolve_attention(name: str, device: torch.device, num_heads: int, d_qk: int, d_v: int,
                      kv_rows: torch.Tensor) -> AttentionFn:
    """The attention callable for ``name``; checks up front (before any timing) that the
    kernel supports the shapes: raises BackendUnavailable / BackendInvalid otherwise."""
    if name == "triton":
        from backends.kernels.sparse_mla_decode import sparse_mla_decode
        return sparse_mla_decode
    if name in _WS_PARTIALS:
        from backends.kernels.sparse_mla_decode import sparse_mla_decode
        from backends.kernels.sparse_mla_decode_ws import ws_supported
        why = ws_supported(torch.empty(1, num_heads, d_qk, dtype=torch.bfloat16, device=device),
                           kv_rows, d_v)
        if why is not None:
            raise BackendInvalid(f"attention_kernel={name!r} {why}")
        return functools.partial(sparse_mla_decode, kernel="ws", split_partials=_WS_PARTIALS[name])
    if name == "flashmla":
        from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported, check_supported, flashmla_attention
        try:
            fn = flashmla_attention(device)
        except PeerUnavailable as e:
            raise BackendUnavailable(str(e)) from e
        try:
            check_supported(torch.empty(1, num_heads, d_qk, device="meta"), kv_rows, d_v)
        except PeerUnsupported as e:
            raise BackendInvalid(str(e)) from e
        return fn
    raise BackendInvalid(f"attention_kernel={name!r}: allowed {', '.join(ATTENTION_KERNELS)}")
