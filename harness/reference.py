"""Plain-torch references for the sparse-attention kernels.

The harness checks every kernel output against these on every run; they are written for
clarity, not speed, and make no use of Triton. Inputs are widened to float32 (fp8 rows are
dequantized to float32); the attention products and sums run in float64 so that the result
does not depend on TF32 settings, and results are returned as float32.
"""
from __future__ import annotations

import math

import torch

from backends.kernels.kv_format import kv_cache_to_float, kv_dtype_of, row_bytes


def convert_req_index_to_global_index_ref(req_id: torch.Tensor, block_table: torch.Tensor,
                                          token_indices: torch.Tensor, page_size: int
                                          ) -> torch.Tensor:
    """Request-local top-k positions -> global KV slot ids.

    Args:
        req_id: ``[T]`` int32, the request (row of ``block_table``) of each query token.
        block_table: ``[R, max_blocks]`` int32 page ids of each request.
        token_indices: ``[T, K]`` int32 request-local token positions, -1 = none.
        page_size: tokens per page ``P``.

    Returns:
        ``[T, K]`` int32: ``block_table[req, i // P] * P + i % P``; -1 where ``i < 0``,
        where ``i // P >= max_blocks``, where the page id is negative, or where the request
        id is outside ``[0, R)``.
    """
    if req_id.dim() != 1 or token_indices.dim() != 2 or block_table.dim() != 2:
        raise ValueError("req_id must be [T], block_table [R, max_blocks], token_indices [T, K]")
    if token_indices.shape[0] != req_id.shape[0]:
        raise ValueError(f"token_indices has {token_indices.shape[0]} rows, req_id {req_id.shape[0]}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    r, max_blocks = block_table.shape
    tok = token_indices.long()
    req = req_id.long()
    req_ok = (req >= 0) & (req < r)
    blk = torch.div(tok, page_size, rounding_mode="floor")
    ok = (tok >= 0) & (blk < max_blocks) & req_ok[:, None]
    rows = block_table.long()[req.clamp(0, max(r - 1, 0))]             # [T, max_blocks]
    page = torch.gather(rows, 1, blk.clamp(0, max(max_blocks - 1, 0)))  # [T, K]
    ok &= page >= 0
    out = page * page_size + tok % page_size
    return torch.where(ok, out, torch.full_like(out, -1)).to(torch.int32)


def sparse_mla_decode_ref(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                          sm_scale: float, d_v: int = 512, chunk: int = 16
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MQA decode over gathered KV rows (float32 inputs, float64 products and sums).

    Args:
        q: ``[B, H, d_qk]`` (any float dtype; widened to float32).
        kv_cache: ``[num_slots, d_qk]`` bfloat16 rows, or ``[num_slots, row_bytes]`` uint8
            ``fp8_ds_mla`` rows with ``d_nope = d_v``, ``d_rope = d_qk - d_v`` (dequantized
            first).
        indices: ``[B, K]`` integer global slot ids; an index outside ``[0, num_slots)``
            (e.g. -1) is masked; duplicates count as many times as they appear.
        sm_scale: softmax scale applied to ``q . k``.
        d_v: V width: V is the first ``d_v`` dims of each KV row.
        chunk: batch rows processed at a time (bounds the gathered float32 memory).

    Returns:
        ``out [B, H, d_v]`` float32 = ``softmax(sm_scale * q k^T) V`` over valid indices, and
        ``lse [B, H]`` float32 = ``log(sum exp(sm_scale * q . k))`` (natural log). Rows with
        no valid index give ``out = 0`` and ``lse = +inf``.
    """
    if q.dim() != 3 or indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError("q must be [B, H, d_qk] and indices [B, K] with the same B")
    b, h, d_qk = q.shape
    if not 0 < d_v <= d_qk:
        raise ValueError(f"d_v must be in [1, d_qk={d_qk}], got {d_v}")
    if kv_dtype_of(kv_cache) == "fp8_ds_mla" and kv_cache.shape[1] != row_bytes("fp8_ds_mla", d_v, d_qk - d_v):
        raise ValueError("kv_cache row size does not match fp8_ds_mla with d_nope=d_v")
    kv = kv_cache_to_float(kv_cache, d_qk, d_v)                       # [N, d_qk] fp32
    n = kv.shape[0]
    out = torch.empty((b, h, d_v), dtype=torch.float32, device=q.device)
    lse = torch.empty((b, h), dtype=torch.float32, device=q.device)
    for s in range(0, b, chunk):
        e = min(b, s + chunk)
        idx = indices[s:e].long()
        valid = (idx >= 0) & (idx < n)                                # [b, K]
        k = kv[torch.where(valid, idx, torch.zeros_like(idx))].double()  # [b, K, d_qk]
        scores = torch.einsum("bhd,bkd->bhk", q[s:e].float().double(), k) * sm_scale
        scores = scores.masked_fill(~valid[:, None, :], -math.inf)
        l = torch.logsumexp(scores, dim=-1)                           # [b, H]
        has = valid.any(dim=-1)[:, None].expand_as(l)
        p = torch.exp(scores - torch.where(has, l, torch.zeros_like(l))[..., None])
        p = torch.where(has[..., None], p, torch.zeros_like(p))
        out[s:e] = torch.einsum("bhk,bkd->bhd", p, k[..., :d_v]).float()
        lse[s:e] = torch.where(has, l, torch.full_like(l, math.inf)).float()
    return out, lse


def sparse_mla_decode_on_slots_ref(q: torch.Tensor, kv_rows: torch.Tensor, slots: torch.Tensor,
                                   sm_scale: float, d_v: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """``sparse_mla_decode_ref`` over a large pool, gathering only the selected rows first.

    ``kv_rows`` flat ``[num_slots, row]`` (either format), ``slots`` int ``[B, K]`` (-1 = none).
    The check then costs O(B * K) rows, not O(pool)."""
    s = slots.long()
    valid = s >= 0
    rows = kv_rows[s.clamp_min(0).view(-1)]
    b, k = s.shape
    compact = torch.arange(b * k, device=s.device, dtype=torch.int32).view(b, k)
    compact = torch.where(valid, compact, torch.full_like(compact, -1))
    return sparse_mla_decode_ref(q, rows, compact, sm_scale, d_v=d_v)
