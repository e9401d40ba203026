"""FlashMLA's own sparse kernels (the ``sgl-flash-mla`` package) behind the signature of
``sparse_mla_decode``, so either backend can swap its attention kernel for the upstream one.

Kernel choice by KV row format, as vLLM does:
  * ``fp8_ds_mla`` (656 B rows): the V3.2 sparse decode ``flash_mla_with_kvcache`` (SM90
    "legacy" op) on the cache viewed as ``[num_slots / 64, 64, 1, 656]`` with ``indices``
    ``[B, 1, K]`` holding flat slot ids (``block * 64 + offset`` of that view = the slot id).
  * ``bf16`` (576 values): ``flash_mla_sparse_fwd`` with the batch as its query axis:
    ``q [B, H, 576]``, ``kv [num_slots, 1, 576]``, ``indices [B, 1, K]``.
Any logical page size works: the kernels see only flat slot ids, so the pool is always viewed
in 64-row blocks (its slot count must be a multiple of 64). ``top_k`` is padded with -1 to the
kernels' tile (64 for decode, 128 for the bf16 kernel).

The package is an optional extra (``pip install -e '.[flashmla]'``); it is imported only when
this peer is asked for, never on the CPU path. The argument mapping is a pure function
(``map_fp8_decode`` / ``map_bf16_sparse``) so the CPU tests check it against the reference.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from backends.kernels.kv_format import kv_dtype_of


def flashmla_build() -> str:
    """``"<distribution> <version> commit=<sha|unknown>"`` of the installed FlashMLA, or
    "none" (metadata only; the same string ``harness.env`` records on every row)."""
    import json
    from importlib import metadata
    for name in ("sgl-flash-mla", "flash-mla", "flash_mla"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        try:
            commit = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id")
        except (ValueError, AttributeError):
            commit = None
        return f"{dist.metadata['Name']} {dist.version} commit={commit or 'unknown'}"
    return "none"

BLOCK = 64           # rows per block of the fp8 cache view
DECODE_TOPK_TILE = 64
PREFILL_TOPK_TILE = 128
HEADS = (64, 128)
D_QK, D_V = 576, 512


class PeerUnsupported(ValueError):
    """The shapes are outside what the upstream kernel supports (the point is invalid for it)."""


class PeerUnavailable(RuntimeError):
    """The package is not installed or the GPU lacks the kernels (SM90 ops)."""


def _pad_topk(indices: torch.Tensor, tile: int) -> torch.Tensor:
    k = indices.shape[-1]
    kp = -(-k // tile) * tile
    if kp == k:
        return indices.contiguous()
    pad = torch.full((*indices.shape[:-1], kp - k), -1, dtype=indices.dtype, device=indices.device)
    return torch.cat([indices, pad], dim=-1).contiguous()


def padded_heads(num_heads: int) -> int:
    """Heads FlashMLA's kernels compute for ``num_heads`` query heads: the smallest of ``HEADS``
    that holds them (vLLM pads e.g. the 16 heads per GPU of TP8 to 64 on Hopper)."""
    for h in HEADS:
        if num_heads <= h:
            return h
    raise PeerUnsupported(f"FlashMLA sparse kernels take at most {HEADS[-1]} heads, got {num_heads}")


def check_supported(q: torch.Tensor, kv_cache: torch.Tensor, d_v: int) -> str:
    """Returns the kv format or raises PeerUnsupported naming what is outside the kernel's range."""
    b, h, d_qk = q.shape
    padded_heads(h)
    if d_qk != D_QK or d_v != D_V:
        raise PeerUnsupported(f"FlashMLA sparse kernels need d_qk={D_QK}, d_v={D_V}; got {d_qk}, {d_v}")
    fmt = kv_dtype_of(kv_cache)
    if fmt == "fp8_ds_mla" and kv_cache.shape[0] % BLOCK:
        raise PeerUnsupported(f"the fp8 cache is viewed in {BLOCK}-row blocks; it has {kv_cache.shape[0]} rows")
    return fmt


def map_fp8_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                   sm_scale: float) -> Dict[str, object]:
    """Keyword arguments of ``flash_mla_with_kvcache`` for the V3.2 fp8 sparse decode:
    q ``[B, 1, H, 576]``, k_cache ``[N/64, 64, 1, 656]`` uint8, indices ``[B, 1, Kp]`` int32."""
    n = kv_cache.shape[0]
    return dict(q=q.unsqueeze(1), k_cache=kv_cache.view(n // BLOCK, BLOCK, 1, kv_cache.shape[1]),
                block_table=None, cache_seqlens=None, head_dim_v=D_V, softmax_scale=float(sm_scale),
                is_fp8_kvcache=True, indices=_pad_topk(indices, DECODE_TOPK_TILE).unsqueeze(1))


def unmap_fp8_decode(out: torch.Tensor, lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """out ``[B, 1, H, 512]`` -> ``[B, H, 512]``; lse ``[B, H, 1]`` -> ``[B, H]``."""
    return out[:, 0], lse[:, :, 0]


def map_bf16_sparse(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                    sm_scale: float) -> Dict[str, object]:
    """Arguments of ``flash_mla_sparse_fwd``: q ``[B, H, 576]`` (the batch as the query axis),
    kv ``[N, 1, 576]`` bf16, indices ``[B, 1, Kp]``, sm_scale, d_v."""
    return dict(q=q.contiguous(), kv=kv_cache.unsqueeze(1),
                indices=_pad_topk(indices, PREFILL_TOPK_TILE).unsqueeze(1),
                sm_scale=float(sm_scale), d_v=D_V)


class FlashMLAAttention:
    """Callable with ``sparse_mla_decode``'s signature, running FlashMLA's SM90 kernels."""

    def __init__(self, device: torch.device):
        if torch.device(device).type != "cuda":
            raise PeerUnavailable("FlashMLA needs a CUDA GPU; the CPU path never imports it")
        major, _ = torch.cuda.get_device_capability(device)
        if major < 9:
            raise PeerUnavailable(f"FlashMLA sparse kernels need SM90 or newer; this GPU is SM{major}x")
        try:
            import flash_mla  # noqa: F401  (optional extra)
        except Exception as e:  # ImportError, or a loader error of the compiled ops
            raise PeerUnavailable(f"sgl-flash-mla is not importable ({type(e).__name__}: {e}; "
                                  f"installed build: {flashmla_build()}); install the extra: "
                                  "pip install -e '.[flashmla]'") from e
        self.fm = flash_mla
        has_legacy = getattr(flash_mla, "has_legacy", lambda: False)()
        if not has_legacy:
            raise PeerUnavailable(f"this FlashMLA build ({flashmla_build()}) has no SM90 (legacy) ops")
        self._meta: Dict[tuple, object] = {}

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                 sm_scale: float, d_v: int = 512) -> Tuple[torch.Tensor, torch.Tensor]:
        fmt = check_supported(q, kv_cache, d_v)
        h = q.shape[1]
        if padded_heads(h) != h:  # zero heads up to the kernel's count, as vLLM pads them
            qp = q.new_zeros(q.shape[0], padded_heads(h), q.shape[2])
            qp[:, :h] = q
            out, lse = self(qp, kv_cache, indices, sm_scale, d_v)
            return out[:, :h], lse[:, :h]
        if fmt == "fp8_ds_mla":
            args = map_fp8_decode(q, kv_cache, indices, sm_scale)
            key = (tuple(args["q"].shape), tuple(args["indices"].shape), kv_cache.data_ptr())
            meta = self._meta.get(key)
            if meta is None:
                meta = self._meta[key] = self.fm.get_mla_metadata()[0]
            out, lse = self.fm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, use_legacy=True, **args)
            return unmap_fp8_decode(out, lse)
        a = map_bf16_sparse(q, kv_cache, indices, sm_scale)
        out, _max_logits, lse = self.fm.flash_mla_sparse_fwd(a["q"], a["kv"], a["indices"], a["sm_scale"],
                                                             a["d_v"], use_legacy=True)
        return out, lse


_PEERS: Dict[str, Optional[FlashMLAAttention]] = {}


def flashmla_attention(device: torch.device) -> FlashMLAAttention:
    """The process-wide FlashMLA peer for ``device`` (raises PeerUnavailable)."""
    key = str(device)
    if key not in _PEERS:
        _PEERS[key] = FlashMLAAttention(device)
    return _PEERS[key]
