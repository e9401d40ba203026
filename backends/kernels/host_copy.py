"""Triton kernels of the zero-copy row copy: rows of a layer's pinned host pool read in place
over UVA (or any device tensor) and written to device rows, as the HiSparse swap-in and the
connector's resolver load their misses. Runs on the GPU and through the Triton interpreter.

The miss plan read by the planned-row kernels is the one ``backends/kernels/swap_in.py``
writes: int32 ``[B, 1 + 2*M]`` per batch row, ``[0]`` the number of missed units, ``[1 : 1+M]``
their first host row, ``[1+M : 1+2M]`` their first device row; a unit is ``UNIT_ROWS``
consecutive rows on both sides.

Two grids (``backends/copy_engines.py`` picks one):

* ``copy_planned_rows_kernel``: grid ``(B, cdiv(M * UNIT_ROWS, ROWS))`` fixed by the plan's
  capacity; programs past a row's miss count do nothing.
* ``copy_planned_rows_persistent_kernel``: a fixed number of programs (e.g. a multiple of the SM
  count) walking the batch's planned rows flattened (rows of batch row 0, then 1, ...) in
  ``ROWS``-row chunks, so a sparse plan (few misses, large capacity) launches no idle programs
  and one request's misses spread over every program.

Neither grid depends on the device-resident counts: no host sync, CUDA-graph capturable.
``WAIT_PRIOR`` (GPU only): the kernel was launched with ``launch_pdl`` (programmatic dependent
launch), so it may start while the kernel before it in the stream (the resolve writing the plan)
still runs; every program waits for that kernel's writes (``gdc_wait``) before it reads the plan.
``LOAD_CACHE`` / ``STORE_CACHE`` are Triton's ``cache_modifier`` strings of the host load and
device store ('' = default; loads '.ca' '.cg' '.cv', stores '.wb' '.cg' '.cs' '.wt').
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_rows_cached(src_pool_ptr, dst_pool_ptr, src, dst, live,
                     WORDS: tl.constexpr, VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr,
                     LOAD_CACHE: tl.constexpr, STORE_CACHE: tl.constexpr):
    """``copy_row_tile`` with the cache modifiers of the host load and the device store."""
    g = tl.arange(0, GROUP_BLOCK)
    v = tl.arange(0, VEC)
    word = g[None, :, None] * VEC + v[None, None, :]
    m = live[:, None, None] & (g[None, :, None] < WORDS // VEC)
    x = tl.load(src_pool_ptr + src[:, None, None] * WORDS + word, mask=m,
                cache_modifier=LOAD_CACHE)
    tl.store(dst_pool_ptr + dst[:, None, None] * WORDS + word, x, mask=m,
             cache_modifier=STORE_CACHE)


@triton.jit
def copy_row_tile(src_pool_ptr, dst_pool_ptr, src, dst, live,
                  WORDS: tl.constexpr, VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr):
    """Copies rows ``dst_pool[dst[i]] = src_pool[src[i]]`` for the ``live`` entries of the int64
    blocks ``src`` / ``dst``; both pools viewed as ``WORDS`` words a row. A row is ``WORDS / VEC``
    groups of ``VEC`` words; the tile is [rows, GROUP_BLOCK, VEC] with the mask on groups only,
    so each thread moves whole 16-byte groups (vector loads) when ``VEC * word`` is 16 bytes,
    and all rows of the tile are in flight together. ``src_pool_ptr`` may be pinned host memory
    (read in place over UVA on the GPU)."""
    copy_rows_cached(src_pool_ptr, dst_pool_ptr, src, dst, live, WORDS, VEC, GROUP_BLOCK, "", "")


@triton.jit
def copy_planned_rows_kernel(
    src_pool_ptr, dst_pool_ptr, plan_ptr, plan_stride, MAX_MISSES,
    UNIT_ROWS: tl.constexpr, WORDS: tl.constexpr, VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr,
    ROWS: tl.constexpr, LOAD_CACHE: tl.constexpr, STORE_CACHE: tl.constexpr,
    WAIT_PRIOR: tl.constexpr = False,
):
    """Copies the rows of a miss plan: ``dst_pool[dst] = src_pool[src]``, ``ROWS`` rows a program.

    Grid ``(B, cdiv(MAX_MISSES * UNIT_ROWS, ROWS))``; programs past a row's miss count do nothing.
    The count and the plan entries are loaded together (the entries up to the plan's capacity,
    not the count, bound the entry loads), so the host load waits on one device round trip.
    ``src_pool_ptr``: the layer's host rows (pinned CPU memory read in place over UVA on the GPU),
    ``dst_pool_ptr``: the layer's device rows; the row copy is ``copy_rows_cached``;
    ``WAIT_PRIOR``: module docstring.
    """
    if WAIT_PRIOR:
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    plan = plan_ptr + b.to(tl.int64) * plan_stride
    r = chunk * ROWS + tl.arange(0, ROWS)
    in_plan = r < MAX_MISSES * UNIT_ROWS
    j = r // UNIT_ROWS
    k = r % UNIT_ROWS
    n_rows = tl.load(plan) * UNIT_ROWS
    src = tl.load(plan + 1 + j, mask=in_plan, other=0).to(tl.int64) + k
    dst = tl.load(plan + 1 + MAX_MISSES + j, mask=in_plan, other=0).to(tl.int64) + k
    copy_rows_cached(src_pool_ptr, dst_pool_ptr, src, dst, r < n_rows, WORDS, VEC, GROUP_BLOCK,
                     LOAD_CACHE, STORE_CACHE)


@triton.jit
def copy_planned_rows_persistent_kernel(
    src_pool_ptr, dst_pool_ptr, plan_ptr, plan_stride, MAX_MISSES, BATCH,
    UNIT_ROWS: tl.constexpr, WORDS: tl.constexpr, VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr,
    ROWS: tl.constexpr, BATCH_BLOCK: tl.constexpr, LOAD_CACHE: tl.constexpr,
    STORE_CACHE: tl.constexpr, WAIT_PRIOR: tl.constexpr = False,
):
    """Copies the rows of a miss plan over a persistent 1-D grid of any size.

    The planned rows of batch rows ``0 .. BATCH-1`` are numbered flat (batch row 0's first);
    program ``p`` copies chunks ``p, p + P, p + 2P, ...`` of ``ROWS`` flat rows (``P`` =
    programs). A flat row ``r`` belongs to batch row ``b`` = the number of batch rows whose
    planned rows end at or before ``r``, at local row ``r`` minus their row count.
    ``BATCH_BLOCK``: a power of two >= ``BATCH``; ``WAIT_PRIOR``: module docstring.
    """
    if WAIT_PRIOR:
        tl.extra.cuda.gdc_wait()
    bs = tl.arange(0, BATCH_BLOCK)
    counts = tl.load(plan_ptr + bs.to(tl.int64) * plan_stride, mask=bs < BATCH, other=0)
    rows_of = counts * UNIT_ROWS
    ends = tl.cumsum(rows_of, axis=0)
    total = tl.sum(rows_of, axis=0)
    n_chunks = tl.cdiv(total, ROWS)
    for c in range(tl.program_id(0), n_chunks, tl.num_programs(0)):
        r = c * ROWS + tl.arange(0, ROWS)
        live = r < total
        before = ends[None, :] <= r[:, None]
        b = tl.sum(before.to(tl.int32), axis=1)
        local = r - tl.sum(tl.where(before, rows_of[None, :], 0), axis=1)
        j = local // UNIT_ROWS
        k = local % UNIT_ROWS
        plan = plan_ptr + tl.minimum(b, BATCH - 1).to(tl.int64) * plan_stride
        src = tl.load(plan + 1 + j, mask=live, other=0).to(tl.int64) + k
        dst = tl.load(plan + 1 + MAX_MISSES + j, mask=live, other=0).to(tl.int64) + k
        copy_rows_cached(src_pool_ptr, dst_pool_ptr, src, dst, live, WORDS, VEC, GROUP_BLOCK,
                         LOAD_CACHE, STORE_CACHE)


@triton.jit
def copy_indexed_rows_kernel(src_pool_ptr, dst_pool_ptr, src_rows_ptr, dst_rows_ptr, n,
                             WORDS: tl.constexpr, VEC: tl.constexpr, GROUP_BLOCK: tl.constexpr,
                             ROWS: tl.constexpr):
    """``dst_pool[dst_rows[i]] = src_pool[src_rows[i]]`` for ``i < n`` (int64 row indices),
    ``ROWS`` rows a program, grid ``cdiv(n, ROWS)``. Either pool may be page-locked host memory
    (read or written in place over UVA): the set-up's fill of a host KV pool from device rows."""
    i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = i < n
    src = tl.load(src_rows_ptr + i, mask=live, other=0)
    dst = tl.load(dst_rows_ptr + i, mask=live, other=0)
    copy_row_tile(src_pool_ptr, dst_pool_ptr, src, dst, live, WORDS, VEC, GROUP_BLOCK)


@triton.jit
def touch_pages_kernel(buf_ptr, n_pages, sums_ptr, PAGE_WORDS: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Reads the first int32 word of ``BLOCK`` consecutive pages of ``buf`` (``PAGE_WORDS``
    words apart; host memory read in place over UVA on the GPU) a program, pages past
    ``n_pages`` masked, and stores their sum at ``sums[program]`` (so no read is dropped).
    Each read makes the GPU translate one more host page: over a buffer larger than the
    translation caches reach, it evicts what they held (``harness.timing.HostTranslationFlusher``)."""
    pid = tl.program_id(0)
    page = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(buf_ptr + page * PAGE_WORDS, mask=page < n_pages, other=0)
    tl.store(sums_ptr + pid, tl.sum(v, axis=0))
