"""The fused resolver of the HiSparse connector design (vLLM's HiSparse local KV offload): one
Triton kernel per layer step turns a top-k selection of request-local positions into physical
rows of ONE device pool, ``[resident pages | hot regions]``, loading what is in neither from
pinned host memory. Runs unchanged on the GPU and through the Triton interpreter (CPU tensors).

Per selected position ``p`` of batch row ``b`` (order of vLLM's ``hisparse_resolve_residency``,
``csrc/libtorch_stable/hisparse_kernels.cu``):

1. resident page: ``residency[b, p // P] >= 0`` -> row ``residency[b, p // P] * P + p % P``;
   a row whose every selected position is resident (or -1) stops here: the hot state is neither
   read nor written and nothing is copied;
2. hot row: the request's hot region (``hot_state[b] >= 0``) resolves the rest with the exact LRU
   of ``backends/hisparse_coordinator.py`` in token mode and its ``upstream`` order, which is
   also vLLM's (misses take victims in selection order, hits keep their previous LRU order;
   ``resolve_upstream_order`` / ``hot_buffer_rows`` of ``backends/kernels/swap_in.py``, with the
   resident entries masked out), newest token in the region's reserved row;
3. host row: each miss is copied by the same program from the pinned host pool (read in place
   over UVA, ``copy_row_tile``) into the victim hot row the LRU chose.

No host sync and no device scalar read-back: the grid is ``(B,)`` and every count stays on the
device, so the call can be captured in a CUDA graph.

Why one program per request: the LRU resolution of a request is one stamp pass over its
selection and one walk of its LRU order, and the copy of its misses must follow it; inside one program a barrier orders them,
across programs only a second launch could (vLLM's own code uses a second kernel,
``hisparse_gather_compact``, for the copy). The price is copy parallelism at small batch: each
program keeps ``COPY_ROWS`` rows in flight, so a batch of a few requests cannot fill the
host link with outstanding reads the way a (request, chunk) copy grid can.

Contract (checked by the backend before timing for known selections): valid positions are
unique within a row (as vLLM's resolver requires), so ``resident_hits`` counts distinct rows.
"""
from __future__ import annotations

import triton
import triton.language as tl

from backends.kernels.host_copy import copy_row_tile
from backends.kernels.swap_in import hot_buffer_rows, resolve_upstream_order

#: columns of the per-row counts (int64)
CONNECTOR_COUNT_FIELDS = ("resident_hits", "hot_hits", "misses", "tokens_loaded", "bytes_h2d")
NUM_CONNECTOR_COUNTS = len(CONNECTOR_COUNT_FIELDS)


@triton.jit
def connector_resolve_kernel(
    seq_lens_ptr, topk_ptr, topk_stride,
    residency_ptr, residency_stride,
    host_table_ptr, host_table_stride,
    hot_state_ptr, slot_pos_ptr, lru_ptr,
    host_pool_ptr, device_pool_ptr,
    out_ptr, out_stride,
    plan_ptr, plan_stride,
    counts_ptr, counts_stride,
    scratch_ptr, scratch_stride,
    K, D, HOT_BASE, HOT_STRIDE, ROW_BYTES, MAX_POSITIONS,
    PAGE: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, WORDS: tl.constexpr,
    VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr, COPY_ROWS: tl.constexpr,
):
    """One program per batch row ``b``.

    Inputs (device tensors unless noted):
      seq_lens_ptr   [B] int32          sequence length, newest token included
      topk_ptr       [B, K] int32       request-local positions, -1 padded (>= seq_len -> -1)
      residency_ptr  [B, max_pages] int32  device page of each logical page, -1 when spilled
      host_table_ptr [B, max_pages] int32  host page of each spilled logical page, -1 resident
      hot_state_ptr  [B] int32          row of the request's hot state, -1: no hot region
      slot_pos_ptr   [H, D] int32       this layer: position held by each hot slot (-1 empty)
      lru_ptr        [H, D] int32       this layer: hot slots, least recently used first
      host_pool_ptr  [host_rows, WORDS] this layer's pinned host rows (CPU memory, UVA on GPU)
      device_pool_ptr [pool_rows, WORDS] this layer's device pool (written: copied misses)
    Outputs:
      out_ptr        [B, K] int32       physical row in the device pool of each entry, -1 for -1
      plan_ptr       [H, 1 + 2*K] int32 miss plan of the hot row (count, host rows, device rows)
      counts_ptr     [B, 5] int64       CONNECTOR_COUNT_FIELDS
    Scratch: [H, D + 2*MAX_POSITIONS] int32 (``resolve_scratch_width``; positions of a row are
    below ``MAX_POSITIONS``, the stamp table's size). Hot region of state row ``h``: device rows
    ``HOT_BASE + h * HOT_STRIDE ..``: ``D`` LRU rows, then the newest token's reserved row.
    """
    b = tl.program_id(0)
    seq = tl.load(seq_lens_ptr + b)
    offs = tl.arange(0, K_PAD)
    pos = tl.load(topk_ptr + b.to(tl.int64) * topk_stride + offs, mask=offs < K, other=-1)
    valid = (pos >= 0) & (pos < seq)

    # ---- 1. resident pages ----------------------------------------------------------------
    page = tl.load(residency_ptr + b.to(tl.int64) * residency_stride + pos // PAGE, mask=valid,
                   other=-1)
    resident = valid & (page >= 0)
    resident_row = tl.where(resident, page * PAGE + pos % PAGE, -1)
    n_resident = tl.sum(resident.to(tl.int32), axis=0)
    n_other = tl.sum((valid & ~resident).to(tl.int32), axis=0)
    h = tl.load(hot_state_ptr + b)
    cnt = counts_ptr + b.to(tl.int64) * counts_stride
    out = out_ptr + b.to(tl.int64) * out_stride + offs
    tl.store(cnt + 0, n_resident.to(tl.int64))
    if (n_other > 0) & (h >= 0):
        # ---- 2. hot rows: exact LRU over the non-resident entries ---------------------------
        base = HOT_BASE + h * HOT_STRIDE
        scr = scratch_ptr + h.to(tl.int64) * scratch_stride
        plan = plan_ptr + h.to(tl.int64) * plan_stride
        unit, slot, is_newest, long_blk, is_long, n_uniq, n_hit, n_miss, newest_hit, overflow = \
            resolve_upstream_order(
                pos, valid, resident, seq, h.to(tl.int64) * D, base, slot_pos_ptr, lru_ptr,
                host_table_ptr + b.to(tl.int64) * host_table_stride, plan, scr, K, D, D, K,
                MAX_POSITIONS, UNIT=1, PAGE=PAGE, K_PAD=K_PAD, BLOCK_C=BLOCK_C)
        hot = hot_buffer_rows(pos, slot, valid, is_newest, is_long, overflow, base, D,
                              UNIT=1, PAGE=PAGE, PAGE_MODE=False)
        tl.store(out, tl.where(resident, resident_row, hot), mask=offs < K)
        # ---- 3. misses: host rows -> victim hot rows, by this program ----------------------
        for r0 in range(0, n_miss, COPY_ROWS):
            r = r0 + tl.arange(0, COPY_ROWS)
            live = r < n_miss
            src = tl.load(plan + 1 + r, mask=live, other=0).to(tl.int64)
            dst = tl.load(plan + 1 + K + r, mask=live, other=0).to(tl.int64)
            copy_row_tile(host_pool_ptr, device_pool_ptr, src, dst, live, WORDS, VEC, GROUP_BLOCK)
        hot_hits = tl.where(is_long, n_hit + newest_hit, n_uniq)
        tl.store(cnt + 1, hot_hits.to(tl.int64))
        tl.store(cnt + 2, n_miss.to(tl.int64))
        tl.store(cnt + 3, n_miss.to(tl.int64))
        tl.store(cnt + 4, n_miss.to(tl.int64) * ROW_BYTES)
    else:
        tl.store(out, resident_row, mask=offs < K)
        zero = n_resident.to(tl.int64) * 0
        tl.store(cnt + 1, zero)
        tl.store(cnt + 2, zero)
        tl.store(cnt + 3, zero)
        tl.store(cnt + 4, zero)
