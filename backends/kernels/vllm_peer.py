"""vLLM's own index-conversion kernel as a peer of ``convert_req_index_to_global_index``, where
``vllm`` is importable (an optional extra: ``pip install -e '.[vllm]'``; never imported on the
main path).

vLLM's ``triton_convert_req_index_to_global_index(req_id, block_table, token_indices,
BLOCK_SIZE=64, NUM_TOPK_TOKENS=2048, BLOCK_N=128, ...)`` computes the same
``block_table[req, i // P] * P + i % P`` (-1 stays -1); it lives in
``vllm.v1.attention.backends.mla.sparse_utils`` in recent releases and in
``...mla.flashmla_sparse`` in older ones.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

from backends.kernels.flashmla_peer import PeerUnavailable

_MODULES = ("vllm.v1.attention.backends.mla.sparse_utils",
            "vllm.v1.attention.backends.mla.flashmla_sparse")
_NAME = "triton_convert_req_index_to_global_index"


def vllm_convert_kernel() -> Callable:
    """vLLM's conversion kernel, or PeerUnavailable saying why not."""
    errors = []
    for mod in _MODULES:
        try:
            fn = getattr(importlib.import_module(mod), _NAME, None)
        except Exception as e:  # noqa: BLE001  (absent, or an install that fails to import)
            errors.append(f"{mod}: {type(e).__name__}: {e}")
            continue
        if fn is not None:
            return fn
        errors.append(f"{mod}: no {_NAME}")
    raise PeerUnavailable("vLLM's index conversion is not importable (" + "; ".join(errors)[:300] + ")")


def vllm_convert_req_index_to_global_index(req_id: torch.Tensor, block_table: torch.Tensor,
                                           token_indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """Same signature and result as ``backends.kernels.convert_req_index_to_global_index``;
    int32 ``[T, K]`` global slots. ``K`` must suit vLLM's kernel (a multiple of its 128-column tile)."""
    fn = vllm_convert_kernel()
    return fn(req_id, block_table, token_indices, BLOCK_SIZE=page_size,
              NUM_TOPK_TOKENS=token_indices.shape[1])
