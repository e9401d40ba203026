"""Plain-torch references for the lightning indexer, top-k and the index transform.

These are the oracles the Triton kernels are tested and benchmarked against. They are written
for clarity (float32 math, Python loops over rows), not for speed, and share no code with the
kernels beyond the cache layout helpers of ``harness.index_cache`` and, for
``query_dtype="fp8"``, the query quantization rule ``quantize_index_query`` (the torch
specification the kernel reproduces in registers).

Indexer logit of query row ``r`` for key ``t`` (``k_t`` dequantized, float32)::

    logits[r, t] = sum_h weights[r, h] * relu(q[r, h] . k_t)

with ``q`` the bf16 query as given, or (``query_dtype="fp8"``) its fp8 quantization
``q_fp8 * scale`` (exact in float32).
"""
from __future__ import annotations

from typing import Optional

import torch

from backends.kernels.index_cache import IndexKeyCache, dequantize_fp8_keys
from backends.kernels.indexer import QUERY_DTYPES, quantize_index_query

#: max |err| / max |ref| of fp8-query logits against the fp8-query reference: on the CPU the math
#: is exact to ~1e-7, but Hopper's fp8 MMA accumulates with ~14 bits (DeepSeek-V3 report, section
#: 3.5.2; DeepGEMM and Triton's sm_90 default keep it over the 128-wide dot): a model of it gives
#: 5e-4 .. 1.5e-3 at B=64, 64 x 128 (results/h200-2026-12-03c/scripts/fp8_accumulation_sim.py;
#: measured on the H200: 1.7e-4); the bf16 query's logits differ from the fp8 query's by ~5e-2
FP8_QUERY_TOL = 5e-3


def indexer_scores_ref(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Logits of one query row against a set of keys.

    Args:
        q: ``[H, D]`` query heads (any float dtype; promoted to float32).
        weights: ``[H]`` per-head weights.
        keys: ``[T, D]`` dequantized keys.
    Returns:
        float32 ``[T]``.
    """
    s = keys.float() @ q.float().t()  # [T, H]
    return (s.clamp_min(0) * weights.float()[None, :]).sum(dim=1)


def query_ref(q: torch.Tensor, query_dtype: str = "bf16") -> torch.Tensor:
    """The query the logits are taken of, float32 ``[..., D]``: ``q`` itself (``"bf16"``) or its
    per-(row, head) fp8 quantization dequantized (``"fp8"``: ``q_fp8 * scale``, exact)."""
    if query_dtype not in QUERY_DTYPES:
        raise ValueError(f"query_dtype must be one of {', '.join(map(repr, QUERY_DTYPES))}, "
                         f"got {query_dtype!r}")
    if query_dtype == "bf16":
        return q.float()
    q_fp8, scale = quantize_index_query(q)
    return q_fp8.float() * scale[..., None]


def indexer_logits_paged_ref(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor,
                             block_table: torch.Tensor, seq_lens: torch.Tensor,
                             max_len: Optional[int] = None,
                             query_dtype: str = "bf16") -> torch.Tensor:
    """Reference of ``indexer_logits_paged``.

    Args:
        q: bf16 ``[B, H, D]``; weights: float32 ``[B, H]``;
        k_cache: uint8 fp8 pages ``[num_pages, P*(D+4)]`` or bf16 ``[num_pages, P, D]``;
        block_table: int32 ``[B, max_pages]``; seq_lens: int32 ``[B]``;
        query_dtype: ``"bf16"`` or ``"fp8"`` (``query_ref``).
    Returns:
        float32 ``[B, max_len]`` (default ``max(seq_lens)``), ``-inf`` at ``t >= seq_lens[b]``.
    """
    q = query_ref(q, query_dtype)
    cache = IndexKeyCache.wrap(k_cache, q.shape[-1])
    lens = seq_lens.tolist()
    L = max(lens, default=0) if max_len is None else max_len
    out = torch.full((q.shape[0], L), float("-inf"), dtype=torch.float32, device=q.device)
    for b, keys in enumerate(cache.gather(block_table, seq_lens)):
        if lens[b]:
            out[b, : lens[b]] = indexer_scores_ref(q[b], weights[b], keys)
    return out


def indexer_logits_ragged_ref(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor,
                              ks: torch.Tensor, ke: torch.Tensor,
                              k_scales: Optional[torch.Tensor] = None,
                              max_len: Optional[int] = None,
                              query_dtype: str = "bf16") -> torch.Tensor:
    """Reference of ``indexer_logits_ragged``.

    Args:
        q: bf16 ``[M, H, D]``; weights: float32 ``[M, H]``;
        k: ``[N, D]`` bf16 keys, or uint8/float8_e4m3fn values with ``k_scales`` float32 ``[N]``;
        ks, ke: int32 ``[M]`` key range ``[ks, ke)`` of each row;
        query_dtype: ``"bf16"`` or ``"fp8"`` (``query_ref``).
    Returns:
        float32 ``[M, max_len]`` (default ``max(ke - ks)``); column ``j`` is key ``ks[r] + j``,
        ``-inf`` at ``j >= ke[r] - ks[r]``.
    """
    q = query_ref(q, query_dtype)
    keys = k.float() if k_scales is None else dequantize_fp8_keys(k, k_scales)
    s, e = ks.tolist(), ke.tolist()
    lens = [b - a for a, b in zip(s, e)]
    L = max(lens, default=0) if max_len is None else max_len
    out = torch.full((q.shape[0], L), float("-inf"), dtype=torch.float32, device=q.device)
    for r in range(q.shape[0]):
        if lens[r] > 0:
            out[r, : lens[r]] = indexer_scores_ref(q[r], weights[r], keys[s[r]: e[r]])
    return out


def topk_ref(logits: torch.Tensor, lengths: torch.Tensor, top_k: int) -> torch.Tensor:
    """Top-k positions per row with torch.topk, ``-1`` padded (positions sorted ascending).

    Ties at the k-th value are broken towards lower positions (a stable sort by value).
    Returns int32 ``[B, top_k]``.
    """
    B = logits.shape[0]
    out = torch.full((B, top_k), -1, dtype=torch.int32, device=logits.device)
    for b, n in enumerate(lengths.tolist()):
        row = logits[b, :n]
        if n <= top_k:
            out[b, :n] = torch.arange(n, dtype=torch.int32, device=logits.device)
            continue
        order = torch.sort(row, descending=True, stable=True).indices[:top_k]
        out[b] = torch.sort(order).values.to(torch.int32)
    return out


def paged_transform_ref(pos: torch.Tensor, block_table: torch.Tensor, page_size: int,
                        row_req: Optional[torch.Tensor] = None) -> torch.Tensor:
    """PAGED transform: ``p -> block_table[req, p // P] * P + p % P``; ``-1`` stays ``-1``."""
    req = torch.arange(pos.shape[0], device=pos.device) if row_req is None else row_req.long()
    p = pos.long()
    valid = p >= 0
    pc = p.clamp_min(0)
    pages = block_table.long()[req[:, None].expand_as(pc), pc // page_size]
    return torch.where(valid, pages * page_size + pc % page_size, -1).to(torch.int32)


def ragged_transform_ref(pos: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
    """RAGGED transform: ``p -> p + row_offsets[row]``; ``-1`` stays ``-1``."""
    p = pos.long()
    return torch.where(p >= 0, p + row_offsets.long()[:, None], -1).to(torch.int32)
