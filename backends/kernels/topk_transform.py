"""Top-k followed by the index transform (fused or not), and the indexer metadata.

The top-k kernels (``topk.py``) return *logical* positions ``p`` (``0 <= p < length`` of the
row, ``-1`` padding). Attention wants indices into the KV it reads:

``TopkTransformMethod.PAGED`` (decode)
    physical token slot of the paged KV: ``block_table[req, p // P] * P + p % P``, where ``req``
    is the row's request (the row itself unless ``row_req`` maps rows to requests).
``TopkTransformMethod.RAGGED`` (extend)
    row into a contiguous, concatenated per-request KV buffer: ``p + row_offsets[row]``
    (``row_offsets[row]`` = the start of the row's request in that buffer; rows of requests that
    share a prefix may point into the same rows).

``-1`` stays ``-1``. With ``fuse=True`` (default) the transform is the top-k select kernel's
epilogue (one kernel writes final indices); with ``fuse=False`` the top-k writes positions and a
separate transform kernel maps them. Both give the same index sets (the same order, too).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

import torch
import triton
import triton.language as tl

from backends.kernels.topk import (METHOD_NONE, METHOD_PAGED, METHOD_RAGGED, TopkPlan,
                                   _check_out, _check_plan, _check_topk_shapes,
                                   _transform_positions, launch_topk, plan_topk,
                                   validate_topk_inputs)


class TopkTransformMethod(Enum):
    """How top-k positions become KV indices (see the module docstring)."""

    PAGED = "paged"
    RAGGED = "ragged"


_METHOD_CODE = {TopkTransformMethod.PAGED: METHOD_PAGED, TopkTransformMethod.RAGGED: METHOD_RAGGED}


@triton.jit
def _transform_kernel(pos_ptr, stride_p, out_ptr, stride_o, top_k,
                      bt_ptr, stride_bt, req_ptr, page_size, off_ptr,
                      METHOD: tl.constexpr, HAS_REQ: tl.constexpr, BLOCK: tl.constexpr):
    """Unfused transform: ``out[row, i] = transform(pos[row, i])`` for one block of a row."""
    row = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = i < top_k
    pos = tl.load(pos_ptr + row.to(tl.int64) * stride_p + i, mask=m, other=-1)
    res = _transform_positions(pos, row, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ, page_size,
                               off_ptr)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + i, res, mask=m)


def _check_transform_args(method: TopkTransformMethod, rows: int, device: torch.device,
                          block_table: Optional[torch.Tensor], page_size: Optional[int],
                          row_req: Optional[torch.Tensor], row_offsets: Optional[torch.Tensor]) -> None:
    if not isinstance(method, TopkTransformMethod):
        raise ValueError(f"method must be a TopkTransformMethod, got {method!r}")
    if method is TopkTransformMethod.PAGED:
        if (not isinstance(block_table, torch.Tensor) or block_table.dim() != 2
                or block_table.dtype != torch.int32):
            raise ValueError("PAGED needs block_table: an int32 [R, max_pages] tensor")
        if block_table.device != device:
            raise ValueError(f"block_table is on {block_table.device}, expected {device}")
        if block_table.shape[1] > 1 and block_table.stride(1) != 1:
            raise ValueError("block_table must be contiguous along its last dimension")
        if (not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1
                or page_size & (page_size - 1)):
            raise ValueError(f"PAGED needs page_size: a power of two >= 1, got {page_size!r}")
        if row_req is not None:
            if row_req.dtype != torch.int32 or row_req.shape != (rows,) or row_req.device != device:
                raise ValueError(f"row_req must be an int32 [{rows}] tensor on {device}")
        elif block_table.shape[0] < rows:
            raise ValueError(f"block_table has {block_table.shape[0]} rows; without row_req it "
                             f"needs one per logits row ({rows})")
    else:
        if (not isinstance(row_offsets, torch.Tensor) or row_offsets.dtype != torch.int32
                or row_offsets.shape != (rows,) or row_offsets.device != device):
            raise ValueError(f"RAGGED needs row_offsets: an int32 [{rows}] tensor on {device}")


def validate_transform_inputs(lengths: torch.Tensor, method: TopkTransformMethod, *,
                              block_table: Optional[torch.Tensor] = None,
                              page_size: Optional[int] = None,
                              row_req: Optional[torch.Tensor] = None,
                              row_offsets: Optional[torch.Tensor] = None) -> None:
    """Data checks (device sync; outside timed regions): PAGED block tables cover every row's
    length with pages >= 0 and ``row_req`` is in range; RAGGED offsets are >= 0."""
    if method is TopkTransformMethod.PAGED:
        req = torch.arange(lengths.shape[0], device=lengths.device) if row_req is None \
            else row_req.long()
        if row_req is not None and bool(((req < 0) | (req >= block_table.shape[0])).any()):
            raise ValueError("row_req out of range of block_table")
        need = (lengths.long() + page_size - 1) // page_size
        if bool((need > block_table.shape[1]).any()):
            raise ValueError("block_table has fewer pages than some row's length needs")
        cols = torch.arange(block_table.shape[1], device=lengths.device)
        used = cols[None, :] < need[:, None]
        if bool(((block_table.long()[req] < 0) & used).any()):
            raise ValueError("block_table has negative pages inside some row's length")
    elif bool((row_offsets < 0).any()):
        raise ValueError("row_offsets must be >= 0")


def transform_topk_positions(pos: torch.Tensor, method: TopkTransformMethod, *,
                             block_table: Optional[torch.Tensor] = None,
                             page_size: Optional[int] = None,
                             row_req: Optional[torch.Tensor] = None,
                             row_offsets: Optional[torch.Tensor] = None,
                             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Standalone transform kernel (the unfused path's second step).

    Args:
        pos: int32 ``[R, top_k]`` logical positions (``-1`` = none).
        method, block_table, page_size, row_req, row_offsets: as in ``topk_transform``.
        out: optional int32 ``[R, top_k]`` output (may be ``pos`` itself).
    Returns:
        int32 ``[R, top_k]`` KV indices, ``-1`` where ``pos`` is ``-1``.
    """
    if not isinstance(pos, torch.Tensor) or pos.dim() != 2 or pos.dtype != torch.int32:
        raise ValueError("pos must be an int32 [R, top_k] tensor")
    if pos.shape[1] > 1 and pos.stride(1) != 1:
        raise ValueError("pos must be contiguous along its last dimension")
    R, K = pos.shape
    _check_transform_args(method, R, pos.device, block_table, page_size, row_req, row_offsets)
    if out is None:
        out = torch.empty_like(pos)
    elif out.shape != pos.shape or out.dtype != torch.int32 or out.device != pos.device:
        raise ValueError(f"out must be an int32 {tuple(pos.shape)} tensor on {pos.device}")
    if R == 0 or K == 0:
        return out
    BLOCK = min(1024, triton.next_power_of_2(K))
    dummy = pos
    _transform_kernel[(R, triton.cdiv(K, BLOCK))](
        pos, pos.stride(0), out, out.stride(0), K,
        block_table if block_table is not None else dummy,
        block_table.stride(0) if block_table is not None else 0,
        row_req if row_req is not None else dummy, page_size or 1,
        row_offsets if row_offsets is not None else dummy,
        METHOD=_METHOD_CODE[method], HAS_REQ=row_req is not None, BLOCK=BLOCK, num_warps=4)
    return out


def topk_transform(logits: torch.Tensor, lengths: torch.Tensor, top_k: int,
                   method: TopkTransformMethod, *, block_table: Optional[torch.Tensor] = None,
                   page_size: Optional[int] = None, row_req: Optional[torch.Tensor] = None,
                   row_offsets: Optional[torch.Tensor] = None, fuse: bool = True,
                   plan: Optional[TopkPlan] = None, out: Optional[torch.Tensor] = None,
                   check: bool = False) -> torch.Tensor:
    """Top-k of each row's logits mapped to KV indices.

    Args:
        logits: float32 ``[R, N]`` indexer logits (column = logical position in the row).
        lengths: int32 ``[R]`` valid length of each row.
        top_k: k >= 1.
        method: ``TopkTransformMethod.PAGED`` (needs ``block_table`` int32 ``[*, max_pages]``
            and ``page_size``, optional ``row_req`` int32 ``[R]`` request of each row) or
            ``TopkTransformMethod.RAGGED`` (needs ``row_offsets`` int32 ``[R]``).
        fuse: one kernel does top-k and the transform (True) or top-k then a transform kernel.
        plan: ``plan_topk(lengths, top_k)`` to reuse across layers (built here if None).
        out: optional int32 ``[R, top_k]`` output.
        check: run the data-reading validators first (device sync).
    Returns:
        int32 ``[R, top_k]``: indices of the selected keys (ascending logical position), ``-1``
        padded where a row has fewer than ``top_k`` keys.
    """
    _check_topk_shapes(logits, lengths, top_k)
    _check_transform_args(method, logits.shape[0], logits.device, block_table, page_size,
                          row_req, row_offsets)
    if check:
        validate_topk_inputs(logits, lengths, top_k)
        validate_transform_inputs(lengths, method, block_table=block_table, page_size=page_size,
                                  row_req=row_req, row_offsets=row_offsets)
    if plan is None:
        plan = plan_topk(lengths, top_k)
    _check_plan(plan, logits, lengths, top_k)
    out = _check_out(out, logits, top_k)
    if fuse:
        return launch_topk(logits, lengths, top_k, plan, out, method=_METHOD_CODE[method],
                           block_table=block_table, row_req=row_req, page_size=page_size or 1,
                           row_offsets=row_offsets)
    pos = launch_topk(logits, lengths, top_k, plan, torch.empty_like(out), method=METHOD_NONE)
    return transform_topk_positions(pos, method, block_table=block_table, page_size=page_size,
                                    row_req=row_req, row_offsets=row_offsets, out=out)


@dataclass
class IndexerMetadata:
    """Per-step metadata of the indexer's top-k: RAGGED in extend, PAGED in decode.

    Build it once per step (``for_decode`` / ``for_extend``); every layer calls ``select``.

    Attributes:
        method: the transform (PAGED in decode, RAGGED in extend).
        top_k: k.
        lengths: int32 ``[R]`` keys per logits row (decode: ``seq_lens``; extend: ``ke - ks``).
        plan: the step's ``TopkPlan`` (built from ``lengths`` once).
        block_table, page_size, row_req: PAGED inputs.
        ks, ke: RAGGED key ranges ``[ks, ke)`` of each row in the concatenated key buffer
            (the indexer's ragged inputs); ``row_offsets`` is ``ks``.
        fuse_topk: fused top-k + transform (default) or the unfused two-kernel path.
    """

    method: TopkTransformMethod
    top_k: int
    lengths: torch.Tensor
    plan: TopkPlan
    block_table: Optional[torch.Tensor] = None
    page_size: Optional[int] = None
    row_req: Optional[torch.Tensor] = None
    ks: Optional[torch.Tensor] = None
    ke: Optional[torch.Tensor] = None
    fuse_topk: bool = True

    @property
    def row_offsets(self) -> Optional[torch.Tensor]:
        return self.ks

    @classmethod
    def for_decode(cls, seq_lens: torch.Tensor, block_table: torch.Tensor, page_size: int,
                   top_k: int, *, max_len: Optional[int] = None, row_req: Optional[torch.Tensor] = None,
                   fuse_topk: bool = True) -> "IndexerMetadata":
        """PAGED metadata: one logits row per request (or per ``row_req`` entry)."""
        _check_transform_args(TopkTransformMethod.PAGED, seq_lens.shape[0], seq_lens.device,
                              block_table, page_size, row_req, None)
        plan = plan_topk(seq_lens, top_k, max_len=max_len)
        return cls(TopkTransformMethod.PAGED, top_k, seq_lens, plan, block_table=block_table,
                   page_size=page_size, row_req=row_req, fuse_topk=fuse_topk)

    @classmethod
    def for_extend(cls, ks: torch.Tensor, ke: torch.Tensor, top_k: int, *,
                   max_len: Optional[int] = None, fuse_topk: bool = True) -> "IndexerMetadata":
        """RAGGED metadata: row ``r`` attends keys ``[ks[r], ke[r])`` of the concatenated buffer."""
        if (ks.dtype != torch.int32 or ke.dtype != torch.int32 or ks.dim() != 1
                or ks.shape != ke.shape or ks.device != ke.device):
            raise ValueError("ks and ke must be int32 [M] tensors on one device")
        lengths = (ke - ks).to(torch.int32)
        plan = plan_topk(lengths, top_k, max_len=max_len)
        return cls(TopkTransformMethod.RAGGED, top_k, lengths, plan, ks=ks, ke=ke,
                   fuse_topk=fuse_topk)

    def select(self, logits: torch.Tensor, *, out: Optional[torch.Tensor] = None,
               check: bool = False) -> torch.Tensor:
        """Top-k + transform of one layer's logits ``[R, N]`` -> int32 ``[R, top_k]`` indices."""
        return topk_transform(logits, self.lengths, self.top_k, self.method,
                              block_table=self.block_table, page_size=self.page_size,
                              row_req=self.row_req, row_offsets=self.row_offsets,
                              fuse=self.fuse_topk, plan=self.plan, out=out, check=check)

    def positions(self, logits: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logical top-k positions only (no transform; e.g. for a HiSparse-style swap-in)."""
        _check_topk_shapes(logits, self.lengths, self.top_k)
        _check_plan(self.plan, logits, self.lengths, self.top_k)
        return launch_topk(logits, self.lengths, self.top_k, self.plan,
                           _check_out(out, logits, self.top_k))
