"""Warp-specialised sparse MLA decode for Hopper (Gluon): producer warps gather, two
consumer warpgroups dequantize and multiply.

Same contract as :func:`backends.kernels.sparse_mla_decode.sparse_mla_decode` (its module doc
has the semantics) for the shapes FlashMLA's Hopper decode serves: ``d_qk = d_v + 64`` with
``d_v`` a power of two (DeepSeek-V3.2: 512 + 64), any number of query heads, bf16 or
fp8_ds_mla KV rows (16-byte aligned). Only on a CUDA device of compute capability 9.x (wgmma,
mbarriers, setmaxnreg); :func:`ws_supported` names what it cannot serve.

Why a second kernel: the Triton kernel's compiled loop (sm_90a) issues the gather of tile
``t + 1`` only after tile ``t``'s score MMAs and softmax, so the gather latency overlaps the PV
MMA alone (BENCHMARKS 6k). Here the partitions of ``gl.warp_specialize`` keep the gather off
that path, as FlashMLA's producer warps do:

* **producer** (one warpgroup, 48 registers a thread): loads the query block once, and keeps
  the slot ids one tile ahead in a two-entry ring in shared memory (``cp.async``). For every
  64-token tile it waits for the tile's ids, issues the next tile's, waits for a free stage
  (``empty`` mbarrier) and copies the rows into it with ``cp.async`` (16-byte vectors,
  zero-filled for a masked id; fp8_ds_mla rows as stored: the NoPE bytes, the four float32
  scales, the bf16 rope part). The copies arrive on the stage's ``ready`` mbarrier when they
  land (``cp.async.mbarrier.arrive.noinc``, one arrival a producer thread), so the producer
  goes on to the next tile at once: it runs up to ``STAGES`` tiles ahead.
* **consumers** (two warpgroups), for bf16 rows (the default partition): wait for ``ready``
  and fence the stage for the tensor cores (async proxy). Then, per program size:

  - **64 heads** (``_consumer_64``; more heads run several programs, a remainder is masked):
    ``S = q k^T`` as one 64 x 64 wgmma whose warps are laid out ``[4, 2]`` (each warpgroup
    computes half of the tokens for all 64 heads, so ``S`` is computed once), a base-2 online
    softmax (the row max across the warpgroups by the compiler's reduction), then
    ``acc += P V`` as a 64 x 512 wgmma with the same layout (each warpgroup owns 256 of the V
    columns; ``P`` reaches both through the stage's rope tile, which the score MMAs are done
    with).
  - **16 or 32 heads** (``_consumer_t``, transposed; a TP8 or TP4 shard): the tile's 64
    tokens are the wgmma's M, so no head is padded: ``S^T = k q^T`` ``[64, BLOCK_H]`` with
    warps ``[4, 2]`` (each warpgroup owns half of the heads, so the softmax over the tokens
    stays within a warpgroup; the rope part first), ``P^T`` through its own ``[64, BLOCK_H]``
    buffer, and ``O^T += V^T P^T`` ``[d_v, BLOCK_H]`` with warps ``[8, 1]`` (each warpgroup
    owns half of the V dims for all heads, so each reads half of the tile's V).

* **asymmetric consumers** for fp8_ds_mla rows (warpgroup 0 the default partition, warpgroup 1
  a worker partition of its own; ``_consumer_a0`` and ``_consumer_a1``, for 64-head and
  transposed programs): each dequantizes half of the tile's tokens from the stage into
  one bf16 tile (:func:`_e4m3x4_to_bf16`); warpgroup 0 alone computes all of the scores (one wgmma of N
  = 64 tokens, or N = the heads transposed: the query block, or the K tile, read from shared
  memory once a tile instead of once a warpgroup, which was what bound the fp8 tile) and the
  softmax, and hands ``P`` and the rescale factors to warpgroup 1 through shared memory; each
  accumulates half of the V dims. Five mbarriers order the two (``deq1_done``: warpgroup 1's
  rows landed; ``p_ready``; ``pv0_done`` / ``pv1_done``: a warpgroup's PV MMA is done with the
  bf16 tile and ``P``; ``fin``: the row sums, once), and the stage goes back to the producer
  when both have arrived on ``empty``. Measured on the H200 (B128 top_k 2048, BENCHMARKS 6r):
  64 heads 211 us against 240 for the symmetric consumers, 16 heads 80 against 91.

  The stage goes back to the producer (``empty``); the row sums are accumulated per element
  and reduced once at the end.

* **the output** (:func:`_store_o`): without a split, each warpgroup writes its bf16 rows into
  shared memory it is done with (warpgroup 0 the query block; warpgroup 1 the bf16 tile once
  warpgroup 0 has handed the row sums, after its last PV MMA; the bf16 consumers the stages)
  and stores them as 16-byte vectors along a row; a split's float32 partials go straight from
  the accumulator (8 bytes a thread, whole sectors), its 16-bit partials
  (``split_partials="float16"`` / ``"bfloat16"``) the staged way. B128 H128 fp8 210 us against 213 stored
  from the accumulator, bf16 184 against 192 (BENCHMARKS 6t).

Shared memory (:func:`shared_memory_bytes`): the query block (72 KB at 64 heads, d_qk 576),
512 bytes of slot ids, and ``stages`` stages of 64 tokens (bf16 rows: 72 KB each; fp8_ds_mla
rows: 41 KB as stored, plus one 64 KB bf16 tile), of the 227 KB a program may have: two
stages at 64 heads, three for fp8_ds_mla rows in 16-head programs (the default: the most that
fit, at most 3). Measured on the H200 and why it is where it is: BENCHMARKS 6o-6t.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from backends.kernels.kv_format import fp8_ds_mla_offsets
from backends.kernels.sparse_mla_decode import (WS_SPLIT_PARTIALS, LaunchInfo,
                                                check_decode_inputs, combine_splits, kernel_args,
                                                plan_splits, split_partials_dtype)

__all__ = ["sparse_mla_decode_ws", "ws_supported", "shared_memory_bytes", "compile_for_sm90",
           "WS_BLOCK_H", "WS_BLOCK_N"]

#: query heads a program serves (one wgmma M) and top-k tokens a tile holds
WS_BLOCK_H = 64
WS_BLOCK_N = 64
_PRODUCER_WARPS = 4
#: per KV format: rows a producer step covers and the producer's registers a thread (the
#: cp.async addresses, for both formats; the producer converts no fp8 rows: converting the last
#: 16 or 32 rows of each tile at 56 registers while the consumers convert the others took 300.1
#: / 307.4 us at B128 H128 against 243.0 on the H200, BENCHMARKS 6p: the consumers wait for
#: its slower share)
_ROWS = {"bf16": 16, "fp8_ds_mla": 16}
_PRODUCER_REGS = {"bf16": 48, "fp8_ds_mla": 48}
#: per KV format: at most this many query heads are served by 16- or 32-head programs with
#: the transposed consumers, more by 64-head programs. Measured on the H200 (B128 top_k 2048,
#: 32 heads): bf16 rows transposed 96.0 us, padded to 64 heads 100.3 (BENCHMARKS 6p); fp8 rows
#: 109.4 against 122.7 since the transposed PV MMA reads half of V a warpgroup (6q; 130.0
#: against 128.1 before)
_T_MAX_HEADS = {"bf16": 32, "fp8_ds_mla": 32}
#: fp8_ds_mla rows: dequantized by bit moves and a bf16 multiply (:func:`_e4m3x4_to_bf16`)
#: instead of through float32. Measured on the H200 (BENCHMARKS 6r, raw scales): the output within 1e-4 of FlashMLA's
#: (whose Hopper kernel computes the same) against 5.5e-3 through float32; 4.8e-3 from the
#: float32 reference against 3.1e-3; B128 H128 211 us against 229 with the asymmetric
#: consumers (239 / 240 with the symmetric ones)
_DEQ_BF16 = True
#: fp8_ds_mla rows, the asymmetric consumers (:func:`_consumer_a0`; replacing both
#: warpgroups splitting every MMA, as the bf16 consumers do: B128 H128 211 us against 239, H16
#: 80.1 against 90.9, BENCHMARKS 6r): rows a warpgroup dequantizes at a time (B128 H128: 16
#: rows 211 us, 32 rows 220; the symmetric consumers' best was 32 rows, 6p), and the registers
#: of warpgroup 1 (a worker partition; warpgroup 0 gets the rest of the 168 x 12 warps'
#: budget: 248)
_DEQ_ROWS = 16
_A1_REGS = 208
#: the producer issues the first tiles' copies without waiting for the query block's (which
#: arrive on their own mbarrier), so its load overlaps the first gather
_Q_EARLY = True
#: the bf16 output stored through shared memory that the program is done with, 16 bytes a
#: thread along a row (:func:`_store_o`), not 4 bytes a thread (half a sector) from the
#: accumulator's layout: B128 H128 fp8 210.0 / 210.3 us against 212.8 / 214.1, bf16 183.1 /
#: 184.1 against 191.2 / 192.1 (BENCHMARKS 6t). A split's float32 partials stay stored from the
#: accumulator's layout (8 bytes a thread, whole sectors): staged they were 0.1-1.8 us slower at
#: B1-B8 (the 128 KB round trip through shared memory a program); 16-bit partials
#: (``split_partials="float16"`` / ``"bfloat16"``) are staged as the output is (BENCHMARKS 6w)
_STAGED_STORE = True
#: registers per thread of the whole program: 12 warps x 32 x 168 <= 64 K; the consumers get
#: (168 * 12 - 48 * 4) / 8 = 228 rounded down to setmaxnreg's multiple of 8: 224 (the PTX's
#: setmaxnreg). ptxas 12.8 (Triton 3.6) for sm_90a: no spills for bf16 rows, 20 bytes for
#: fp8_ds_mla rows (the consumers' dequantization)
_MAXNREG = 168
#: dynamic shared memory a program may have on the H200: 227 KB less the 1 KB of static shared
#: memory ptxas gives the kernel, less 2 KB for the compiler's scratch and the mbarriers
_SMEM_BUDGET = 227 * 1024 - 1024 - 2048
#: names that differ between Triton 3.6 (the GPU machine's) and later versions: a barrier over
#: the warps of the calling partition, and the cp.async copy into shared memory
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
#: and a shared-memory view as another type, shape and layout (``_reinterpret`` in Triton 3.6)
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _copy_rows(dst, base_ptr, row, valid, stride, col0, WIDTH: gl.constexpr,
               layout: gl.constexpr, VEC: gl.constexpr):
    """Issues ``cp.async`` copies of ``WIDTH`` bf16 values of each row ``row [R]`` (int64, in
    ``SliceLayout(1, layout)``) starting at column ``col0`` into ``dst [R, WIDTH]``; rows not
    ``valid`` are zero-filled. ``VEC``: a power of two dividing ``stride`` and ``col0`` (8: the
    16-byte copies cp.async needs)."""
    cols = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    start = gl.multiple_of(row * stride + col0, VEC)
    _cp_async(dst, base_ptr + start[:, None] + cols[None, :], mask=valid[:, None])


@gluon.jit
def _copy_ids(dst, idx_row, t, lim, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Issues ``cp.async`` copies (4 bytes each) of tile ``t``'s slot ids ``idx_row[t * BLOCK_N
    :][:BLOCK_N]`` (int32) into ``dst [BLOCK_N]``; ids at ``lim`` or beyond are zero-filled (the
    reader masks them again)."""
    on = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
    _cp_async(dst, idx_row + on, mask=on < lim)


@gluon.jit
def _copy_fp8_nope(dst, kv_ptr, stride_kv, idx, D_V: gl.constexpr, raw_l: gl.constexpr):
    """Issues ``cp.async`` copies of the NoPE bytes of fp8_ds_mla rows ``idx [R]`` (int32 in
    the row slice of ``raw_l``; < 0: zeros) into ``dst [R, D_V / 128, 128]`` uint8, as stored."""
    G: gl.constexpr = D_V // 128
    ok = idx >= 0
    g = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(2, raw_l)))
    e = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(1, raw_l)))
    start = gl.multiple_of(gl.where(ok, idx, 0).to(gl.int64) * stride_kv, 16)
    _cp_async(dst, kv_ptr + start[:, None, None] + g[None, :, None] * 128 + e[None, None, :],
              mask=ok[:, None, None])


@gluon.jit
def _copy_fp8_scales(dst, scale_ptr, stride_scale, scale_off, idx, D_V: gl.constexpr,
                     scale_l: gl.constexpr):
    """Issues ``cp.async`` copies (4 bytes each) of the per-128 float32 scales of fp8_ds_mla
    rows ``idx [R]`` (int32 in the row slice of ``scale_l``; < 0: zeros) into
    ``dst [R, D_V / 128]``."""
    G: gl.constexpr = D_V // 128
    ok = idx >= 0
    g = gl.arange(0, G, layout=gl.SliceLayout(0, scale_l))
    start = gl.where(ok, idx, 0).to(gl.int64) * stride_scale + scale_off
    _cp_async(dst, scale_ptr + start[:, None] + g[None, :], mask=ok[:, None])


#: the PTX of :func:`_e4m3x4_to_bf16`, one instance: ``$2`` four e4m3 bytes, ``$3`` the scale
#: pair (``$4``-``$6``: the same pair, unused), ``$0`` / ``$1`` bytes 0-1 / 2-3 as bf16 pairs.
#: ``prmt`` selector nibbles 0x8-0xB replicate a byte's sign; an e4m3 NaN byte (0x7F, 0xFF)
#: comes out as +-480 x scale (the quantizers never write one)
_E4M3X4_TO_BF16_PTX = gl.constexpr("""{
        .reg .b32 t0, t1;
        prmt.b32 t0, $2, 0, 0x9180;
        prmt.b32 t1, $2, 0, 0xB3A2;
        shl.b32 t0, t0, 4;
        shl.b32 t1, t1, 4;
        and.b32 t0, t0, 0x87F087F0;
        and.b32 t1, t1, 0x87F087F0;
        mul.rn.bf16x2 $0, t0, $3;
        mul.rn.bf16x2 $1, t1, $3;
        }""")
#: 2^120: the bias between a bf16's exponent and an e4m3's, folded into the scale (so a scale of 2^8
#: or more overflows to inf: tile maxima from 114688 come out inf / NaN, BENCHMARKS 6x)
_E4M3_TO_BF16_BIAS = gl.constexpr(1.329227995784916e+36)


@gluon.jit
def _dequant_rows(raw, scales, row0: gl.constexpr, ROWS: gl.constexpr, D_V: gl.constexpr,
                  deq_l: gl.constexpr, DEQ_BF16: gl.constexpr):
    """Rows ``[row0, row0 + ROWS)`` of fp8 e4m3 ``raw [BLOCK_N, D_V / 128, 128]`` x the per-128
    ``scales [BLOCK_N, D_V / 128]`` float32 (both in shared memory) as bf16 ``[ROWS, D_V]`` in
    registers. ``DEQ_BF16`` off: converted to float32, multiplied, the product rounded once (as
    the reference rounds it). On: :func:`_e4m3x4_to_bf16` (bit moves and one bf16x2 multiply
    a pair; a power-of-two scale gives the same bits, a raw one is rounded to bf16 first)."""
    r = raw.slice(row0, ROWS).load(deq_l)
    sc = scales.slice(row0, ROWS).load(gl.SliceLayout(2, deq_l))
    if DEQ_BF16:
        # the scale x 2^120 (the bias between e4m3's exponent and bf16's) as a bf16 pair
        sb = (sc * _E4M3_TO_BF16_BIAS).to(gl.bfloat16).to(gl.uint16, bitcast=True)
        pair = sb.to(gl.uint32) | (sb.to(gl.uint32) << 16)
        vals = _e4m3x4_to_bf16(r, gl.broadcast(pair[:, :, None], r)[0])
    else:
        vals = (r.to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc[:, :, None]).to(gl.bfloat16)
    return gl.reshape(vals, [ROWS, D_V])


@gluon.jit
def _e4m3x4_to_bf16(raw, scale_pair):
    """fp8 e4m3 bytes ``raw`` (uint8) x ``scale_pair`` (uint32: the bf16 bits of scale x 2^120
    in both halves) as bf16, four bytes an instance (:data:`_E4M3X4_TO_BF16_PTX`): each byte's
    sign byte-replicated beside it (``prmt``), the seven magnitude bits moved to a bf16's
    exponent and mantissa (shift, mask: the value x 2^-120, subnormals included), then one
    ``mul.rn.bf16x2`` a pair."""
    return gl.inline_asm_elementwise(_E4M3X4_TO_BF16_PTX, "=r,=r,r,r,r,r,r", [raw, scale_pair],
                                     dtype=gl.bfloat16, is_pure=True, pack=4)


@gluon.jit
def _producer(q_ptr, stride_qb, stride_qh, kv_ptr, stride_kv,
              scale_ptr, stride_scale, scale_off, rope_ptr, stride_rope, rope_off,
              idx_ptr, stride_ib,
              b, h0, H, t_begin, t_end, lim, num_slots,
              q_nope, q_rope, kv_nope, kv_rope, kv_raw, kv_scale, ids, q_bar, ready, empty,
              D_V: gl.constexpr, D_ROPE: gl.constexpr, BLOCK_H: gl.constexpr,
              BLOCK_N: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr,
              WARPS: gl.constexpr, IS_FP8: gl.constexpr, raw_l: gl.constexpr,
              scale_l: gl.constexpr, Q_EARLY: gl.constexpr):
    nope_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    ids_l: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    idx_row = idx_ptr + b.to(gl.int64) * stride_ib
    # ---- the query block and the first tile's slot ids, once ----
    _copy_ids(ids.index(0), idx_row, t_begin, lim, BLOCK_N, ids_l)
    if Q_EARLY:
        async_copy.commit_group()           # the ids on their own: the loop waits for them
    for c in gl.static_range(BLOCK_H // ROWS):
        hn = h0 + c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, nope_l))
        _copy_rows(q_nope.slice(c * ROWS, ROWS), q_ptr + b.to(gl.int64) * stride_qb,
                   hn.to(gl.int64), hn < H, stride_qh, 0, D_V, nope_l, 8)
        hr = h0 + c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, rope_l))
        _copy_rows(q_rope.slice(c * ROWS, ROWS), q_ptr + b.to(gl.int64) * stride_qb,
                   hr.to(gl.int64), hr < H, stride_qh, D_V, D_ROPE, rope_l, 8)
    async_copy.commit_group()
    if Q_EARLY:
        # the query block arrives on q_bar when it lands, and the first tiles' copies go out
        # at once (every stage's arrival comes after this thread's query copies too)
        async_copy.mbarrier_arrive(q_bar, increment_count=False)
    else:
        async_copy.wait_group(0)
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(q_bar, count=1)
    # ---- the KV tiles of this split: each tile's slot ids come from shared memory, copied
    # one tile ahead (their load latency off the gather's path); the rows' copies arrive on
    # the stage's ready barrier when they land, so the next tile's go out at once ----
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        cur = ids.index(i % 2)
        # this tile's ids were the last copy group but one: landed, and seen by every thread
        async_copy.wait_group(1)
        _partition_barrier()
        _copy_ids(ids.index((i + 1) % 2), idx_row, t + 1, lim, BLOCK_N, ids_l)
        async_copy.commit_group()
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        if IS_FP8:
            on = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, scale_l))
            idx = gl.where(on < lim, cur.load(gl.SliceLayout(1, scale_l)), -1)
            _copy_fp8_scales(kv_scale.index(s), scale_ptr, stride_scale, scale_off,
                             gl.where((idx >= 0) & (idx < num_slots), idx, -1), D_V, scale_l)
        for c in gl.static_range(BLOCK_N // ROWS):
            on = t * BLOCK_N + c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, rope_l))
            idx = gl.where(on < lim, cur.slice(c * ROWS, ROWS).load(gl.SliceLayout(1, rope_l)),
                           -1)
            ok = (idx >= 0) & (idx < num_slots)
            idx = gl.where(ok, idx, -1)
            _copy_rows(kv_rope.index(s).slice(c * ROWS, ROWS), rope_ptr,
                       gl.where(ok, idx, 0).to(gl.int64), ok, stride_rope, rope_off, D_ROPE,
                       rope_l, 8)
            if IS_FP8:
                _copy_fp8_nope(kv_raw.index(s).slice(c * ROWS, ROWS), kv_ptr, stride_kv,
                               gl.convert_layout(idx, gl.SliceLayout(1, gl.SliceLayout(2, raw_l))),
                               D_V, raw_l)
            else:
                ok_n = gl.convert_layout(ok, gl.SliceLayout(1, nope_l))
                idx_n = gl.convert_layout(idx, gl.SliceLayout(1, nope_l))
                _copy_rows(kv_nope.index(s).slice(c * ROWS, ROWS), kv_ptr,
                           gl.where(ok_n, idx_n, 0).to(gl.int64), ok_n, stride_kv, 0, D_V,
                           nope_l, 8)
        async_copy.commit_group()
        # each producer thread's copies arrive on the stage's barrier (count: the producer's
        # threads) when they land; the consumers fence them for the tensor cores
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def _online_softmax(sc, valid, m_i, l_el, qk_scale_log2, TA: gl.constexpr):
    """One tile of the base-2 online softmax over the tokens' axis ``TA`` of the raw scores
    ``sc`` (float32; ``valid``: the tokens to keep, along ``TA``): ``(p, m_new, alpha, l_el)``
    with ``p = 2^(sc * qk_scale_log2 - m_new)`` (0 for masked tokens), the new running max per
    head, the factor ``alpha = 2^(m_i - m_new)`` earlier sums and outputs are rescaled by, and
    the per-element running sums ``l_el`` rescaled and added to (an all-masked head keeps
    ``-inf`` as its max and 0 as its sums)."""
    sc = gl.where(gl.expand_dims(valid, 1 - TA), sc * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, axis=TA))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(sc - gl.expand_dims(m_use, TA))
    return p, m_new, alpha, l_el * gl.expand_dims(alpha, TA) + p


@gluon.jit
def _tile_ids(idx_row, t, offs_n, lim, BLOCK_N: gl.constexpr):
    """Tile ``t``'s slot ids ``idx_row[t * BLOCK_N + offs_n]`` (int32, in ``offs_n``'s layout);
    -1 at ``lim`` or beyond."""
    on = t * BLOCK_N + offs_n
    return gl.load(idx_row + on, mask=on < lim, other=-1)


@gluon.jit
def _tile_done(pv_done, empty_s):
    """The end of an asymmetric consumer's tile: its PV MMA, waited for by every thread, is done
    with the bf16 tile and P (``pv_done``), and its share of the stage goes back (``empty_s``)."""
    _partition_barrier()
    mbarrier.arrive(pv_done, count=1)
    mbarrier.arrive(empty_s, count=1)


@gluon.jit
def _hand_p(p_buf, p, stat, alpha, p_ready):
    """Asymmetric warpgroup 0 hands a tile to warpgroup 1: ``p`` as bf16 into ``p_buf`` (for
    the tensor cores) and the rescale factors ``alpha`` into ``stat``, then ``p_ready``."""
    p_buf.store(p.to(gl.bfloat16))
    stat.store(alpha)
    fence_async_shared()
    _partition_barrier()
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _hand_row_sums(stat, l_safe, pv1_done, fin, t_begin, t_end):
    """Asymmetric warpgroup 0 hands the row sums ``l_safe`` to warpgroup 1 (``stat``, then
    ``fin``) once warpgroup 1 has read the last tile's rescale factors (its last ``pv1_done``)."""
    if t_end > t_begin:
        mbarrier.wait(pv1_done, (t_end - t_begin - 1) & 1)
    stat.store(l_safe)
    _partition_barrier()
    mbarrier.arrive(fin, count=1)


@gluon.jit
def _consumer_64(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                 part_o_ptr, part_lse_ptr, part_e_ptr,
                 b, h0, H, split, num_splits, t_begin, t_end, lim, num_slots, qk_scale_log2,
                 q_nope, q_rope, kv_nope, kv_rope, q_bar, ready, empty,
                 D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, SPLIT: gl.constexpr, STAGED: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_N // 2, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, D_V // 2, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    col_s: gl.constexpr = gl.SliceLayout(0, s_l)
    row_o: gl.constexpr = gl.SliceLayout(1, o_l)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l_el = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)   # row sums, per element
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, layout=o_l)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)

    idx_row = idx_ptr + b.to(gl.int64) * stride_ib
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)
    n_idx = _tile_ids(idx_row, t_begin, offs_n, lim, BLOCK_N)
    mbarrier.wait(q_bar, 0)
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        idx = n_idx
        n_idx = _tile_ids(idx_row, t + 1, offs_n, lim, BLOCK_N)   # the next tile's, early
        valid = (idx >= 0) & (idx < num_slots)

        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        fence_async_shared()        # the producer's copies, for the tensor cores
        kn = kv_nope.index(s)
        sc = warpgroup_mma(q_nope, kn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sc = warpgroup_mma(q_rope, kv_rope.index(s).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(0, deps=[sc])

        p, m_new, alpha, l_el = _online_softmax(sc, valid, m_i, l_el, qk_scale_log2, 1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        # P to both warpgroups through shared memory, one barrier (each writes its tokens'
        # columns), and the PV MMA reads it from there: into the stage's rope tile, which has
        # the same shape and layout ([64, 64] bf16) and which the score MMAs are done with
        # (both warpgroups' score MMAs are done with it once the row max above has crossed the
        # warpgroups: the compiler's reduction syncs the partition between the wait and this
        # store; tests/test_sparse_mla_decode_ws.py checks that in the sm_90a PTX)
        p_smem = kv_rope.index(s)
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        _partition_barrier()
        acc = warpgroup_mma(p_smem, kn, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _partition_barrier()
        mbarrier.arrive(empty.index(s), count=1)
        m_i = m_new

    l_i = gl.sum(l_el, axis=1)
    has = l_i > 0.0
    l_safe = gl.where(has, l_i, 1.0)
    # the stages (the loop's last barrier: both warpgroups' MMAs are done with them)
    _store_o(acc, l_safe, kv_nope, b, h0, H, split, num_splits, out_ptr, stride_ob, stride_oh,
             part_o_ptr, part_e_ptr, 0, D_V, BLOCK_H, SPLIT, False, STAGED, o_l)
    _store_lse(m_i + gl.log2(l_safe), has, b, h0, H, split, num_splits, lse_ptr, stride_lb,
               part_lse_ptr, BLOCK_H, SPLIT)


@gluon.jit
def _store_o(acc, l_safe, buf, b, h0, H, split, num_splits, out_ptr, stride_ob, stride_oh,
             part_o_ptr, part_e_ptr, V0: gl.constexpr, D_V: gl.constexpr, BLOCK_H: gl.constexpr,
             SPLIT: gl.constexpr, TRANSPOSED: gl.constexpr, STAGED: gl.constexpr,
             o_l: gl.constexpr):
    """Stores output columns ``[V0, V0 + W)`` of a program's heads: ``acc`` float32 in ``o_l``
    (``[BLOCK_H, W]``; ``[W, BLOCK_H]`` ``TRANSPOSED``) divided by the row sums ``l_safe
    [BLOCK_H]`` (any layout), as bf16 into ``out [B, H, D_V]`` or, for a split, as partials
    ``[B, H, S, D_V]`` of ``part_o_ptr``'s dtype (float32, bf16, or fp16: each head's ``W``
    columns scaled by ``2^-e``, the power of two that puts their largest magnitude in
    ``[2^14, 2^15)``, ``e`` (clamped to +-100) stored as a float at ``part_e [B, H, S, D_V / W]``,
    so fp16 holds any finite values to 11 bits). ``STAGED`` (16-bit values: the output, 16-bit
    partials): through ``buf`` (shared
    memory of at least ``BLOCK_H x W`` bf16 that no one reads or writes any more), so that
    every thread stores whole 16-byte vectors along a row (a warp 512 contiguous bytes) instead
    of the accumulator layout's 2 values (4 bytes, half a sector) in 8 rows."""
    HA: gl.constexpr = 1 if TRANSPOSED else 0       # the heads' axis of acc
    VA: gl.constexpr = 1 - HA                       # the V dims' axis
    W: gl.constexpr = acc.shape[VA]
    o = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(VA, o_l)), VA)
    if SPLIT:
        if part_o_ptr.dtype.element_ty == gl.float16:
            # the exponent field of each head's largest |o|, less 14 (0 gives -100, clamped)
            top = gl.max(gl.abs(o), axis=VA).to(gl.int32, bitcast=True)
            e = gl.minimum(gl.maximum(((top >> 23) & 255) - 141, -100), 100)
            o = o * gl.expand_dims(((127 - e) << 23).to(gl.float32, bitcast=True), VA)
            offs_e = h0 + gl.arange(0, BLOCK_H, layout=e.type.layout)
            gl.store(part_e_ptr + ((b * H + offs_e).to(gl.int64) * num_splits + split)
                     * (D_V // W) + V0 // W, e.to(gl.float32), mask=offs_e < H)
    o = o.to(part_o_ptr.dtype.element_ty if SPLIT else gl.bfloat16)
    if STAGED:
        gl.static_assert(o.dtype.primitive_bitwidth == 16, "staged stores are of 16-bit values")
        VEC: gl.constexpr = 8
        NW: gl.constexpr = gl.num_warps()
        # 16-byte groups XORed by the row (mod 8): the accumulator's 8 rows a store hit
        # distinct banks, and a row's groups stay a permutation of themselves
        sl: gl.constexpr = gl.SwizzledSharedLayout(VEC, 1, 8, [1, 0])
        if _NEW_REINTERPRET:
            stage = buf.reinterpret(o.dtype, [BLOCK_H, W], sl)
        else:
            stage = buf._reinterpret(o.dtype, [BLOCK_H, W], sl)
        if TRANSPOSED:
            stage.permute((1, 0)).store(o)
        else:
            stage.store(o)
        _partition_barrier()
        st_l: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [NW, 1], [1, 0])
        o = stage.load(st_l)
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st_l))
        offs_v = V0 + gl.arange(0, W, layout=gl.SliceLayout(0, st_l))
        HS: gl.constexpr = 0                        # the heads' axis of what is stored
    else:
        offs_h = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(VA, o_l))
        offs_v = V0 + gl.arange(0, W, layout=gl.SliceLayout(HA, o_l))
        HS: gl.constexpr = HA
    if SPLIT:
        row = part_o_ptr + ((b * H + offs_h).to(gl.int64) * num_splits + split) * D_V
    else:
        row = out_ptr + b.to(gl.int64) * stride_ob + offs_h.to(gl.int64) * stride_oh
    ptrs = gl.expand_dims(row, 1 - HS) + gl.expand_dims(offs_v, HS)
    gl.store(ptrs, o, mask=gl.expand_dims(offs_h < H, 1 - HS))


@gluon.jit
def _store_lse(lse2, has, b, h0, H, split, num_splits, lse_ptr, stride_lb, part_lse_ptr,
               BLOCK_H: gl.constexpr, SPLIT: gl.constexpr):
    """Stores the natural-log LSE of a program's heads from ``lse2 [BLOCK_H]`` (base 2;
    ``has``: heads with a valid token): ``+inf`` for an empty head, ``-inf`` in a split's
    partial."""
    offs_h = h0 + gl.arange(0, BLOCK_H, layout=lse2.type.layout)
    if SPLIT:
        part_l = (b * H + offs_h).to(gl.int64) * num_splits + split
        gl.store(part_lse_ptr + part_l, gl.where(has, lse2 * 0.6931471805599453, float("-inf")),
                 mask=offs_h < H)
    else:
        gl.store(lse_ptr + b.to(gl.int64) * stride_lb + offs_h,
                 gl.where(has, lse2 * 0.6931471805599453, float("inf")), mask=offs_h < H)


@gluon.jit
def _dequant_half(kn, kv_raw, kv_scale, s, ROW0: gl.constexpr, HALF: gl.constexpr,
                  DEQ_ROWS: gl.constexpr, D_V: gl.constexpr, deq_l: gl.constexpr,
                  DEQ_BF16: gl.constexpr):
    """One warpgroup's share of the asymmetric consumers' dequantization: rows ``[ROW0, ROW0
    + HALF)`` of stage ``s`` into the bf16 tile ``kn``, ``DEQ_ROWS`` at a time, then fenced
    for the tensor cores and a partition barrier."""
    for c in gl.static_range(HALF // DEQ_ROWS):
        kn.slice(ROW0 + c * DEQ_ROWS, DEQ_ROWS).store(
            _dequant_rows(kv_raw.index(s), kv_scale.index(s), ROW0 + c * DEQ_ROWS, DEQ_ROWS,
                          D_V, deq_l, DEQ_BF16))
    fence_async_shared()
    _partition_barrier()


@gluon.jit
def _consumer_a0(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                 part_o_ptr, part_lse_ptr, part_e_ptr,
                 b, h0, H, split, num_splits, t_begin, t_end, lim, num_slots, qk_scale_log2,
                 q_nope, q_rope, kv_nope, kv_rope, kv_raw, kv_scale, p_t, stat, q_bar, ready,
                 empty, deq1_done, p_ready, pv0_done, pv1_done, fin,
                 D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, SPLIT: gl.constexpr, DEQ_ROWS: gl.constexpr,
                 deq_l: gl.constexpr, DEQ_BF16: gl.constexpr, TRANSPOSED: gl.constexpr,
                 STAGED: gl.constexpr):
    """Asymmetric fp8_ds_mla consumers, warpgroup 0 (the default partition): dequantizes tokens
    ``[0, BLOCK_N / 2)`` of each tile, computes all of the scores and the online softmax,
    hands ``P`` and the rescale factors (``stat``) to warpgroup 1 (:func:`_consumer_a1`), and
    accumulates the V dims ``[0, D_V / 2)``. 64-head programs: ``S = q k^T`` ``[BLOCK_H,
    BLOCK_N]`` (one 64 x 64 wgmma a k-step: the query block read from shared memory once a
    tile, not once a warpgroup), ``P`` through the stage's rope tile, ``O += P V``.
    ``TRANSPOSED`` (16- / 32-head programs, as :func:`_consumer_t`): ``S^T = k q^T``
    ``[BLOCK_N, BLOCK_H]`` (the K tile read once; the rope part first, under the
    dequantization), ``P^T`` through ``p_t``, ``O^T += V^T P^T``. Each tile's handshakes:
    ``deq1_done`` (warpgroup 1's rows landed), ``p_ready``, ``pv0_done`` / ``pv1_done`` (a
    warpgroup's PV MMA is done with the bf16 tile and ``P``), ``fin`` (the row sums, once)."""
    HA: gl.constexpr = 1 if TRANSPOSED else 0       # the heads' axis of S and O
    TA: gl.constexpr = 1 - HA                       # the tokens' axis of S, the V dims' of O
    s_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1],
        instr_shape=[16, BLOCK_H if TRANSPOSED else BLOCK_N, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1],
        instr_shape=[16, BLOCK_H if TRANSPOSED else D_V // 2, 16])
    HALF: gl.constexpr = BLOCK_N // 2

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(TA, s_l))
    if TRANSPOSED:
        l_el = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_l)  # softmax sums, per element
        acc = gl.zeros([D_V // 2, BLOCK_H], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_l)
    else:
        l_el = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
        acc = gl.zeros([BLOCK_H, D_V // 2], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)

    idx_row = idx_ptr + b.to(gl.int64) * stride_ib
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(HA, s_l))
    n_idx = _tile_ids(idx_row, t_begin, offs_n, lim, BLOCK_N)
    kn = kv_nope.index(0)
    mbarrier.wait(q_bar, 0)
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        idx = n_idx
        n_idx = _tile_ids(idx_row, t + 1, offs_n, lim, BLOCK_N)   # the next tile's, early
        valid = (idx >= 0) & (idx < num_slots)

        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        fence_async_shared()        # the producer's copies, for the tensor cores
        if TRANSPOSED:
            sc = warpgroup_mma(kv_rope.index(s), q_rope.permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        if i > 0:
            mbarrier.wait(pv1_done, (i - 1) & 1)        # the bf16 tile and P are free
        _dequant_half(kn, kv_raw, kv_scale, s, 0, HALF, DEQ_ROWS, D_V, deq_l, DEQ_BF16)
        mbarrier.wait(deq1_done, i & 1)
        if TRANSPOSED:
            sc = warpgroup_mma(kn, q_nope.permute((1, 0)), sc, is_async=True)
        else:
            sc = warpgroup_mma(q_nope, kn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            sc = warpgroup_mma(q_rope, kv_rope.index(s).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(0, deps=[sc])

        p, m_new, alpha, l_el = _online_softmax(sc, valid, m_i, l_el, qk_scale_log2, TA)
        # P (P^T) to warpgroup 1: into the stage's rope tile, which this warpgroup's score
        # MMAs, its only readers, are done with (into p_t transposed)
        p_buf = p_t if TRANSPOSED else kv_rope.index(s)
        _hand_p(p_buf, p, stat, alpha, p_ready)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(TA, o_l)), TA)
        if TRANSPOSED:
            acc = warpgroup_mma(kn.slice(0, D_V // 2, dim=1).permute((1, 0)), p_t, acc,
                                is_async=True)
        else:
            acc = warpgroup_mma(p_buf, kn.slice(0, D_V // 2, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _tile_done(pv0_done, empty.index(s))
        m_i = m_new

    l_i = gl.sum(l_el, axis=TA)
    has = l_i > 0.0
    l_safe = gl.where(has, l_i, 1.0)
    _hand_row_sums(stat, l_safe, pv1_done, fin, t_begin, t_end)
    # through the query block (only this warpgroup's score MMAs read it, and they are done)
    _store_o(acc, l_safe, q_nope, b, h0, H, split, num_splits, out_ptr, stride_ob, stride_oh,
             part_o_ptr, part_e_ptr, 0, D_V, BLOCK_H, SPLIT, TRANSPOSED, STAGED, o_l)
    _store_lse(m_i + gl.log2(l_safe), has, b, h0, H, split, num_splits, lse_ptr, stride_lb,
               part_lse_ptr, BLOCK_H, SPLIT)


@gluon.jit
def _consumer_a1(out_ptr, stride_ob, stride_oh, part_o_ptr, part_e_ptr,
                 b, h0, H, split, num_splits, t_begin, t_end,
                 kv_nope, kv_rope, kv_raw, kv_scale, p_t, stat, ready, empty,
                 deq1_done, p_ready, pv0_done, pv1_done, fin,
                 D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, SPLIT: gl.constexpr, DEQ_ROWS: gl.constexpr,
                 deq_l: gl.constexpr, DEQ_BF16: gl.constexpr, TRANSPOSED: gl.constexpr,
                 STAGED: gl.constexpr):
    """Warpgroup 1 of the asymmetric fp8_ds_mla consumers (a worker partition; see
    :func:`_consumer_a0`): dequantizes tokens
    ``[BLOCK_N / 2, BLOCK_N)`` of each tile, then, given ``P`` (the stage's rope tile; ``P^T``
    in ``p_t`` transposed) and the rescale factors, accumulates the V dims ``[D_V / 2, D_V)``
    of ``O`` (of ``O^T`` transposed)."""
    o_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1],
        instr_shape=[16, BLOCK_H if TRANSPOSED else D_V // 2, 16])
    HALF: gl.constexpr = BLOCK_N // 2
    if TRANSPOSED:
        acc = gl.zeros([D_V // 2, BLOCK_H], gl.float32, layout=o_l)
    else:
        acc = gl.zeros([BLOCK_H, D_V // 2], gl.float32, layout=o_l)
    kn = kv_nope.index(0)
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if i > 0:
            mbarrier.wait(pv0_done, (i - 1) & 1)        # the bf16 tile is free
        _dequant_half(kn, kv_raw, kv_scale, s, HALF, HALF, DEQ_ROWS, D_V, deq_l, DEQ_BF16)
        mbarrier.arrive(deq1_done, count=1)
        mbarrier.wait(p_ready, i & 1)
        if TRANSPOSED:
            acc = acc * stat.load(gl.SliceLayout(0, o_l))[None, :]
            acc = warpgroup_mma(kn.slice(D_V // 2, D_V // 2, dim=1).permute((1, 0)), p_t, acc,
                                is_async=True)
        else:
            acc = acc * stat.load(gl.SliceLayout(1, o_l))[:, None]
            acc = warpgroup_mma(kv_rope.index(s), kn.slice(D_V // 2, D_V // 2, dim=1), acc,
                                is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _tile_done(pv1_done, empty.index(s))
    mbarrier.wait(fin, 0)
    # through the bf16 tile: warpgroup 0 hands the row sums (fin) after its last PV MMA
    _store_o(acc, stat.load(gl.SliceLayout(0 if TRANSPOSED else 1, o_l)), kn, b, h0, H, split,
             num_splits, out_ptr, stride_ob, stride_oh, part_o_ptr, part_e_ptr, D_V // 2, D_V,
             BLOCK_H,
             SPLIT, TRANSPOSED, STAGED, o_l)


@gluon.jit
def _consumer_t(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                part_o_ptr, part_lse_ptr, part_e_ptr,
                b, h0, H, split, num_splits, t_begin, t_end, lim, num_slots, qk_scale_log2,
                q_nope, q_rope, kv_nope, kv_rope, p_t, q_bar, ready, empty,
                D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, SPLIT: gl.constexpr, STAGED: gl.constexpr):
    """The consumers for few heads (``BLOCK_H`` 16 or 32: a TP8 or TP4 shard of
    DeepSeek-V3.2's 128), everything transposed so that the tile's 64 tokens are the wgmma M:
    ``S^T = k q^T`` ``[BLOCK_N, BLOCK_H]`` with warps laid out ``[4, 2]`` (each warpgroup owns
    half of the heads, so the softmax over the tokens stays inside a warpgroup; both read the
    whole K tile) and ``O^T += V^T P^T`` ``[D_V, BLOCK_H]`` with warps ``[8, 1]`` (each
    warpgroup owns half of the V dims for all heads and reads half of the V tile). No head
    padding: the MMAs do the work of ``BLOCK_H`` heads, not 64."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_H // 2, 16])
    tok_s: gl.constexpr = gl.SliceLayout(1, s_l)
    head_s: gl.constexpr = gl.SliceLayout(0, s_l)
    # O^T += V^T P^T with the warpgroups stacked along M: each owns half of the V dims for all
    # heads and reads only its half of the tile's V (B128 H16 fp8 rows 94.4 us against 102.8
    # split by heads as the scores are, bf16 rows 89.3 against 91.3; BENCHMARKS 6q)
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    head_o: gl.constexpr = gl.SliceLayout(0, o_l)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=head_s)
    l_el = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_l)   # column sums, per element
    acc = gl.zeros([D_V, BLOCK_H], gl.float32, layout=o_l)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_l)

    idx_row = idx_ptr + b.to(gl.int64) * stride_ib
    offs_n = gl.arange(0, BLOCK_N, layout=tok_s)
    n_idx = _tile_ids(idx_row, t_begin, offs_n, lim, BLOCK_N)
    mbarrier.wait(q_bar, 0)
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        idx = n_idx
        n_idx = _tile_ids(idx_row, t + 1, offs_n, lim, BLOCK_N)   # the next tile's, early
        valid = (idx >= 0) & (idx < num_slots)

        # the rope part of the scores first (the order measured when fp8 rows ran here too:
        # B128 H16 101.5 us against 103.4 with it after the NoPE part, BENCHMARKS 6q)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        fence_async_shared()        # the producer's copies, for the tensor cores
        sc = warpgroup_mma(kv_rope.index(s), q_rope.permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        kn = kv_nope.index(s)
        sc = warpgroup_mma(kn, q_nope.permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(0, deps=[sc])

        p, m_new, alpha, l_el = _online_softmax(sc, valid, m_i, l_el, qk_scale_log2, 0)
        acc = acc * gl.convert_layout(alpha, head_o)[None, :]
        # P^T to its own buffer: each warpgroup writes its heads' columns, and after the
        # barrier each reads all of them (its PV MMA covers every head for half of the dims)
        p_t.store(p.to(gl.bfloat16))
        fence_async_shared()
        _partition_barrier()
        acc = warpgroup_mma(kn.permute((1, 0)), p_t, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _partition_barrier()
        mbarrier.arrive(empty.index(s), count=1)
        m_i = m_new

    l_i = gl.sum(l_el, axis=0)
    has = l_i > 0.0
    l_safe = gl.where(has, l_i, 1.0)
    _store_o(acc, l_safe, kv_nope, b, h0, H, split, num_splits, out_ptr, stride_ob, stride_oh,
             part_o_ptr, part_e_ptr, 0, D_V, BLOCK_H, SPLIT, True, STAGED, o_l)
    _store_lse(m_i + gl.log2(l_safe), has, b, h0, H, split, num_splits, lse_ptr, stride_lb,
               part_lse_ptr, BLOCK_H, SPLIT)


@gluon.jit
def _consumer(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
              part_o_ptr, part_lse_ptr, part_e_ptr,
              b, h0, H, split, num_splits, t_begin, t_end, lim, num_slots, qk_scale_log2,
              q_nope, q_rope, kv_nope, kv_rope, p_t, q_bar, ready, empty,
              D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, SPLIT: gl.constexpr, TRANSPOSED: gl.constexpr,
              STAGED: gl.constexpr):
    """The consumer partition for bf16 rows: 64-head programs (:func:`_consumer_64`) or, for
    fewer heads, the transposed ones (:func:`_consumer_t`)."""
    if TRANSPOSED:
        _consumer_t(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                    part_o_ptr, part_lse_ptr, part_e_ptr, b, h0, H, split, num_splits, t_begin,
                    t_end, lim,
                    num_slots, qk_scale_log2, q_nope, q_rope, kv_nope, kv_rope, p_t, q_bar,
                    ready, empty, D_V, BLOCK_H, BLOCK_N, STAGES, SPLIT, STAGED)
    else:
        _consumer_64(idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                     part_o_ptr, part_lse_ptr, part_e_ptr, b, h0, H, split, num_splits, t_begin,
                     t_end, lim,
                     num_slots, qk_scale_log2, q_nope, q_rope, kv_nope, kv_rope, q_bar, ready,
                     empty, D_V, BLOCK_H, BLOCK_N, STAGES, SPLIT, STAGED)


@gluon.jit
def _sparse_mla_decode_ws_fwd(
        q_ptr, stride_qb, stride_qh,          # q [B, H, D_V + D_ROPE] bf16
        kv_ptr, stride_kv,                    # bf16 rows [N, D_V + D_ROPE], or fp8_ds_mla bytes
        scale_ptr, stride_scale, scale_off,   # fp8: float32 view of the rows, scales at scale_off
        rope_ptr, stride_rope, rope_off,      # bf16 view of the rows, rope values at rope_off
        idx_ptr, stride_ib,                   # indices [B, K] int32
        out_ptr, stride_ob, stride_oh,        # out [B, H, D_V] bf16        (not SPLIT)
        lse_ptr, stride_lb,                   # lse [B, H] fp32             (not SPLIT)
        part_o_ptr, part_lse_ptr,             # [B, H, S, D_V] / [B, H, S] fp32 (SPLIT)
        H, K, num_slots, num_splits, tiles_per_split, num_head_blocks,
        qk_scale_log2,
        part_e_ptr,                           # [B, H, S, NCH] fp32 (SPLIT, fp16 partials)
        D_V: gl.constexpr, D_ROPE: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        IS_FP8: gl.constexpr, RAW_LAYOUT: gl.constexpr, SCALE_LAYOUT: gl.constexpr,
        DEQ_ROWS: gl.constexpr, DEQ_LAYOUT: gl.constexpr, RAW_SMEM: gl.constexpr,
        SCALE_SMEM: gl.constexpr, TRANSPOSED: gl.constexpr,
        P_COLS: gl.constexpr, DEQ_BF16: gl.constexpr,
        A1_REGS: gl.constexpr, Q_EARLY: gl.constexpr, STAGED: gl.constexpr):
    pid = gl.program_id(0)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    b = rest // num_splits
    h0 = hb * BLOCK_H
    n_tiles = gl.cdiv(K, BLOCK_N)
    t_begin = split * tiles_per_split
    t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
    lim = gl.minimum(K, t_end * BLOCK_N)

    sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_nope = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_V], sh)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_ROPE], sh)
    kv_rope = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_ROPE], sh)
    if IS_FP8:
        # the stages hold the rows as stored (bytes and scales); one bf16 tile for the MMAs
        G: gl.constexpr = D_V // 128
        kv_nope = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_N, D_V], sh)
        kv_raw = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, G, 128], RAW_SMEM)
        kv_scale = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, G], SCALE_SMEM)
    else:
        kv_nope = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_V], sh)
        kv_raw = gl.allocate_shared_memory(gl.uint8, [1, 1, 1, 16], RAW_SMEM)       # unused
        kv_scale = gl.allocate_shared_memory(gl.float32, [1, 1, 4], SCALE_SMEM)     # unused
    ids = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N],
                                    gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=PRODUCER_WARPS * 32 if Q_EARLY else 1)
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=PRODUCER_WARPS * 32)
        mbarrier.init(empty.index(j), count=2 if IS_FP8 else 1)

    # P^T of the transposed consumers (a minimal unused buffer for the 64-head ones)
    p_t = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, P_COLS],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_N, P_COLS],
                                                                         gl.bfloat16))
    if IS_FP8:      # the asymmetric consumers: warpgroup 1 a worker partition of its own
        stat = gl.allocate_shared_memory(gl.float32, [BLOCK_H],
                                         gl.SwizzledSharedLayout(1, 1, 1, [0]))
        hand = gl.allocate_shared_memory(gl.int64, [5, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(5):
            mbarrier.init(hand.index(j), count=1)
        gl.warp_specialize([
            (_consumer_a0, (idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr,
                            stride_lb, part_o_ptr, part_lse_ptr, part_e_ptr, b, h0, H, split,
                            num_splits,
                            t_begin, t_end, lim, num_slots, qk_scale_log2, q_nope, q_rope,
                            kv_nope, kv_rope, kv_raw, kv_scale, p_t, stat, q_bar, ready, empty,
                            hand.index(0), hand.index(1), hand.index(2), hand.index(3),
                            hand.index(4), D_V, BLOCK_H, BLOCK_N, STAGES, SPLIT, DEQ_ROWS,
                            DEQ_LAYOUT, DEQ_BF16, TRANSPOSED, STAGED)),
            (_producer, (q_ptr, stride_qb, stride_qh, kv_ptr, stride_kv,
                         scale_ptr, stride_scale, scale_off, rope_ptr, stride_rope, rope_off,
                         idx_ptr, stride_ib, b, h0, H, t_begin, t_end, lim, num_slots,
                         q_nope, q_rope, kv_nope, kv_rope, kv_raw, kv_scale, ids, q_bar,
                         ready, empty, D_V, D_ROPE, BLOCK_H, BLOCK_N, ROWS, STAGES,
                         PRODUCER_WARPS, IS_FP8, RAW_LAYOUT, SCALE_LAYOUT, Q_EARLY)),
            (_consumer_a1, (out_ptr, stride_ob, stride_oh, part_o_ptr, part_e_ptr,
                            b, h0, H, split, num_splits, t_begin, t_end,
                            kv_nope, kv_rope, kv_raw, kv_scale, p_t, stat, ready, empty,
                            hand.index(0), hand.index(1), hand.index(2), hand.index(3),
                            hand.index(4), D_V, BLOCK_H, BLOCK_N, STAGES, SPLIT, DEQ_ROWS,
                            DEQ_LAYOUT, DEQ_BF16, TRANSPOSED, STAGED)),
        ], [PRODUCER_WARPS, 4], [PRODUCER_REGS, A1_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (idx_ptr, stride_ib, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                         part_o_ptr, part_lse_ptr, part_e_ptr, b, h0, H, split, num_splits,
                         t_begin, t_end,
                         lim, num_slots, qk_scale_log2, q_nope, q_rope, kv_nope, kv_rope,
                         p_t, q_bar, ready, empty, D_V, BLOCK_H, BLOCK_N, STAGES, SPLIT,
                         TRANSPOSED, STAGED)),
            (_producer, (q_ptr, stride_qb, stride_qh, kv_ptr, stride_kv,
                         scale_ptr, stride_scale, scale_off, rope_ptr, stride_rope, rope_off,
                         idx_ptr, stride_ib, b, h0, H, t_begin, t_end, lim, num_slots,
                         q_nope, q_rope, kv_nope, kv_rope, kv_raw, kv_scale, ids, q_bar,
                         ready, empty, D_V, D_ROPE, BLOCK_H, BLOCK_N, ROWS, STAGES,
                         PRODUCER_WARPS, IS_FP8, RAW_LAYOUT, SCALE_LAYOUT, Q_EARLY)),
        ], [PRODUCER_WARPS], [PRODUCER_REGS])


def ws_supported(q: torch.Tensor, kv_cache: torch.Tensor, d_v: int) -> Optional[str]:
    """Why the warp-specialised kernel cannot serve these inputs (one line), or None when it
    can: a CUDA device of compute capability 9.x, ``d_v`` a power of two in [128, 512] and
    ``d_qk - d_v`` = 64 (DeepSeek-V3.2's rope part) (the KV row format itself is checked by
    ``check_decode_inputs``), and 16-byte aligned rows, rope
    part and query rows (cp.async; fp8_ds_mla rows at d_v 512 have their rope part at byte 528,
    at d_v 256 at byte 264: not served). Not checked (it would read the cache): fp8_ds_mla
    tiles need scales below 2^8 (tile maxima below 448 x 256 = 114688), since the
    dequantization multiplies by the scale x 2^120 as a bf16 (:func:`_dequant_rows`); larger
    ones come out inf / NaN, where FlashMLA and the Triton kernel stay finite (BENCHMARKS 6x)."""
    if q.device.type != "cuda":
        return f"needs a CUDA device (tensors on {q.device})"
    major = torch.cuda.get_device_capability(q.device)[0]
    if major != 9:
        return f"needs compute capability 9.x (wgmma), this device has {major}.x"
    d_rope = q.shape[-1] - d_v
    if not (128 <= d_v <= 512 and d_v & (d_v - 1) == 0 and d_rope == WS_BLOCK_N):
        return (f"needs d_v a power of two in [128, 512] and d_qk - d_v = {WS_BLOCK_N} (a "
                f"stage's rope tile doubles as P's buffer), got d_v={d_v}, d_rope={d_rope}")
    # cp.async moves 16-byte vectors: rows, the query and the rope part 16-byte aligned
    row_bytes_ = kv_cache.stride(0) * kv_cache.element_size()
    rope_byte = d_v * 2 if kv_cache.dtype == torch.bfloat16 else fp8_ds_mla_offsets(d_v, d_rope)[1]
    if (row_bytes_ % 16 or rope_byte % 16 or kv_cache.data_ptr() % 16 or q.data_ptr() % 16
            or (q.stride(0) * 2) % 16 or (q.stride(1) * 2) % 16):
        return ("needs 16-byte aligned KV rows (stride and rope offset), query rows and base "
                f"pointers (cp.async); got a row stride of {row_bytes_} B, the rope part at byte "
                f"{rope_byte}, query strides {tuple(q.stride())}")
    return None


def block_heads(num_heads: int, kind: str) -> int:
    """Query heads one program serves for ``num_heads`` and KV rows of ``kind``: 16 or 32 (the
    transposed consumers, :func:`_consumer_t`) for at most ``_T_MAX_HEADS[kind]`` heads, else
    64 (more heads: several programs, a remainder padded with masked rows)."""
    t_max = _T_MAX_HEADS[kind]
    if num_heads <= min(16, t_max):
        return 16
    if num_heads <= t_max:
        return 32
    return WS_BLOCK_H


def shared_memory_bytes(kind: str, d_v: int, stages: int, block_h: int = WS_BLOCK_H) -> int:
    """Shared memory the kernel allocates, in bytes, besides the compiler's scratch (a few
    hundred bytes) and its mbarriers: the query block ``[block_h, d_v + 64]`` bf16, two tiles'
    slot ids (int32), P^T ``[64, block_h]`` bf16 when ``block_h`` < 64 (the transposed
    consumers), and ``stages`` stages of 64 tokens (bf16 rows: ``[64, d_v + 64]`` bf16;
    fp8_ds_mla rows: the NoPE bytes, the float32 scales and the bf16 rope part, plus one bf16
    ``[64, d_v]`` tile)."""
    q_block = block_h * (d_v + WS_BLOCK_N) * 2 + 2 * WS_BLOCK_N * 4
    if block_h < WS_BLOCK_H:
        q_block += WS_BLOCK_N * block_h * 2
    rope = WS_BLOCK_N * WS_BLOCK_N * 2
    if kind == "bf16":
        return q_block + stages * (WS_BLOCK_N * d_v * 2 + rope)
    return (q_block + WS_BLOCK_N * d_v * 2
            + stages * (WS_BLOCK_N * d_v + WS_BLOCK_N * (d_v // 128) * 4 + rope))


def sparse_mla_decode_ws(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                         sm_scale: float, d_v: int = 512, *, num_splits: Optional[int] = None,
                         stages: Optional[int] = None, num_sms: Optional[int] = None,
                         split_partials: str = WS_SPLIT_PARTIALS
                         ) -> Tuple[torch.Tensor, torch.Tensor, LaunchInfo]:
    """Sparse MQA decode over top-k gathered KV rows, warp-specialised (Hopper).

    Args and returns as :func:`backends.kernels.sparse_mla_decode.sparse_mla_decode_with_info`
    (``q [B, H, d_qk]`` bf16, ``kv_cache [num_slots, d_qk]`` bf16 or ``[num_slots, row_bytes]``
    uint8 fp8_ds_mla rows, ``indices [B, K]`` int32 ->
    ``out [B, H, d_v]`` bf16, ``lse [B, H]`` fp32 natural log, and the call's
    :class:`~backends.kernels.sparse_mla_decode.LaunchInfo`), within the limits of
    :func:`ws_supported` (ValueError naming the limit otherwise, before any launch).
    ``num_splits``: top-k splits (flash-decoding; default the same wave model);
    ``stages``: KV tiles in shared memory (default the most that fit, at most 3: 2 at d_qk 576
    with 64-head programs, 3 for fp8_ds_mla rows in 16-head programs; more than fit is a
    ValueError naming the bytes, :func:`shared_memory_bytes`; 1 serialises gather and MMAs);
    ``split_partials``: the partials of a split call (``sparse_mla_decode.SPLIT_PARTIALS``;
    ValueError otherwise): ``"float32"`` (FlashMLA's; the default), ``"float16"`` (each head's
    stored column range scaled by the power of two that puts its largest magnitude in [2^14,
    2^15), the exponents in a ``[B, H, S, ranges]`` float32 tensor, so any finite values keep
    fp16's 11 bits) or ``"bfloat16"``. The 16-bit ones are stored through shared
    memory as 16-byte vectors and read by the combine as int32 pairs, half the bytes of
    float32 ones. H200, fp8_ds_mla H128 top_k 2048, CUDA-graph replays (BENCHMARKS 6x): see
    there for the times against FlashMLA's; error from the float32 reference: fp16 partials
    within 0.5 % of the float32 partials' (which equals FlashMLA's), bf16 ones 1.02-1.05x with
    fp8_ds_mla rows and 1.25-1.29x with bf16 rows (6w).
    """
    part_dtype = split_partials_dtype(split_partials)
    if isinstance(q, torch.Tensor) and q.device.type != "cuda":
        raise ValueError(f"sparse_mla_decode_ws needs a CUDA device (tensors on {q.device}; the "
                         "Triton interpreter cannot run Gluon kernels)")
    kind, sm_scale = check_decode_inputs(q, kv_cache, indices, sm_scale, d_v)
    why = ws_supported(q, kv_cache, d_v)
    if why is not None:
        raise ValueError(f"sparse_mla_decode_ws {why}")
    if stages is not None and (not isinstance(stages, int) or isinstance(stages, bool)
                               or stages < 1):
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")
    bsz, num_heads, d_qk = q.shape
    block_h = block_heads(num_heads, kind)
    if stages is None:
        stages = max([s for s in (2, 3)
                      if shared_memory_bytes(kind, d_v, s, block_h) <= _SMEM_BUDGET] or [2])
    need = shared_memory_bytes(kind, d_v, stages, block_h)
    if need > _SMEM_BUDGET:
        most = max(s for s in range(1, 9)
                   if shared_memory_bytes(kind, d_v, s, block_h) <= _SMEM_BUDGET)
        raise ValueError(f"stages={stages} needs {need} bytes of shared memory for {kind} rows at "
                         f"d_v={d_v} and {block_h}-head programs; a program may have "
                         f"{_SMEM_BUDGET} (at most {most} stages)")
    top_k, num_slots = indices.shape[1], kv_cache.shape[0]
    plan = plan_splits(q, top_k, num_slots, d_v, block_h, WS_BLOCK_N, num_splits, num_sms,
                       part_dtype=part_dtype)
    out, lse, num_splits, _, part_o, part_lse = plan
    info = LaunchInfo(block_h, WS_BLOCK_N, 4 if kind == "fp8_ds_mla" else 8, stages,
                      max(num_splits, 1), "producer", True,
                      kernel="ws", split_partials=split_partials)
    if num_splits == 0:
        return out, lse, info
    num_head_blocks = -(-num_heads // block_h)
    # fp16 partials' exponents: a head's stored column range a split (the fp8 consumers each
    # store half of the V dims)
    part_e = (torch.empty((*part_lse.shape, 2 if kind == "fp8_ds_mla" else 1),
                          dtype=torch.float32, device=q.device)
              if num_splits > 1 and part_dtype == torch.float16 else None)
    kernel = _sparse_mla_decode_ws_fwd[(bsz * num_splits * num_head_blocks,)](
        *kernel_args(q, kv_cache, kind, indices, sm_scale, d_v, plan, num_head_blocks),
        part_e_ptr=part_lse if part_e is None else part_e,
        **_constexprs(kind, d_v, d_qk - d_v, stages, num_splits > 1, block_h,
                      part_dtype.itemsize == 2),
        num_warps=4 if kind == "fp8_ds_mla" else 8, maxnreg=_MAXNREG,
    )
    if num_splits > 1:
        combine_splits(part_o, part_lse, out, lse, part_e)
    n_regs, n_spills = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)
    return out, lse, replace(info, n_regs=None if n_regs is None else int(n_regs),
                             n_spills=None if n_spills is None else int(n_spills),
                             smem_bytes=getattr(getattr(kernel, "metadata", None), "shared", None))


def _constexprs(kind: str, d_v: int, d_rope: int, stages: int, split: bool,
                block_h: int = WS_BLOCK_H, half_partials: bool = False) -> dict:
    """The kernel's compile-time arguments for KV rows of ``kind``: the fp8 layouts cover a
    row's ``d_v / 128`` scale groups of 128 bytes with 16-byte vectors (producer: 4 warps, a
    token's groups a warp; consumers' dequantization: a warpgroup, 8 tokens x 64 bytes a warp). The
    stages hold the bytes group-major (``[G][tokens][128]``) with each token's 16-byte vectors
    XORed by the token (mod 8), so those reads, and the dequantized stores (8 rows of one
    128-byte column block of the bf16 tile a warp), are free of bank conflicts. Measured on the
    H200 (BENCHMARKS 6p, fp8_ds_mla rows, top_k 2048): B128 H128 240.4 us against 246.5 for
    unswizzled rows read a token x 512 bytes a warp (whose stores hit the same offsets of 8
    column blocks), B128 H16 104.0 against 111.2, B8 33.3 against 32.4."""
    g = d_v // 128
    tpw_g = min(4, g)
    return dict(D_V=d_v, D_ROPE=d_rope, BLOCK_H=block_h, BLOCK_N=WS_BLOCK_N, STAGES=stages,
                TRANSPOSED=block_h < WS_BLOCK_H,
                P_COLS=block_h if block_h < WS_BLOCK_H else 8,
                ROWS=_ROWS[kind], SPLIT=split, PRODUCER_WARPS=_PRODUCER_WARPS,
                PRODUCER_REGS=_PRODUCER_REGS[kind], IS_FP8=kind == "fp8_ds_mla",
                RAW_LAYOUT=gl.BlockedLayout([1, 1, 16], [32 // (8 * tpw_g), tpw_g, 8],
                                            [_PRODUCER_WARPS, 1, 1], [2, 1, 0]),
                SCALE_LAYOUT=gl.BlockedLayout([1, 1], [32 // tpw_g, tpw_g],
                                              [_PRODUCER_WARPS, 1], [1, 0]),
                DEQ_ROWS=_DEQ_ROWS, DEQ_BF16=_DEQ_BF16, A1_REGS=_A1_REGS, Q_EARLY=_Q_EARLY,
                STAGED=_STAGED_STORE and (not split or half_partials),
                DEQ_LAYOUT=gl.BlockedLayout([1, 1, 16], [8, 1, 4], [2, 1, 2], [2, 0, 1]),
                RAW_SMEM=gl.SwizzledSharedLayout(16, 1, 8, [2, 0, 1]),
                SCALE_SMEM=gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


def compile_for_sm90(kind: str = "bf16", *, d_v: int = 512, d_rope: int = 64, stages: int = 2,
                     split: bool = False, block_h: int = WS_BLOCK_H,
                     split_partials: str = WS_SPLIT_PARTIALS):
    """The kernel compiled by the installed Triton for sm_90a without a GPU (a
    ``triton.compiler.CompiledKernel``: ``asm["ttgir" | "ptx" | "cubin"]``,
    ``metadata.shared`` in bytes) for KV rows of ``kind`` (``"bf16"`` or ``"fp8_ds_mla"``), with
    the divisibility Triton specialises for contiguous DeepSeek-V3.2-sized tensors. For
    inspecting what the compiler makes of it, not for running it."""
    from backends.kernels.compile_target import compile_for_target
    const = _constexprs(kind, d_v, d_rope, stages, split, block_h, split_partials != "float32")
    fp8 = kind == "fp8_ds_mla"
    ptrs = dict(q_ptr="*bf16", kv_ptr="*u8" if fp8 else "*bf16",
                scale_ptr="*fp32" if fp8 else "*bf16", rope_ptr="*bf16", idx_ptr="*i32",
                out_ptr="*bf16", lse_ptr="*fp32", part_lse_ptr="*fp32", part_e_ptr="*fp32",
                part_o_ptr={"bfloat16": "*bf16", "float16": "*fp16"}.get(split_partials, "*fp32"))
    div16 = {"stride_qb", "stride_qh", "stride_kv", "stride_ib", "stride_ob", "stride_oh",
             "stride_lb", "H", "K"} | (set() if fp8 else {"stride_rope"})
    return compile_for_target(_sparse_mla_decode_ws_fwd, const, ptrs, div16,
                              floats=["qk_scale_log2"], gluon=True,
                              num_warps=4 if fp8 else 8, maxnreg=_MAXNREG)
