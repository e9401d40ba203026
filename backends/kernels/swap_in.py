"""Triton kernels of the HiSparse swap-in: the per-request resolve (hit detection, exact LRU,
miss -> slot assignment, output slot table). The zero-copy row copy from pinned host memory is
``backends/kernels/host_copy.py``.

The kernels run unchanged on the GPU and through the Triton interpreter (CPU tensors).

Vocabulary (see ``backends/hisparse_coordinator.py`` for the full semantics):

* *unit*: what the LRU manages. ``UNIT == 1``: one token row; ``UNIT == page_size``: one logical
  page of ``page_size`` consecutive positions (``load_granularity='page'``).
* *hot slot*: index ``0 .. C-1`` of a request's hot buffer in units (``C = D / UNIT``); hot unit
  slot ``s`` covers device rows ``base + s*UNIT .. base + s*UNIT + UNIT - 1`` where
  ``base = req * SLOTS_PER_REQ``. Device rows ``base + D .. base + D + page_size - 1`` are the
  reserved page of the newest token.
* *miss plan*: int32 ``[max_batch, 1 + 2*M]`` per batch row: ``[0]`` number of missed units,
  ``[1 : 1+M]`` their first host row, ``[1+M : 1+2M]`` their first device row. Missed unit ``j``
  copies ``UNIT`` rows: host ``src[j] + r`` -> device ``dst[j] + r`` for ``r < UNIT``.

Two LRU orders (``UPSTREAM`` constexpr), two resolves:

* ``upstream`` (SGLang's kernel): misses in selection order (a unit's first entry), hits in the
  order the LRU walk meets them. O(K + C), no sort: a per-batch-row table indexed by unit gets
  two stamps in one scatter, each entry ``i`` its index (``entry[u_i] = i``, then ``atomic_min``
  only when some unit is selected twice, so ``entry[u]`` is the unit's first entry) and each hot
  slot ``s`` holding unit ``u_s`` its index (``slot[u_s] = s``). A hot slot is a hit iff its
  unit's ``entry`` names an entry of that unit; an entry is a hit iff its unit's ``slot`` names
  a slot holding that unit. The hot buffer's rows (LRU order, slot -> unit) and the selection's
  units are held in registers, so both checks are ``tl.gather``s, and they make stale stamps
  (earlier calls, other layers or requests) harmless: the table is never cleared. Every walked
  slot's new LRU place follows from two cumsums (hits and evictable slots in walk order); only
  when a unit misses are the evictable slots compacted through memory, for the misses (entry
  order) to take them.
* ``position``: misses and hits in ascending unit. A bitonic sort of the selection, then a
  binary search per hot slot.

Scratch per batch row (int32, ``resolve_scratch_width``): upstream ``[C]`` evictable slots,
``[N_UNITS, 2]`` stamps (first entry, holding slot); position ``[K_PAD]`` sorted keys, ``[K_PAD]`` unique units,
``[K_PAD]`` slot per unique unit, ``[C]`` evictable slots.

Scattered stores (``PTX_SCATTER``, upstream order): Triton gives a store whose addresses are not
contiguous a one-element-per-thread layout and converts the pointers, values and masks into it
through shared memory (one barrier-separated round each), while the resolve computes in
four-element vectors (its loads are vectorised); ``scatter_store`` issues each element's
``st.global`` by inline PTX in the layout the values already have. ``ResolveLaunch.ptx_scatter``
(``PTX_SCATTER_MODES``) says which stores: ``misses`` (the default on CUDA: the stores only a
call with misses makes: evictable list, slot map, plan), ``all`` (also the stamps and the new
LRU order, which every call makes) or ``none``. Measured on the H200 (2026-12-03, B64 / B1,
top_k 2048, 4096 hot slots): PTX on every store makes an all-miss call 3.8 us faster and the
85 % overlap steady state 5.4 us, but an all-hit call at B64 1.1 us slower (the resolve alone
18.6 against 17.2 us; at B1 15.2 against 16.0). The Triton interpreter runs no PTX and takes
``tl.store``.

Programmatic dependent launch (``LAUNCH_DEPENDENTS``): the resolve lets the next kernel in the
stream (the copy, launched with ``launch_pdl``, which waits for the resolve's writes with
``gdc_wait`` before it reads the plan) start its launch while the resolve runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import triton
import triton.language as tl

# Sorts after every real position; marks "not part of the LRU selection".
SENTINEL = tl.constexpr(2147483647)

#: largest selection the resolve takes (its counts of entries share one int64 in 21-bit fields)
MAX_TOP_K = 1 << 20

# Columns of the per-row counts tensor (int64).
COUNT_FIELDS = ("hits", "misses", "tokens_loaded", "pages_loaded", "bytes_h2d", "overflow",
                "pages_needed")
CF_HITS, CF_MISSES, CF_TOKENS, CF_PAGES, CF_BYTES, CF_OVERFLOW, CF_PAGES_NEEDED = range(7)
NUM_COUNT_FIELDS = len(COUNT_FIELDS)


@triton.jit
def _bitonic_step(x, N: tl.constexpr, STAGE: tl.constexpr, DIST_LOG: tl.constexpr):
    """One compare-exchange round of a bitonic sort of the int ``[N]`` block ``x``.

    Elements ``2**DIST_LOG`` apart are ordered; a pair goes descending when bit ``STAGE`` of its
    lower index is set (so merge stage ``STAGE`` leaves sorted runs of ``2**STAGE`` alternating
    in direction, and the last stage, ``STAGE == log2(N)``, sorts everything ascending).
    """
    A: tl.constexpr = N >> (DIST_LOG + 1)
    B: tl.constexpr = 1 << DIST_LOG
    y = tl.reshape(x, [A, 2, B])
    lo = tl.min(y, axis=1)
    hi = tl.max(y, axis=1)
    lower_idx = tl.arange(0, A)[:, None] * (2 * B) + tl.arange(0, B)[None, :]
    desc = ((lower_idx >> STAGE) & 1) == 1
    first = tl.where(desc, hi, lo)
    second = tl.where(desc, lo, hi)
    side = tl.arange(0, 2)[None, :, None]
    return tl.reshape(tl.where(side == 0, first[:, None, :], second[:, None, :]), [N])


@triton.jit
def sort_ascending(x, N: tl.constexpr, LOG_N: tl.constexpr):
    """Ascending bitonic sort of an int ``[N]`` block (``N == 2**LOG_N``), built from min/max
    reductions (fast in the interpreter, unlike ``tl.sort``'s xor-reduction there)."""
    for stage in tl.static_range(1, LOG_N + 1):
        for j in tl.static_range(stage):
            x = _bitonic_step(x, N, stage, stage - 1 - j)
    return x


@triton.jit
def _lower_bound(table_ptr, n, key, STEPS: tl.constexpr):
    """Index of the first element >= ``key`` in the ascending ``table[0:n]`` (elementwise)."""
    lo = key * 0
    hi = lo + n
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) >> 1
        v = tl.load(table_ptr + mid, mask=active, other=0)
        right = active & (v < key)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & (v >= key), mid, hi)
    return lo


@triton.jit
def _selection_units(pos, valid, skip, seq, D, UNIT: tl.constexpr):
    """Per entry of a selection: its unit (-1 when not ``valid``); whether the request is long
    (``seq > D``: a scalar and, for block expressions, a block); whether the entry is the newest
    unit of a long request (served from the reserved page, outside the LRU)."""
    unit = tl.where(valid, pos // UNIT, -1)
    # (block & scalar-bool is avoided: the Triton interpreter mistypes it)
    is_long = seq > D
    long_blk = (pos * 0 + seq) > D
    newest_unit = tl.where(is_long, (seq - 1) // UNIT, -2)
    is_newest = valid & ~skip & (unit == newest_unit)
    return unit, is_long, long_blk, is_newest


@triton.jit
def resolve_position_order(
    pos, valid, skip, seq, row, base,
    slot_unit_ptr, lru_ptr, host_page_row_ptr, plan, scr,
    K, C, D, MAX_MISSES,
    UNIT: tl.constexpr, PAGE: tl.constexpr,
    K_PAD: tl.constexpr, LOG_K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """``resolve_hot_selection`` in the ``position`` order (sort and binary search; same
    arguments and results)."""
    s_sorted = scr
    s_uniq = scr + K_PAD
    s_uslot = scr + 2 * K_PAD
    s_evict = scr + 3 * K_PAD

    # ---- 1. selection -> sorted unique units (the newest unit of a long request is excluded) --
    offs = tl.arange(0, K_PAD)
    unit, is_long, long_blk, is_newest = _selection_units(pos, valid, skip, seq, D, UNIT)
    key = tl.where(valid & ~skip & ~is_newest, unit, SENTINEL)
    srt = sort_ascending(key, K_PAD, LOG_K_PAD)
    tl.store(s_sorted + offs, srt)
    tl.store(s_uslot + offs, tl.full([K_PAD], -1, tl.int32))
    tl.debug_barrier()
    prev = tl.load(s_sorted + offs - 1, mask=offs > 0, other=-1)
    first = (srt != SENTINEL) & (srt != prev)
    first_i = first.to(tl.int32)
    n_uniq = tl.sum(first_i, axis=0)
    tl.store(s_uniq + tl.cumsum(first_i, axis=0) - 1, srt, mask=first)
    newest_hit = (tl.sum(is_newest.to(tl.int32), axis=0) > 0).to(tl.int32)
    overflow = is_long & (n_uniq > C)
    # no unit to resolve: hits, misses and the LRU order are unchanged, so the LRU is not touched
    do_long = is_long & (n_uniq <= C) & (n_uniq > 0)
    tl.debug_barrier()

    # ---- 2. walk the hot buffer in LRU order: hits and evictable slots ------------------------
    lane_c = tl.arange(0, BLOCK_C)
    n_hit = n_uniq * 0
    n_evict = n_uniq * 0
    c_end = tl.where(do_long, C, 0)
    for c0 in range(0, c_end, BLOCK_C):
        oc = c0 + lane_c
        mc = oc < C
        slot = tl.load(lru_ptr + row + oc, mask=mc, other=0)
        u = tl.load(slot_unit_ptr + row + slot, mask=mc, other=-1)
        idx = _lower_bound(s_uniq, n_uniq, u, SEARCH_STEPS)
        cand = tl.load(s_uniq + idx, mask=mc & (idx < n_uniq), other=SENTINEL)
        hit = mc & (u >= 0) & (cand == u)
        tl.store(s_uslot + idx, slot, mask=hit)
        ev = mc & ~hit
        ev_i = ev.to(tl.int32)
        tl.store(s_evict + n_evict + tl.cumsum(ev_i, axis=0) - 1, slot, mask=ev)
        n_evict += tl.sum(ev_i, axis=0)
        n_hit += tl.sum(hit.to(tl.int32), axis=0)
    tl.debug_barrier()

    # ---- 3. misses take the least recent evictables; new LRU order; miss plan -----------------
    n_miss = tl.where(do_long, n_uniq - n_hit, 0)
    n_live = tl.where(do_long, n_uniq, 0)
    mu = offs < n_live
    uslot = tl.load(s_uslot + offs, mask=mu, other=-1)
    uu = tl.load(s_uniq + offs, mask=mu, other=0)
    is_hit = mu & (uslot >= 0)
    is_miss = mu & (uslot < 0)
    hit_rank = tl.cumsum(is_hit.to(tl.int32), axis=0) - 1
    miss_rank = tl.cumsum(is_miss.to(tl.int32), axis=0) - 1
    miss_slot = tl.load(s_evict + miss_rank, mask=is_miss, other=0)
    tl.store(s_uslot + offs, tl.where(is_hit, uslot, miss_slot), mask=mu)

    tl.store(slot_unit_ptr + row + miss_slot, uu, mask=is_miss)
    n_kept = n_evict - n_miss
    tl.store(lru_ptr + row + n_kept + miss_rank, miss_slot, mask=is_miss)
    tl.store(lru_ptr + row + (C - n_hit) + hit_rank, uslot, mask=is_hit)
    for c0 in range(0, c_end, BLOCK_C):
        r = c0 + lane_c
        m = (r >= n_miss) & (r < n_evict)
        s = tl.load(s_evict + r, mask=m, other=0)
        tl.store(lru_ptr + row + r - n_miss, s, mask=m)

    first_pos = uu * UNIT
    host_page = tl.load(host_page_row_ptr + first_pos // PAGE, mask=is_miss, other=0)
    tl.store(plan + 1 + miss_rank, host_page * PAGE + first_pos % PAGE, mask=is_miss)
    tl.store(plan + 1 + MAX_MISSES + miss_rank, base + miss_slot * UNIT, mask=is_miss)
    tl.store(plan, n_miss)
    tl.debug_barrier()

    # ---- 4. each entry's index into the slot table (-1: not resolved here) --------------------
    e_idx = _lower_bound(s_uniq, n_uniq, key, SEARCH_STEPS)
    ref = (key != SENTINEL) & (e_idx < n_live)
    slot = tl.load(s_uslot + e_idx, mask=ref, other=-1)
    return unit, slot, is_newest, long_blk, is_long, n_uniq, n_hit, n_miss, newest_hit, overflow


@triton.jit
def scatter_store(ptr, value, mask, PTX: tl.constexpr):
    """``tl.store(ptr, value, mask=mask)`` of an int32 block at scattered addresses; with
    ``PTX`` one predicated ``st.global.b32`` per element by inline PTX, in the block's own
    layout (module docstring; GPU only)."""
    if PTX:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }",
            "=r,l,r,r", [ptr, value.to(tl.int32), mask.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def _add_pair(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def resolve_upstream_order(
    pos, valid, skip, seq, row, base,
    slot_unit_ptr, lru_ptr, host_page_row_ptr, plan, scr,
    K, C, D, MAX_MISSES, N_UNITS,
    UNIT: tl.constexpr, PAGE: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    PTX_SCATTER: tl.constexpr = 0,
):
    """``resolve_hot_selection`` in the ``upstream`` order (two-way stamps, no sort; same
    arguments and results; ``PTX_SCATTER``: which scattered stores go by inline PTX,
    ``scatter_store``: 0 none, 1 the miss path's, 2 all).
    The hot buffer's ``[C]`` rows (LRU order and slot -> unit) are held in registers (``BLOCK_C >= C``) and joined with the selection by ``tl.gather``, so an
    all-hit call reads global memory twice in a chain: its inputs, then the stamp table."""
    s_evict = scr                      # [C] evictable slots by rank (only when a unit missed)
    s_tab = scr + C                    # [N_UNITS, 2]: (first entry, holding slot) per unit

    # ---- 1. inputs: the selection's units, the hot buffer in walk and in slot order ---------
    offs = tl.arange(0, K_PAD)
    unit, is_long, long_blk, is_newest = _selection_units(pos, valid, skip, seq, D, UNIT)
    # units past the stamp table (seq_len beyond the coordinator's maximum) take no part
    live = valid & ~skip & ~is_newest & (unit < N_UNITS)
    key = tl.where(live, unit, -1)
    lane = tl.arange(0, BLOCK_C)
    mc = lane < C
    walk_slot = tl.load(lru_ptr + row + lane, mask=mc, other=0)
    slot_u = tl.load(slot_unit_ptr + row + lane, mask=mc, other=-1)      # slot order
    walk_u = tl.where(mc, tl.gather(slot_u, tl.minimum(tl.maximum(walk_slot, 0), BLOCK_C - 1),
                                    0), -1)
    held_s = mc & (slot_u >= 0) & (slot_u < N_UNITS)
    held_w = mc & (walk_u >= 0) & (walk_u < N_UNITS)

    # ---- 2. stamps both ways: unit -> its first entry, unit -> the slot holding it ---------
    # Stale values (earlier calls, other layers or requests) are recognised below (the entry's
    # unit, the slot's unit), so the table is never cleared.
    scatter_store(s_tab + 2 * unit, offs, live, PTX_SCATTER >= 2)
    scatter_store(s_tab + 2 * slot_u + 1, lane, held_s, PTX_SCATTER >= 2)
    tl.debug_barrier()
    rep = tl.load(s_tab + 2 * unit, mask=live, other=-1, cache_modifier=".cg")
    cand = tl.load(s_tab + 2 * unit + 1, mask=live, other=-1, cache_modifier=".cg")
    e = tl.load(s_tab + 2 * walk_u, mask=held_w, other=-1, cache_modifier=".cg")
    # an entry's unit is held when its slot stamp names a slot holding that unit
    held_e = live & (cand >= 0) & (cand < C) & \
        (tl.gather(slot_u, tl.minimum(tl.maximum(cand, 0), BLOCK_C - 1), 0) == unit)
    # one reduction for four counts: first entries, held first entries and entries whose plain
    # stamp store lost a race (a unit selected twice) in 21-bit fields of one int64 (K_PAD <=
    # 2^20), and the newest entries
    first = live & (rep == offs)
    lost = live & (rep != offs)
    stats, n_newest = tl.reduce((first.to(tl.int64) + ((first & held_e).to(tl.int64) << 21)
                                 + (lost.to(tl.int64) << 42), is_newest.to(tl.int32)),
                                0, _add_pair)
    n_uniq = (stats & 0x1FFFFF).to(tl.int32)
    n_held = ((stats >> 21) & 0x1FFFFF).to(tl.int32)
    n_lost = (stats >> 42).to(tl.int32)
    newest_hit = (n_newest > 0).to(tl.int32)
    if n_lost > 0:                      # duplicates: each unit's stamp is its first entry
        tl.atomic_min(s_tab + 2 * unit, offs, mask=lost, sem="relaxed")
        tl.debug_barrier()
        rep = tl.load(s_tab + 2 * unit, mask=live, other=-1, cache_modifier=".cg")
        e = tl.load(s_tab + 2 * walk_u, mask=held_w, other=-1, cache_modifier=".cg")
        first = live & (rep == offs)
        n_uniq = tl.sum(first.to(tl.int32), axis=0)
        n_held = tl.sum((first & held_e).to(tl.int32), axis=0)
    overflow = is_long & (n_uniq > C)
    do_long = is_long & (n_uniq <= C) & (n_uniq > 0)
    do_k = (offs * 0 + do_long.to(tl.int32)) != 0                 # (no block & scalar-bool)
    do_c = (lane * 0 + do_long.to(tl.int32)) != 0
    resolved = first & do_k

    # ---- 3. hits: a slot whose unit's first entry has that unit; the rest are evictable ------
    hit_w = held_w & (e >= 0) & (e < K_PAD) & \
        (tl.gather(key, tl.minimum(tl.maximum(e, 0), K_PAD - 1), 0) == walk_u)
    hit_cum = tl.cumsum(hit_w.to(tl.int32), axis=0)       # hits up to and including the lane
    ev = mc & ~hit_w
    ev_rank = lane - hit_cum                               # of an evictable lane
    # every held first entry is a hit and every hit slot holds one (a unit is in one slot)
    n_hit = tl.where(do_long, n_held, 0)
    n_miss = tl.where(do_long, n_uniq - n_held, 0)
    n_evict = tl.where(do_long, C - n_hit, 0)

    # ---- 4. the i-th miss (entry order) takes the i-th evictable (walk order); miss plan -----
    is_miss = resolved & ~held_e
    miss_slot = offs * 0
    if n_miss > 0:
        miss_rank = tl.cumsum(is_miss.to(tl.int32), axis=0) - 1
        scatter_store(s_evict + ev_rank, walk_slot, ev & (ev_rank < n_miss), PTX_SCATTER >= 1)
        tl.debug_barrier()
        miss_slot = tl.load(s_evict + miss_rank, mask=is_miss, other=0, cache_modifier=".cg")
        scatter_store(slot_unit_ptr + row + miss_slot, unit, is_miss, PTX_SCATTER >= 1)
        first_pos = unit * UNIT
        host_page = tl.load(host_page_row_ptr + first_pos // PAGE, mask=is_miss, other=0)
        scatter_store(plan + 1 + miss_rank, host_page * PAGE + first_pos % PAGE, is_miss,
                      PTX_SCATTER >= 1)
        scatter_store(plan + 1 + MAX_MISSES + miss_rank, base + miss_slot * UNIT, is_miss,
                      PTX_SCATTER >= 1)
    tl.store(plan, n_miss)

    # ---- 5. new LRU: stale evictables, the misses' slots, the hits (walk order) -------------
    # each walked slot's new place, written in one scatter (the same order again when nothing
    # missed and the hits already close it)
    n_kept = n_evict - n_miss
    new_at = tl.where(hit_w, n_evict + hit_cum - 1,
                      tl.where(ev_rank < n_miss, n_kept + ev_rank, ev_rank - n_miss))
    scatter_store(lru_ptr + row + new_at, walk_slot, do_c & mc, PTX_SCATTER >= 2)

    # ---- 6. each entry's hot slot (-1: not resolved here): its unit's first entry's --------
    first_slot = tl.where(resolved & held_e, cand, tl.where(is_miss, miss_slot, -1))
    slot = tl.where(live & do_k, first_slot, -1)
    if n_lost > 0:
        slot = tl.where(live & do_k,
                        tl.gather(first_slot, tl.minimum(tl.maximum(rep, 0), K_PAD - 1), 0), -1)
    return unit, slot, is_newest, long_blk, is_long, n_uniq, n_hit, n_miss, newest_hit, overflow


@triton.jit
def resolve_hot_selection(
    pos, valid, skip, seq, row, base,
    slot_unit_ptr, lru_ptr, host_page_row_ptr, plan, scr,
    K, C, D, MAX_MISSES, N_UNITS,
    UNIT: tl.constexpr, PAGE: tl.constexpr,
    K_PAD: tl.constexpr, LOG_K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, UPSTREAM: tl.constexpr, PTX_SCATTER: tl.constexpr = 0,
):
    """Hit detection, exact LRU update and miss -> slot assignment of one batch row's selection
    against its hot buffer (steps 1-3 of the swap-in; the semantics of
    ``backends/hisparse_coordinator.py``), in the ``upstream`` order (``UPSTREAM``) or the
    ``position`` order (module docstring).

    Blocks ``[K_PAD]``: ``pos`` int32 positions (-1 past ``K``), ``valid`` (position in
    ``[0, seq)``), ``skip`` (valid entries served elsewhere, e.g. from a resident page: they take
    no part in the LRU, and are not the newest unit). Scalars: ``seq`` the sequence length,
    ``row`` int64 offset of the request's ``[C]`` row in ``slot_unit`` / ``lru``, ``base`` its
    first device row, ``N_UNITS`` the units the stamp table holds (upstream; positions below
    ``N_UNITS * UNIT``). ``host_page_row_ptr``: the request's row of the host page table (logical
    page -> host page); ``plan``: its miss-plan row (written: count, host rows, device rows);
    ``scr``: its scratch row (``resolve_scratch_width``). The LRU is neither read nor written
    when no unit needs it. ``PTX_SCATTER``: which of the upstream order's scattered stores go by
    inline PTX (``PTX_SCATTER_MODES``' values; GPU only).

    Returns ``(unit, slot, is_newest, long_blk, is_long, n_uniq, n_hit, n_miss, newest_hit,
    overflow)``: per entry its unit, its hot slot (-1: not resolved here) and whether it is the
    newest unit (in the reserved page); ``long_blk`` /
    ``is_long`` the request is long (``seq > D``) as a block / scalar; counts of unique
    non-newest units, hits and misses among them (0 on overflow or short), whether the newest
    unit was selected, and the page-mode overflow flag.
    """
    if UPSTREAM:
        res = resolve_upstream_order(pos, valid, skip, seq, row, base, slot_unit_ptr, lru_ptr,
                                host_page_row_ptr, plan, scr, K, C, D, MAX_MISSES, N_UNITS,
                                UNIT=UNIT, PAGE=PAGE, K_PAD=K_PAD, BLOCK_C=BLOCK_C,
                                PTX_SCATTER=PTX_SCATTER)
    else:
        res = resolve_position_order(pos, valid, skip, seq, row, base, slot_unit_ptr, lru_ptr,
                                host_page_row_ptr, plan, scr, K, C, D, MAX_MISSES,
                                UNIT=UNIT, PAGE=PAGE, K_PAD=K_PAD, LOG_K_PAD=LOG_K_PAD,
                                BLOCK_C=BLOCK_C, SEARCH_STEPS=SEARCH_STEPS)
    return res


@triton.jit
def hot_buffer_rows(
    pos, slot, valid, is_newest, is_long, overflow, base, D,
    UNIT: tl.constexpr, PAGE: tl.constexpr, PAGE_MODE: tl.constexpr,
):
    """Step 4 of the swap-in: the device row of each entry after ``resolve_hot_selection``
    (its ``slot``, ``is_newest``, ``is_long``, ``overflow``): a long request's units through
    their hot slot, its newest unit in the reserved page, a short request's position ``p`` at
    ``base + p``; -1 for invalid entries and on overflow. Entries the resolve skipped get a
    meaningless value (the caller serves them)."""
    long_out = base + tl.maximum(slot, 0) * UNIT + pos % UNIT
    if PAGE_MODE:
        newest_out = base + D + pos % PAGE
    else:
        newest_out = base + D + pos * 0
    res = tl.where(is_newest, newest_out, long_out)
    res = tl.where(overflow, -1, res)
    res = tl.where(is_long, res, base + pos)
    return tl.where(valid, res, -1)


@triton.jit
def resolve_swap_in_kernel(
    req_idx_ptr, seq_lens_ptr, topk_ptr, topk_stride,
    slot_unit_ptr, lru_ptr,
    host_table_ptr, host_table_stride,
    out_ptr, out_stride,
    plan_ptr, plan_stride,
    counts_ptr, counts_stride,
    scratch_ptr, scratch_stride,
    K, C, D, SLOTS_PER_REQ, ROW_BYTES, MAX_MISSES, N_UNITS,
    UNIT: tl.constexpr, PAGE: tl.constexpr, PAGE_MODE: tl.constexpr,
    K_PAD: tl.constexpr, LOG_K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, UPSTREAM: tl.constexpr, PTX_SCATTER: tl.constexpr = 0,
    LAUNCH_DEPENDENTS: tl.constexpr = False,
):
    """One program per batch row: resolves a top-k selection against the hot buffer.

    ``PTX_SCATTER``: which scattered stores go by inline PTX (``PTX_SCATTER_MODES``' values,
    ``scatter_store``); ``LAUNCH_DEPENDENTS``:
    each program lets the next kernel of the stream launch first thing (programmatic dependent
    launch: the copy, launched with ``launch_pdl``, waits for this grid's writes before it reads
    the plan). Both GPU only (the interpreter runs neither).

    Inputs (device tensors):
      req_idx_ptr   [B] int32/int64   request pool index of each batch row
      seq_lens_ptr  [B] int32/int64   sequence length including the newest token
      topk_ptr      [B, K] int32      request-local positions, -1 padded (>= seq_len treated as -1)
      slot_unit_ptr [max_reqs, C] int32  unit held by each hot slot (-1 empty), this layer
      lru_ptr       [max_reqs, C] int32  permutation of hot slots, least recent first, this layer
      host_table_ptr [max_reqs, max_pages] int32  logical page -> host page
    Outputs:
      out_ptr       [B, K] int32      global device row of each entry, -1 for -1
      plan_ptr      [B, 1 + 2*MAX_MISSES] int32  miss plan (module docstring)
      counts_ptr    [B, NUM_COUNT_FIELDS] int64
    Scratch: [B, resolve_scratch_width(K_PAD, C, N_UNITS, UPSTREAM)] int32 (module docstring).
    """
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    req = tl.load(req_idx_ptr + b).to(tl.int32)
    seq = tl.load(seq_lens_ptr + b).to(tl.int32)
    base = req * SLOTS_PER_REQ
    row = req.to(tl.int64) * C
    scr = scratch_ptr + b.to(tl.int64) * scratch_stride

    offs = tl.arange(0, K_PAD)
    pos = tl.load(topk_ptr + b.to(tl.int64) * topk_stride + offs, mask=offs < K, other=-1)
    valid = (pos >= 0) & (pos < seq)
    none = offs < 0
    unit, slot, is_newest, long_blk, is_long, n_uniq, n_hit, n_miss, newest_hit, overflow = \
        resolve_hot_selection(
            pos, valid, none, seq, row, base, slot_unit_ptr, lru_ptr,
            host_table_ptr + req.to(tl.int64) * host_table_stride,
            plan_ptr + b.to(tl.int64) * plan_stride, scr, K, C, D, MAX_MISSES, N_UNITS,
            UNIT=UNIT, PAGE=PAGE, K_PAD=K_PAD, LOG_K_PAD=LOG_K_PAD, BLOCK_C=BLOCK_C,
            SEARCH_STEPS=SEARCH_STEPS, UPSTREAM=UPSTREAM, PTX_SCATTER=PTX_SCATTER)

    # ---- 4. output slot table --------------------------------------------------------------
    res = hot_buffer_rows(pos, slot, valid, is_newest, is_long, overflow, base, D,
                          UNIT=UNIT, PAGE=PAGE, PAGE_MODE=PAGE_MODE)
    tl.store(out_ptr + b.to(tl.int64) * out_stride + offs, res, mask=offs < K)

    # ---- 5. counts ------------------------------------------------------------------------
    hits = tl.where(is_long, tl.where(overflow, 0, n_hit + newest_hit), n_uniq)
    tokens = n_miss.to(tl.int64) * UNIT
    cnt = counts_ptr + b.to(tl.int64) * counts_stride
    tl.store(cnt + 0, hits.to(tl.int64))
    tl.store(cnt + 1, n_miss.to(tl.int64))
    tl.store(cnt + 2, tokens)
    if PAGE_MODE:
        tl.store(cnt + 3, n_miss.to(tl.int64))
        tl.store(cnt + 6, tl.where(is_long, n_uniq, 0).to(tl.int64))
    else:
        tl.store(cnt + 3, tokens * 0)
        tl.store(cnt + 6, tokens * 0)
    tl.store(cnt + 4, tokens * ROW_BYTES)
    tl.store(cnt + 5, overflow.to(tl.int64))


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


#: ``ResolveLaunch.kernel``: the Triton resolve here, or the CUDA one (``swap_in_cuda.py``)
RESOLVE_KERNELS = ("triton", "cuda")

#: ``ResolveLaunch.ptx_scatter`` -> the resolve's ``PTX_SCATTER``: which scattered stores go by
#: inline PTX (module docstring)
PTX_SCATTER_MODES = {"none": 0, "misses": 1, "all": 2}


def resolve_scratch_width(k_pad: int, hot_units: int, n_units: int, upstream: bool) -> int:
    """int32 scratch entries per batch row of ``resolve_hot_selection`` (module docstring):
    ``hot_units + 2*n_units`` (upstream) or ``3*k_pad + hot_units`` (position)."""
    return hot_units + 2 * n_units if upstream else 3 * k_pad + hot_units


@dataclass(frozen=True)
class ResolveLaunch:
    """Launch configuration of the resolve (``None``: the default for the shape).

    block_c: hot slots walked per iteration (power of two >= 16; default 1024) in the position
    order; the upstream order holds all ``C`` hot slots in one block (``block_c`` is raised to
    ``next_pow2(C)``); num_warps: Triton's (default 8 when the selection, or in the upstream
    order the walk block, has >= 1024 entries, 16 when the upstream walk block has >= 8192,
    else 4; with ``kernel='cuda'`` the block's warps, default up to 32); ptx_scatter: which of
    the upstream order's scattered stores go by inline PTX on CUDA, a key of
    ``PTX_SCATTER_MODES`` (module docstring; ``none``: ``tl.store``, the launch before
    2026-12-03; the interpreter always takes ``tl.store``); kernel: one of ``RESOLVE_KERNELS``:
    ``triton`` (this module) or ``cuda`` (``swap_in_cuda.py``: upstream order, CUDA devices).
    """

    block_c: Optional[int] = None
    num_warps: Optional[int] = None
    ptx_scatter: str = "misses"
    kernel: str = "triton"

    def __post_init__(self):
        b, w = self.block_c, self.num_warps
        if self.kernel not in RESOLVE_KERNELS:
            raise ValueError(f"ResolveLaunch.kernel must be one of {RESOLVE_KERNELS}, "
                             f"got {self.kernel!r}")
        if self.ptx_scatter not in PTX_SCATTER_MODES:
            raise ValueError(f"ResolveLaunch.ptx_scatter must be one of {tuple(PTX_SCATTER_MODES)}, "
                             f"got {self.ptx_scatter!r}")
        if b is not None and (not isinstance(b, int) or b < 16 or b & (b - 1)):
            raise ValueError(f"ResolveLaunch.block_c must be a power of two >= 16, got {b!r}")
        if w is not None and w not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"ResolveLaunch.num_warps must be one of 1, 2, 4, 8, 16, 32, got {w!r}")

    def resolved(self, k_pad: int, hot_units: int, upstream: bool) -> Tuple[int, int]:
        """``(block_c, num_warps)`` for this shape."""
        if upstream:
            b = max(16, next_pow2(hot_units), self.block_c or 0)
            w = self.num_warps or (16 if b >= 8192 else 8 if max(k_pad, b) >= 1024 else 4)
        else:
            b = self.block_c or max(16, min(next_pow2(hot_units), 1024))
            w = self.num_warps or (8 if k_pad >= 1024 else 4)
        return b, w
