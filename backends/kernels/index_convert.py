"""Triton kernel: request-local top-k token positions -> global KV slot ids.

The indexer returns, for each query token, ``K`` positions inside its own request
(``0 .. seq_len-1``, -1 = none). The attention kernel wants slot ids into the flat KV table,
``page * page_size + offset``, where the page comes from the request's block table. This is
the vLLM ``triton_convert_req_index_to_global_index`` semantics (the plain torch version is
``harness.reference.convert_req_index_to_global_index_ref``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["convert_req_index_to_global_index"]


@triton.jit
def _convert_req_index_kernel(
    req_id_ptr,            # [T] int32
    block_table_ptr,       # [R, max_blocks] int32
    token_ptr,             # [T, K] int32
    out_ptr,               # [T, K] int32 (contiguous)
    num_reqs, max_blocks, K,
    stride_bt, stride_tok,
    PAGE_SIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    in_k = cols < K
    req = tl.load(req_id_ptr + t)
    # a request id outside [0, num_reqs) gets an empty block table (every entry -> -1)
    req_ok = (req >= 0) & (req < num_reqs)
    blocks_of_req = tl.where(req_ok, max_blocks, 0)
    req = tl.where(req_ok, req, 0)
    tok = tl.load(token_ptr + t.to(tl.int64) * stride_tok + cols, mask=in_k, other=-1)
    blk = tok // PAGE_SIZE                       # only used where tok >= 0
    ok = (tok >= 0) & (blk < blocks_of_req)
    page = tl.load(block_table_ptr + req.to(tl.int64) * stride_bt + blk, mask=ok & in_k, other=-1)
    ok = ok & (page >= 0)
    slot = page * PAGE_SIZE + (tok - blk * PAGE_SIZE)
    tl.store(out_ptr + t.to(tl.int64) * K + cols, tl.where(ok, slot, -1), mask=in_k)


def _check_int32_tensor(x, name: str, ndim: int, shape_doc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {shape_doc}, got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise ValueError(f"{name} must be torch.int32 {shape_doc}, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {tuple(x.shape)}")
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit last-dim stride, got strides {tuple(x.stride())}")


def _check_runnable_device(dev: torch.device) -> None:
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"tensors are on {dev}; the Triton kernel needs a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")


def convert_req_index_to_global_index(req_id: torch.Tensor, block_table: torch.Tensor,
                                      token_indices: torch.Tensor, page_size: int, *,
                                      block_k: int = 256, num_warps: int = 4) -> torch.Tensor:
    """Converts request-local top-k positions to global KV slot ids (Triton).

    Args:
        req_id: ``[T]`` int32, row of ``block_table`` for each query token.
        block_table: ``[R, max_blocks]`` int32 page ids (unit last-dim stride; any row stride).
        token_indices: ``[T, K]`` int32 request-local token positions, -1 = none
            (unit last-dim stride).
        page_size: tokens per page ``P`` (int >= 1).
        block_k: columns per program (power of two); num_warps: warps per program.

    Returns:
        ``[T, K]`` int32 contiguous: ``block_table[req, i // P] * P + i % P``, and -1 where
        ``i < 0``, where ``i // P >= max_blocks``, where the page id is negative, or where
        ``req`` is outside ``[0, R)``.
    """
    _check_int32_tensor(req_id, "req_id", 1, "[T]")
    _check_int32_tensor(block_table, "block_table", 2, "[R, max_blocks]")
    _check_int32_tensor(token_indices, "token_indices", 2, "[T, K]")
    if token_indices.shape[0] != req_id.shape[0]:
        raise ValueError(f"token_indices must have T={req_id.shape[0]} rows (one per req_id), "
                         f"got {token_indices.shape[0]}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if not (req_id.device == block_table.device == token_indices.device):
        raise ValueError(f"req_id, block_table and token_indices must share a device, got "
                         f"{req_id.device}, {block_table.device}, {token_indices.device}")
    if not isinstance(block_k, int) or block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 16, got {block_k!r}")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps!r}")
    _check_runnable_device(token_indices.device)

    t, k = token_indices.shape
    out = torch.empty((t, k), dtype=torch.int32, device=token_indices.device)
    if t == 0 or k == 0:
        return out
    r, max_blocks = block_table.shape
    if r == 0 or max_blocks == 0:
        return out.fill_(-1)
    grid = (t, triton.cdiv(k, block_k))
    _convert_req_index_kernel[grid](
        req_id, block_table, token_indices, out,
        r, max_blocks, k,
        block_table.stride(0), token_indices.stride(0),
        PAGE_SIZE=page_size, BLOCK_K=block_k, num_warps=num_warps,
    )
    return out
