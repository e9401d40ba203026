"""Triton sparse MLA decode (DeepSeek-V3.2 DSA): MQA attention over top-k gathered KV rows.

Semantics (plain torch version: ``harness.reference.sparse_mla_decode_ref``): for each batch
row ``b`` and query head ``h``,

    s_j   = sm_scale * q[b, h, :] . kv[indices[b, j], :d_qk]     for valid j
    out   = sum_j softmax(s)_j * kv[indices[b, j], :d_v]          (bf16)
    lse   = log(sum_j exp(s_j))                                   (float32, natural log)

An index outside ``[0, num_slots)`` (in practice -1) is masked; duplicates count as many times
as they appear; a row with no valid index gives ``out = 0`` and ``lse = +inf``. There is one
latent KV head shared by all query heads (MQA), and V is the first ``d_v`` dims of each row.

Design
------
* One program = one batch row x one block of ``block_h`` query heads x one split of the
  top-k list. It keeps ``q`` for its heads on chip, walks its share of the top-k list in tiles
  of ``block_n`` tokens, gathers each KV tile once and uses it twice: as K for
  ``S = q k^T`` (two ``tl.dot``: the NoPE/V part and the rope part) and as V for
  ``acc += P V``, with a base-2 online softmax in float32.
* ``fp8_ds_mla`` rows are dequantized inside the kernel, right after the gather: the fp8
  bytes are reinterpreted as float8e4nv, widened, multiplied by their tile's fp32 scale
  (each 128 values share one scale, broadcast through a reshape to
  ``[block_n, d_v/128, 128]``) and rounded to the MMA operand type; the rope part is read as
  bf16 from the same row. The fp8 row is read through typed views of one uint8 buffer, so
  the kernel needs no pointer casts.
* The gather of tile ``t`` depends on loading its slot ids first; by default (``prefetch``)
  the slot ids of tile ``t + 1`` are loaded during tile ``t``, and Triton's pipelining
  (``num_stages``) overlaps the row loads with the MMAs.
* Flash-decoding: the top-k list is cut into ``num_splits`` contiguous chunks of tiles so a
  small batch still fills the GPU. With one split the kernel writes ``out``/``lse`` directly;
  with more it writes per-split float32 ``(o / l, lse)`` and a combine kernel merges them.
  The number of splits comes from a wave model (:func:`choose_num_splits`).
* What Triton 3.6 makes of it for sm_90a (``triton.compile`` + ``ptxas -v``, no timing): with
  64 heads on 8 warps a QK dot chained into the PV dot gets all 8 warps along M, so both
  warpgroups would compute the same ``S`` (the QK MMAs run twice) while the PV dot splits the
  512 V dims between them. ``split_scores`` (the default at 64 heads a program) hides the chain
  from that heuristic (the comment in the main loop): each warpgroup computes ``S`` for half
  the tokens, 40 instead of 76 wgmma instructions a tile, no spills, 224 KB of shared memory
  for bf16 rows (P's exchange and the cross-warpgroup row max cost 8 KB). At
  ``num_stages=2`` the gather of tile ``t + 1`` is issued after tile ``t``'s MMAs and waited
  for at the top of the next iteration (no overlap beyond the asynchronous PV MMA), from 3
  stages on one or more tiles stay in flight. A 64-token bf16 tile fits only 2 stages beside
  the 72 KB of ``q``, fp8_ds_mla rows 3: with ``split_scores`` 231424 bytes (189440 at 2
  stages), since the rope part of K goes through registers so that the copy its MMA reads
  shares P's shared memory (the comment in the main loop; 239616 bytes without that). With the
  1 KB of static shared memory in the compiled kernel (``cuobjdump -res-usage``) that is all
  of the 227 KB a program may have: the driver takes the dynamic part up to 227 KB less the
  static one. 32- and 16-token tiles fit 4 and 6.
  :func:`sparse_mla_decode_with_info` returns the resolved launch and the compiled kernel's
  registers, spills and shared memory (``harness/bench/attention.py --tune`` sweeps them).
* MMA operands are bf16 on the GPU (as FlashMLA). The Triton interpreter cannot multiply
  bf16 operands in ``tl.dot`` (triton-lang/triton#11584: it multiplies the raw uint16 bit
  patterns), so under ``TRITON_INTERPRET=1`` the same kernel is instantiated with fp16
  operands (``mma_dtype``); every other step is the same code. fp16 has more mantissa than
  bf16, but less range: use it on the GPU only for data whose magnitudes stay below 65504.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from backends.kernels.kv_format import (FP8_TILE, fp8_ds_mla_offsets, kv_dtype_of, row_alignment,
                                        row_bytes)

__all__ = ["sparse_mla_decode", "sparse_mla_decode_with_info", "compile_for_arch", "LaunchInfo",
           "choose_num_splits", "DEFAULT_NUM_SMS", "check_decode_inputs", "plan_splits",
           "combine_splits", "kernel_args"]

#: multiprocessors of an H200; used to plan splits when the tensors are not on a GPU
DEFAULT_NUM_SMS = 132

_LOG2E = 1.4426950408889634
_PREFETCH_MODES = {"none": 0, "index": 1, "rows": 2}


@triton.jit
def _tile_rows(idx_row, t, lim, num_slots, BLOCK_N: tl.constexpr):
    """Slot ids of tile ``t`` of the top-k list: ``valid [BLOCK_N]`` and ``row [BLOCK_N]`` int64
    (0 where not valid). Tokens at or past ``lim`` and ids outside ``[0, num_slots)`` are masked."""
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_row + offs_n, mask=offs_n < lim, other=-1)
    valid = (idx >= 0) & (idx < num_slots)
    row = tl.where(valid, idx, 0).to(tl.int64)
    return valid, row


@triton.jit
def _gather_nope(valid, row, kv_ptr, stride_kv, scale_ptr, stride_scale, scale_off,
                 D_V: tl.constexpr, D_V_PAD: tl.constexpr, G: tl.constexpr,
                 IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr):
    """Gathers the NoPE/V part of one tile's KV rows, not yet dequantized: ``nope [BLOCK_N,
    D_V_PAD]`` (bf16 values, or the fp8 bytes as uint8) and ``scales [BLOCK_N, G]`` fp32 (fp8
    only; zeros for bf16); masked rows and padding columns are 0."""
    offs_v = tl.arange(0, D_V_PAD)
    if D_V_PAD == D_V:
        nope_mask = valid[:, None]
    else:
        nope_mask = valid[:, None] & (offs_v[None, :] < D_V)
    nope = tl.load(kv_ptr + row[:, None] * stride_kv + offs_v[None, :], mask=nope_mask, other=0)
    offs_g = tl.arange(0, G)
    if IS_FP8:
        scales = tl.load(scale_ptr + row[:, None] * stride_scale + scale_off + offs_g[None, :],
                         mask=valid[:, None] & (offs_g[None, :] < D_V // 128), other=0.0)
    else:
        scales = tl.zeros([BLOCK_N, G], dtype=tl.float32)
    return nope, scales


@triton.jit
def _gather_rope(valid, row, rope_ptr, stride_rope, rope_off,
                 D_ROPE: tl.constexpr, D_ROPE_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                 ROPE_VEC: tl.constexpr):
    """Gathers the rope part of one tile's KV rows: ``rope [BLOCK_N, D_ROPE_PAD]`` bf16, masked
    rows and padding columns 0."""
    offs_r = tl.arange(0, D_ROPE_PAD)
    if D_ROPE > 0:
        rope_base = tl.multiple_of(row * stride_rope + rope_off, ROPE_VEC)
        rope = tl.load(rope_ptr + rope_base[:, None] + offs_r[None, :],
                       mask=valid[:, None] & (offs_r[None, :] < D_ROPE), other=0.0)
    else:
        rope = tl.zeros([BLOCK_N, D_ROPE_PAD], dtype=tl.bfloat16)
    return rope


@triton.jit
def _gather_rows(valid, row,
                 kv_ptr, stride_kv, scale_ptr, stride_scale, scale_off,
                 rope_ptr, stride_rope, rope_off,
                 D_V: tl.constexpr, D_V_PAD: tl.constexpr,
                 D_ROPE: tl.constexpr, D_ROPE_PAD: tl.constexpr, G: tl.constexpr,
                 IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr, ROPE_VEC: tl.constexpr):
    """Gathers the raw (not yet dequantized) KV rows of one tile: ``nope`` and ``scales`` of
    :func:`_gather_nope` and ``rope`` of :func:`_gather_rope`."""
    nope, scales = _gather_nope(valid, row, kv_ptr, stride_kv, scale_ptr, stride_scale,
                                scale_off, D_V, D_V_PAD, G, IS_FP8, BLOCK_N)
    rope = _gather_rope(valid, row, rope_ptr, stride_rope, rope_off, D_ROPE, D_ROPE_PAD,
                        BLOCK_N, ROPE_VEC)
    return nope, scales, rope


@triton.jit
def _scores(q_nope, q_rope, kv, rope, valid, qk_scale_log2,
            D_ROPE: tl.constexpr, MMA_DTYPE: tl.constexpr, SPLIT_SCORES: tl.constexpr):
    """Base-2 scores ``[BLOCK_H, BLOCK_N]`` fp32 of one tile, masked tokens -inf.

    ``SPLIT_SCORES``: the NoPE and rope products stay two separate dots (one accumulating into
    the other would chain them; see the comment at the online softmax in the main loop), each
    scaled before anything else reads it (Triton's Hopper software pipeliner fails when an MMA
    result is first used inside a branch)."""
    if SPLIT_SCORES:
        s = tl.dot(q_nope, tl.trans(kv)) * qk_scale_log2
        if D_ROPE > 0:
            s += tl.dot(q_rope, tl.trans(rope.to(MMA_DTYPE))) * qk_scale_log2
    else:
        s = tl.dot(q_nope, tl.trans(kv))
        if D_ROPE > 0:
            s = tl.dot(q_rope, tl.trans(rope.to(MMA_DTYPE)), acc=s)
        s = s * qk_scale_log2
    return tl.where(valid[None, :], s, float("-inf"))


@triton.jit
def _online_softmax(s, m_i, l_i, FIRST: tl.constexpr):
    """One base-2 online-softmax step over the scores ``s [BLOCK_H, BLOCK_N]``: the new running
    max ``m_new`` and sum ``l_new`` ``[BLOCK_H]``, the factor ``alpha [BLOCK_H]`` that rescales
    what was accumulated so far, and ``p = exp2(s - m) [BLOCK_H, BLOCK_N]`` (all fp32).
    ``FIRST``: the split's first tile (``m_i = -inf``, ``l_i = 0``), nothing to rescale."""
    if FIRST:
        m_new = tl.max(s, 1)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # no valid key yet: keep p = 0
    p = tl.exp2(s - m_use[:, None])
    if FIRST:
        alpha = tl.zeros_like(m_i)
        l_new = tl.sum(p, 1)
    else:
        alpha = tl.exp2(m_i - m_use)
        l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, alpha, p


@triton.jit
def _sparse_mla_decode_fwd(
    q_ptr, stride_qb, stride_qh,            # q [B, H, D_QK] bf16, unit last-dim stride
    kv_ptr, stride_kv,                      # bf16 rows [N, D_QK], or fp8_ds_mla bytes [N, RB] uint8
    scale_ptr, stride_scale, scale_off,     # fp8: float32 view of the rows; scales at [scale_off, +D_V/128)
    rope_ptr, stride_rope, rope_off,        # rope values: bf16 view of the rows, starting at rope_off
    idx_ptr, stride_ib,                     # indices [B, K] int32, unit last-dim stride
    out_ptr, stride_ob, stride_oh,          # out [B, H, D_V] bf16          (not SPLIT)
    lse_ptr, stride_lb,                     # lse [B, H] fp32               (not SPLIT)
    part_o_ptr, part_lse_ptr,               # [B, H, S, D_V] / [B, H, S] fp32 (SPLIT)
    H, K, num_slots, num_splits, tiles_per_split, num_head_blocks,
    qk_scale_log2,                          # sm_scale * log2(e)
    D_V: tl.constexpr, D_V_PAD: tl.constexpr,
    D_ROPE: tl.constexpr, D_ROPE_PAD: tl.constexpr,
    G: tl.constexpr,                        # fp8 scale tiles per padded row: D_V_PAD // 128 (>= 1)
    IS_FP8: tl.constexpr, SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,                 # 0: none, 1: slot ids of tile t+1, 2: rows of tile t+1
    SPLIT_SCORES: tl.constexpr,             # S once per tile, tokens split across warpgroups
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ROPE_VEC: tl.constexpr,
    MMA_DTYPE: tl.constexpr,
):
    # program -> (head block, split, batch row); head blocks of one (row, split) are adjacent in
    # launch order so the KV rows they all gather are read from HBM once and then hit in L2.
    pid = tl.program_id(0)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    b = rest // num_splits

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    offs_v = tl.arange(0, D_V_PAD)
    offs_r = tl.arange(0, D_ROPE_PAD)

    q_row = q_ptr + b.to(tl.int64) * stride_qb + offs_h[:, None].to(tl.int64) * stride_qh
    if D_V_PAD == D_V:
        q_nope = tl.load(q_row + offs_v[None, :], mask=h_ok[:, None], other=0.0)
    else:
        q_nope = tl.load(q_row + offs_v[None, :], mask=h_ok[:, None] & (offs_v[None, :] < D_V), other=0.0)
    q_nope = q_nope.to(MMA_DTYPE)
    q_rope = tl.load(q_row + D_V + offs_r[None, :],
                     mask=h_ok[:, None] & (offs_r[None, :] < D_ROPE), other=0.0).to(MMA_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_V_PAD], dtype=tl.float32)

    n_tiles = tl.cdiv(K, BLOCK_N)
    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_tiles)
    lim = tl.minimum(K, t_end * BLOCK_N)        # this split's tokens end here
    idx_row = idx_ptr + b.to(tl.int64) * stride_ib
    if PREFETCH >= 1:
        n_valid, n_row = _tile_rows(idx_row, t_begin, lim, num_slots, BLOCK_N)
    if PREFETCH == 2:
        n_nope, n_scales, n_rope = _gather_rows(
            n_valid, n_row, kv_ptr, stride_kv, scale_ptr, stride_scale, scale_off,
            rope_ptr, stride_rope, rope_off,
            D_V, D_V_PAD, D_ROPE, D_ROPE_PAD, G, IS_FP8, BLOCK_N, ROPE_VEC)
    for t in range(t_begin, t_end):
        # ---- gather tile t (or take it from the prefetch and start on tile t + 1) ----
        if PREFETCH == 0:
            valid, row = _tile_rows(idx_row, t, lim, num_slots, BLOCK_N)
        else:
            valid, row = n_valid, n_row
            n_valid, n_row = _tile_rows(idx_row, t + 1, lim, num_slots, BLOCK_N)
        if PREFETCH == 2:
            nope, scales, rope = n_nope, n_scales, n_rope
            n_nope, n_scales, n_rope = _gather_rows(
                n_valid, n_row, kv_ptr, stride_kv, scale_ptr, stride_scale, scale_off,
                rope_ptr, stride_rope, rope_off,
                D_V, D_V_PAD, D_ROPE, D_ROPE_PAD, G, IS_FP8, BLOCK_N, ROPE_VEC)
        else:
            nope, scales = _gather_nope(valid, row, kv_ptr, stride_kv, scale_ptr, stride_scale,
                                        scale_off, D_V, D_V_PAD, G, IS_FP8, BLOCK_N)
            if not (IS_FP8 and SPLIT_SCORES):
                rope = _gather_rope(valid, row, rope_ptr, stride_rope, rope_off, D_ROPE,
                                    D_ROPE_PAD, BLOCK_N, ROPE_VEC)

        # ---- the KV tile as MMA operand [BLOCK_N, D_V_PAD]: K-NoPE and V at once ----
        if IS_FP8:
            vals = nope.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            vals = tl.reshape(vals, [BLOCK_N, G, D_V_PAD // G]) * scales[:, :, None]
            kv = tl.reshape(vals, [BLOCK_N, D_V_PAD]).to(MMA_DTYPE)
        else:
            kv = nope.to(MMA_DTYPE)

        # ---- fp8 rows with split_scores: the rope part of K through registers ----
        if IS_FP8 and SPLIT_SCORES:
            # The same bits, through registers (the bitcasts): a load that feeds an MMA
            # directly gets one pipeline buffer more than a load read into registers (3 x 8 KB
            # instead of 2 at 3 stages), and the copy the MMA then reads is a value of its own
            # whose shared memory P's reuses (they are not alive at once): 3 stages of 64-token
            # fp8 tiles fit the H200 (231424 bytes instead of 239616). Gathered after the
            # dequantization since the pipeliner reads a load out of shared memory where the
            # load stands (held across the dequantization, the rope tile spills 8 bytes at 3
            # stages). Without the split nothing shares the copy's memory, and it spills.
            if PREFETCH != 2:
                rope = _gather_rope(valid, row, rope_ptr, stride_rope, rope_off, D_ROPE,
                                    D_ROPE_PAD, BLOCK_N, ROPE_VEC)
            rope = rope.to(tl.int16, bitcast=True).to(tl.bfloat16, bitcast=True)

        s = _scores(q_nope, q_rope, kv, rope, valid, qk_scale_log2, D_ROPE, MMA_DTYPE,
                    SPLIT_SCORES)

        # ---- online softmax (base 2) ----
        if SPLIT_SCORES:
            # Triton gives a dot whose result reaches another dot in the same block (S -> P ->
            # PV) all warps along M, so with 64 heads on two warpgroups both would compute all
            # of S. Its analysis stops at a branch's yield: with S reaching the PV dot only
            # through the values this branch yields, S gets a layout of its own (the tokens
            # split across the warpgroups) and P reaches the PV dot through shared memory, as
            # FlashMLA shares P between its warpgroups.
            if t == t_begin:
                m_new, l_i, alpha, p = _online_softmax(s, m_i, l_i, True)
            else:
                m_new, l_i, alpha, p = _online_softmax(s, m_i, l_i, False)
        else:
            m_new, l_i, alpha, p = _online_softmax(s, m_i, l_i, False)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(MMA_DTYPE), kv, acc=acc)
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse2 = m_i + tl.log2(l_safe)                               # base-2 log-sum-exp
    if SPLIT:
        # partial results of this split: normalised o and its natural-log lse (-inf if empty)
        bh = (b * H + offs_h).to(tl.int64)
        part_row = (bh * num_splits + split)
        tl.store(part_o_ptr + part_row[:, None] * D_V + offs_v[None, :], o,
                 mask=h_ok[:, None] & (offs_v[None, :] < D_V))
        tl.store(part_lse_ptr + part_row, tl.where(has, lse2 * 0.6931471805599453, float("-inf")),
                 mask=h_ok)
    else:
        o_row = out_ptr + b.to(tl.int64) * stride_ob + offs_h[:, None].to(tl.int64) * stride_oh
        tl.store(o_row + offs_v[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=h_ok[:, None] & (offs_v[None, :] < D_V))
        tl.store(lse_ptr + b.to(tl.int64) * stride_lb + offs_h,
                 tl.where(has, lse2 * 0.6931471805599453, float("inf")), mask=h_ok)


@triton.jit
def _sparse_mla_decode_combine(
    part_o_ptr, part_lse_ptr,               # [B, H, S, D_V] fp32 (or int32 pairs) / [B, H, S] fp32
    part_e_ptr,                             # [B, H, S, NCH] fp32 exponents (SCALED)
    out_ptr, stride_ob, stride_oh,          # out [B, H, D_V] bf16 (or int32 pairs)
    lse_ptr, stride_lb,                     # lse [B, H] fp32
    H, num_splits,
    D_V: tl.constexpr, S_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PAIRS: tl.constexpr,
    SCALED: tl.constexpr, NCH: tl.constexpr,
):
    """One program per (batch row x head, ``BLOCK_D`` columns of V): every split's partial of
    those columns loaded at once (``[S_PAD, BLOCK_D]``), weighted by ``exp(lse_s - max)``.
    ``PAIRS``: 16-bit partials read as int32 words of two columns each (``part_o_ptr`` an int32
    view ``[B, H, S, D_V / 2]``; the even column in the low half), widened to float32 (bf16 by
    shifts, fp16 by conversions), and the output written as such words (``out_ptr`` an int32 view, its strides in
    words), so that loads, sums and stores keep the float32 partials' layout (loaded as bf16,
    Triton laid them out 8 a thread and moved them to the sum's layout through shared memory;
    BENCHMARKS 6w). ``SCALED``: the pairs are fp16, each row's ``NCH`` column ranges of a split
    stored divided by ``2^e`` (``e`` in ``part_e``, a float), which joins the split's weight in
    the sum (not the sum of weights): one a split where the program's columns lie in one range,
    else one a word (summed a range at a time, the ranges' loads and stores were serialised:
    B8-B32 up to 10 us slower, BENCHMARKS 6x)."""
    pid = tl.program_id(0)                  # = b * H + h
    b = pid // H
    h = pid % H
    base = pid.to(tl.int64) * num_splits
    offs_s = tl.arange(0, S_PAD)
    s_ok = offs_s < num_splits
    lse_s = tl.load(part_lse_ptr + base + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_use)
    total = tl.sum(w, 0)
    has = total > 0.0
    denom = tl.where(has, total, 1.0)
    o_row = out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    if PAIRS:
        offs_p = tl.program_id(1) * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
        p_ok = offs_p < D_V // 2
        word = tl.load(part_o_ptr + (base + offs_s)[:, None] * (D_V // 2) + offs_p[None, :],
                       mask=s_ok[:, None] & p_ok[None, :], other=0)
        if SCALED:
            lo = word.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (word >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            if (D_V // NCH) % BLOCK_D == 0:
                # the program's columns lie in one range: its 2^e a split
                rng = tl.minimum(tl.program_id(1) * BLOCK_D, D_V - 1) // (D_V // NCH)
                e = tl.load(part_e_ptr + (base + offs_s) * NCH + rng, mask=s_ok, other=0.0)
                w_o = (w * tl.exp2(e))[:, None]
            else:
                # a weight a word: its range's 2^e a split
                rng = (offs_p * 2) // (D_V // NCH)
                w_o = tl.zeros([S_PAD, BLOCK_D // 2], dtype=tl.float32)
                for j in tl.static_range(NCH):
                    e_j = tl.load(part_e_ptr + (base + offs_s) * NCH + j, mask=s_ok, other=0.0)
                    w_o = tl.where(rng[None, :] == j, (w * tl.exp2(e_j))[:, None], w_o)
        else:
            w_o = w[:, None]
            lo = (word << 16).to(tl.float32, bitcast=True)
            hi = (word & -65536).to(tl.float32, bitcast=True)
        even = tl.sum(w_o * lo, 0) / denom
        odd = tl.sum(w_o * hi, 0) / denom
        # rounded to bf16 and packed two to a word again, in the layout they were summed in
        even = even.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 65535
        odd = odd.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        tl.store(o_row + offs_p, even | (odd << 16), mask=p_ok)
    else:
        offs_v = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        o = tl.load(part_o_ptr + (base + offs_s)[:, None] * D_V + offs_v[None, :],
                    mask=s_ok[:, None] & (offs_v[None, :] < D_V), other=0.0)
        out = tl.sum(w[:, None] * o, 0) / denom
        tl.store(o_row + offs_v, out.to(out_ptr.dtype.element_ty), mask=offs_v < D_V)
    if tl.program_id(1) == 0:
        tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h,
                 tl.where(has, m_use + tl.log(denom), float("inf")))


def choose_num_splits(batch: int, num_heads: int, top_k: int, *, block_h: int = 64,
                      block_n: int = 64, num_sms: int = DEFAULT_NUM_SMS, d_v: int = 512,
                      max_splits: int = 64, partial_bytes: int = 4) -> int:
    """Number of top-k splits that minimises a simple wave model of the decode.

    The main kernel runs ``batch * ceil(num_heads / block_h) * s`` programs, about one per
    multiprocessor at a time (it holds a ``[block_h, d_v]`` float32 accumulator and large
    shared-memory tiles); each program costs ``ceil(n_tiles / s)`` KV tiles plus a fixed
    prologue/epilogue of about 1.5 tiles (loading q, writing out). The run time is then
    ``waves * per-program cost``. Splitting adds the combine: about 1.5 tiles of launch cost
    plus writing and re-reading the partials (``batch * heads * s * d_v * 2 * partial_bytes``
    bytes),
    priced with a tile at ~3.9 us (a 64x64-head x 64-token tile at ~2.3 TFLOP/s per SM) and
    HBM at ~4 TB/s. Ties go to fewer splits.

    Args:
        batch, num_heads, top_k: problem size (``top_k`` = columns of ``indices``).
        block_h, block_n: the kernel's head block and token tile.
        num_sms: multiprocessors of the device (132 on the H200).
        d_v: V width (sizes the partials).
        max_splits: upper bound on the result.
        partial_bytes: bytes of one partial value (4: float32; 2: the warp-specialised
            kernel's ``split_partials="float16"`` / ``"bfloat16"``).

    Returns:
        An int in ``[1, min(max_splits, ceil(top_k / block_n))]``.
    """
    for name, v in (("batch", batch), ("num_heads", num_heads), ("top_k", top_k),
                    ("block_h", block_h), ("block_n", block_n), ("num_sms", num_sms),
                    ("d_v", d_v), ("max_splits", max_splits), ("partial_bytes", partial_bytes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return _choose_num_splits(batch, num_heads, top_k, block_h, block_n, num_sms, d_v, max_splits,
                              partial_bytes)


@functools.lru_cache(maxsize=1024)
def _choose_num_splits(batch, num_heads, top_k, block_h, block_n, num_sms, d_v, max_splits,
                       partial_bytes=4) -> int:
    n_tiles = -(-top_k // block_n)
    base = batch * -(-num_heads // block_h)
    tile_us = 3.9 * (block_h / 64.0) * (block_n / 64.0)
    best, best_cost = 1, math.inf
    for s in range(1, min(max_splits, n_tiles) + 1):
        tps = -(-n_tiles // s)
        if -(-n_tiles // tps) != s:
            continue                      # same work cut as a smaller s
        waves = -(-(base * s) // num_sms)
        cost = waves * (tps + 1.5) * tile_us
        if s > 1:
            moved = batch * num_heads * s * d_v * 2 * partial_bytes     # written and read
            cost += 1.5 * tile_us + moved / 4.0e6   # bytes / (4 TB/s) in us
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


@functools.lru_cache(maxsize=64)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _is_pow2(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class LaunchInfo:
    """How one ``sparse_mla_decode`` call ran: its launch configuration after defaults and
    clamping, and what the compiler made of the main kernel.

    ``num_splits`` is the split count actually launched (the requested or heuristic one, cut so
    that every split has a tile). ``n_regs`` (registers per thread), ``n_spills`` (Triton's
    spill count: the kernel's local memory in 4-byte words) and ``smem_bytes`` (shared memory
    per program) describe the compiled main kernel; they are None where nothing was compiled
    (the Triton interpreter, or an empty top-k). ``kernel`` is ``"triton"`` (this module's
    kernel) or ``"ws"`` (the warp-specialised Gluon kernel of
    :mod:`backends.kernels.sparse_mla_decode_ws`: 64-head, 64-token tiles, 8 consumer warps
    and a producer warpgroup; ``prefetch`` is ``"producer"`` there). ``split_partials`` is
    the dtype of a split call's partials (``"float32"``, or ``"float16"`` / ``"bfloat16"``
    for the ws kernel; none are written with one split).
    """

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int
    prefetch: str
    split_scores: bool = False
    n_regs: Optional[int] = None
    n_spills: Optional[int] = None
    smem_bytes: Optional[int] = None
    kernel: str = "triton"
    split_partials: str = "float32"

    def launch_kwargs(self) -> dict:
        """The keyword arguments of ``sparse_mla_decode`` that repeat this launch."""
        if self.kernel == "ws":
            return {"kernel": "ws", "num_stages": self.num_stages, "num_splits": self.num_splits,
                    "split_partials": self.split_partials}
        return {"block_h": self.block_h, "block_n": self.block_n, "num_warps": self.num_warps,
                "num_stages": self.num_stages, "num_splits": self.num_splits,
                "prefetch": self.prefetch, "split_scores": self.split_scores}


def _resolve_launch(kind: str, num_heads: int, block_h, block_n, num_warps, num_stages,
                    split_scores, prefetch):
    """``(block_h, num_stages, split_scores, prefetch)`` with the defaults of
    :func:`sparse_mla_decode_with_info` filled in; ValueError naming a bad option."""
    if block_h is None:
        padded = kind == "fp8_ds_mla" and num_heads >= 16
        block_h = 64 if num_heads >= 64 or padded else max(16, triton.next_power_of_2(num_heads))
    if not _is_pow2(block_h) or block_h < 16:
        raise ValueError(f"block_h must be a power of two >= 16, got {block_h!r}")
    if not _is_pow2(block_n) or block_n < 16:
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n!r}")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps!r}")
    if split_scores is None:
        split_scores = block_h >= 64
    if not isinstance(split_scores, bool):
        raise ValueError(f"split_scores must be True, False or None, got {split_scores!r}")
    if num_stages is None:
        num_stages = 3 if kind == "fp8_ds_mla" else 2
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    if prefetch is None:
        prefetch = "index"
    if prefetch not in _PREFETCH_MODES:
        raise ValueError(f"prefetch must be one of {tuple(_PREFETCH_MODES)} or None, got {prefetch!r}")
    return block_h, num_stages, split_scores, prefetch


def _row_views(kind: str, row_stride: int, d_v: int, d_rope: int) -> Tuple[int, int, int, int]:
    """``(stride_scale, scale_off, stride_rope, rope_off)`` of KV rows ``row_stride`` elements
    apart (bf16 values, or fp8_ds_mla bytes): the fp8 scales as a float32 view (0, 0 for bf16
    rows) and the rope values as a bf16 view, in elements of those views."""
    if kind == "bf16":
        return 0, 0, row_stride, d_v
    scales_start, rope_start, _ = fp8_ds_mla_offsets(d_v, d_rope)
    return row_stride // 4, scales_start // 4, row_stride // 2, rope_start // 2


def kernel_args(q: torch.Tensor, kv_cache: torch.Tensor, kind: str, indices: torch.Tensor,
                sm_scale: float, d_v: int, plan: tuple, num_head_blocks: int) -> tuple:
    """The positional arguments both decode kernels take, in their order: the query, the KV
    rows with the fp8 scales as a float32 view and the rope values as a bf16 view (for bf16 rows
    the rows themselves), each with its row stride and offset in elements of its view, the
    indices, the outputs and per-split partials of ``plan`` (:func:`plan_splits`'s tuple), the
    sizes, and ``sm_scale * log2(e)``."""
    out, lse, num_splits, tiles_per_split, part_o, part_lse = plan
    stride_scale, scale_off, stride_rope, rope_off = _row_views(kind, kv_cache.stride(0), d_v,
                                                                q.shape[2] - d_v)
    if kind == "bf16":
        scales, rope = kv_cache, kv_cache
    else:
        scales, rope = kv_cache.view(torch.float32), kv_cache.view(torch.bfloat16)
    return (q, q.stride(0), q.stride(1),
            kv_cache, kv_cache.stride(0), scales, stride_scale, scale_off,
            rope, stride_rope, rope_off,
            indices, indices.stride(0),
            out, out.stride(0), out.stride(1),
            lse, lse.stride(0),
            part_o, part_lse,
            q.shape[1], indices.shape[1], kv_cache.shape[0], num_splits, tiles_per_split,
            num_head_blocks, sm_scale * _LOG2E)


def _constexprs(kind: str, d_v: int, d_rope: int, stride_rope: int, rope_off: int, split: bool,
                prefetch: str, split_scores: bool, block_h: int, block_n: int,
                mma_dtype: torch.dtype) -> dict:
    """The main kernel's compile-time arguments."""
    d_v_pad = triton.next_power_of_2(d_v)
    return dict(D_V=d_v, D_V_PAD=d_v_pad, D_ROPE=d_rope,
                D_ROPE_PAD=max(16, triton.next_power_of_2(d_rope)) if d_rope > 0 else 16,
                G=max(1, d_v_pad // FP8_TILE), IS_FP8=(kind == "fp8_ds_mla"), SPLIT=split,
                PREFETCH=_PREFETCH_MODES[prefetch], SPLIT_SCORES=split_scores,
                BLOCK_H=block_h, BLOCK_N=block_n,
                ROPE_VEC=row_alignment(stride_rope, rope_off, cap=8),
                MMA_DTYPE=tl.bfloat16 if mma_dtype == torch.bfloat16 else tl.float16)


def compile_for_arch(kv_dtype: str, *, arch: int = 90, batch: int = 128, num_heads: int = 128,
                     top_k: int = 2048, d_v: int = 512, d_rope: int = 64,
                     block_h: Optional[int] = None, block_n: int = 64, num_warps: int = 8,
                     num_stages: Optional[int] = None, split_scores: Optional[bool] = None,
                     prefetch: Optional[str] = None):
    """The main kernel compiled by the installed Triton for CUDA compute capability ``arch``
    (default 90: sm_90a, the H200), without a GPU: a ``triton.compiler.CompiledKernel`` whose
    ``asm`` holds ``"ttgir"`` (the MMA layouts), ``"ptx"`` and ``"cubin"``, and whose
    ``metadata.shared`` is the shared memory per program in bytes. The launch options resolve
    as in :func:`sparse_mla_decode_with_info` (one split, bf16 MMA operands); the integer
    arguments carry the divisibility Triton specialises for contiguous ``[batch, num_heads,
    d_v + d_rope]`` queries, ``kv_dtype`` rows (``"bf16"`` or ``"fp8_ds_mla"``) and
    ``[batch, top_k]`` indices. For inspecting what the compiler makes of a launch (e.g.
    ``split_scores``), not for running it."""
    from backends.kernels.compile_target import compile_for_target

    if kv_dtype not in ("bf16", "fp8_ds_mla"):
        raise ValueError(f"kv_dtype must be 'bf16' or 'fp8_ds_mla', got {kv_dtype!r}")
    if _interpreting():
        raise ValueError("compile_for_arch compiles the kernel: import this module with "
                         "TRITON_INTERPRET unset (here it is 1: the kernels are interpreted)")
    block_h, num_stages, split_scores, prefetch = _resolve_launch(
        kv_dtype, num_heads, block_h, block_n, num_warps, num_stages, split_scores, prefetch)
    d_qk = d_v + d_rope
    row_stride = d_qk if kv_dtype == "bf16" else row_bytes("fp8_ds_mla", d_v, d_rope)
    stride_scale, scale_off, stride_rope, rope_off = _row_views(kv_dtype, row_stride, d_v, d_rope)
    const = _constexprs(kv_dtype, d_v, d_rope, stride_rope, rope_off, False, prefetch,
                        split_scores, block_h, block_n, torch.bfloat16)
    ints = dict(stride_qb=num_heads * d_qk, stride_qh=d_qk, stride_kv=row_stride,
                stride_scale=stride_scale, scale_off=scale_off, stride_rope=stride_rope,
                rope_off=rope_off, stride_ib=top_k, stride_ob=num_heads * d_v, stride_oh=d_v,
                stride_lb=num_heads, H=num_heads, K=top_k, num_slots=1 << 20, num_splits=1,
                tiles_per_split=triton.cdiv(top_k, block_n),
                num_head_blocks=triton.cdiv(num_heads, block_h))
    ptrs = dict(q_ptr="*bf16", kv_ptr="*u8" if kv_dtype == "fp8_ds_mla" else "*bf16",
                scale_ptr="*fp32" if kv_dtype == "fp8_ds_mla" else "*bf16", rope_ptr="*bf16",
                idx_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32", part_o_ptr="*fp32",
                part_lse_ptr="*fp32")
    const.update({n: 1 for n, v in ints.items() if v == 1})     # Triton specialises 1s
    return compile_for_target(_sparse_mla_decode_fwd, const, ptrs,
                              [n for n, v in ints.items() if v % 16 == 0],
                              floats=["qk_scale_log2"], arch=arch, num_warps=num_warps,
                              num_stages=num_stages)


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sm_scale: float, d_v: int = 512, **launch) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse MQA decode over top-k gathered KV rows (Triton, flash-decoding): ``out, lse``.

    The arguments and results are those of :func:`sparse_mla_decode_with_info` (keyword-only
    launch options ``block_h``, ``block_n``, ``num_warps``, ``num_stages``, ``num_splits``,
    ``prefetch``, ``split_scores``, ``mma_dtype``, ``num_sms``, ``kernel``,
    ``split_partials``), without the :class:`LaunchInfo`.
    """
    out, lse, _ = sparse_mla_decode_with_info(q, kv_cache, indices, sm_scale, d_v, **launch)
    return out, lse


def plan_splits(q: torch.Tensor, top_k: int, num_slots: int, d_v: int, block_h: int,
                block_n: int, num_splits: Optional[int], num_sms: Optional[int],
                part_dtype: torch.dtype = torch.float32):
    """The flash-decoding plan of one call: ``(out, lse, num_splits, tiles_per_split, part_o,
    part_lse)``. ``out [B, H, d_v]`` bf16 and ``lse [B, H]`` fp32 are allocated on ``q``'s
    device; ``num_splits`` (default :func:`choose_num_splits`; ValueError unless an int >= 1)
    is cut so that every split gets at least one ``block_n`` tile, and is 0 when there is
    nothing to attend (``top_k`` or ``num_slots`` 0: ``out`` is then 0 and ``lse`` ``+inf``,
    nothing to launch); ``part_o [B, H, S, d_v]`` (``part_dtype``: float32, or fp16 / bf16 for
    the ws kernel's ``split_partials="float16"`` / ``"bfloat16"``, which the split count's model
    prices too) /
    ``part_lse [B, H, S]`` fp32 are the per-split partials for :func:`combine_splits` (``lse``
    itself, unused, with one split)."""
    bsz, num_heads, _ = q.shape
    if num_sms is None:
        num_sms = (_num_sms(q.device.index if q.device.index is not None else torch.cuda.current_device())
                   if q.device.type == "cuda" else DEFAULT_NUM_SMS)
    if num_splits is None:
        num_splits = choose_num_splits(bsz, num_heads, max(top_k, 1), block_h=block_h,
                                       block_n=block_n, num_sms=num_sms, d_v=d_v,
                                       partial_bytes=part_dtype.itemsize)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")
    out = torch.empty((bsz, num_heads, d_v), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((bsz, num_heads), dtype=torch.float32, device=q.device)
    if top_k == 0 or num_slots == 0:
        out.zero_()
        lse.fill_(math.inf)
        return out, lse, 0, 0, lse, lse
    n_tiles = triton.cdiv(top_k, block_n)
    num_splits = min(num_splits, n_tiles)
    tiles_per_split = triton.cdiv(n_tiles, num_splits)
    num_splits = triton.cdiv(n_tiles, tiles_per_split)
    if num_splits > 1:
        part_o = torch.empty((bsz, num_heads, num_splits, d_v), dtype=part_dtype, device=q.device)
        part_lse = torch.empty((bsz, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_o, part_lse = lse, lse
    return out, lse, num_splits, tiles_per_split, part_o, part_lse


#: ``split_partials``: the dtype of a split call's partials, by name
SPLIT_PARTIALS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the warp-specialised kernel's default ``split_partials``: float32, FlashMLA's. Scaled fp16
#: ones have the float32 partials' error at half the bytes and are faster on their own (H200,
#: fp8_ds_mla H128 top_k 2048, graph replays: 0.75-0.93 of FlashMLA's time at B1-B16 against
#: 0.74-1.03), but inside the harness's decode step its attention stage was 1.6-3.7 us slower
#: with them than with float32 ones at batch 4 and 32, not explained yet (BENCHMARKS 6x)
WS_SPLIT_PARTIALS = "float32"


def split_partials_dtype(split_partials) -> torch.dtype:
    """The partials' torch dtype for a ``split_partials`` name; ValueError naming the allowed
    names otherwise."""
    if split_partials not in SPLIT_PARTIALS:
        raise ValueError(f"split_partials must be one of {', '.join(SPLIT_PARTIALS)}, got "
                         f"{split_partials!r}")
    return SPLIT_PARTIALS[split_partials]

#: 32-bit words of partials one combine program loads at once: float32 values, or pairs of
#: 16-bit ones. H200, fp8_ds_mla H128 top_k 2048 (BENCHMARKS 6x, j3): 2048 against 4096, bf16
#: pairs B4 0.87 of FlashMLA's time against 0.91-0.93 (graph), B1 0.70 against 0.72, B2-B32
#: unchanged; float32 partials unchanged at B1-B16 (its programs hold 2048 / S columns)
_COMBINE_ELEMS = 2048


def combine_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, part_e: Optional[torch.Tensor] = None) -> None:
    """Merges per-split partials ``part_o [B, H, S, d_v]`` (normalised o; float32, bf16, or fp16
    scaled by ``part_e``) and ``part_lse [B, H, S]`` (natural log, -inf for an empty split;
    float32), contiguous, into ``out [B, H, d_v]`` bf16 and ``lse [B, H]`` fp32 (``+inf`` and 0
    where every split is empty). fp16 partials (the ws kernel's ``split_partials="float16"``)
    need ``part_e [B, H, S, NCH]`` float32: split ``s``'s columns ``[j, j + 1) * d_v / NCH`` of a
    row hold ``o / 2^part_e[..., s, j]`` (``d_v / NCH`` even); no ``part_e`` otherwise. Measured on the
    H200 (BENCHMARKS 6q, fp8_ds_mla rows, H128 top_k 2048): the combine alone 9.0 / 7.8 / 10.3 /
    9.8 us at B1 / 2 / 4 / 8 against 13.5 / 9.8 / 11.6 / 10.3 with a loop over the splits, the
    decodes 0.9-1.4 us faster at B4 and B8; launched as a programmatic dependent of the decode
    it saved up to 1 us at B1-2 and cost up to 1.9 at B4 (calls c2, c3), and -0.5 to +0.2 us
    at B1-B8 when re-measured (BENCHMARKS 6t), so it is a plain launch; the splits summed a row
    a program in an unrolled loop (no cross-warp sum) 0.9 us faster to 2.9 us slower at B1-B32
    (6t); a programmatic dependent whose programs each wait for their own row's splits (the
    decode counting its stored partials in on a counter a row) -0.7 to +0.5 us at B1-B8 and 0.7
    to 4.1 us slower at B16-B32 (6u). A program has as many warps as a row's words fill (at
    most 4), so the sum over the splits stays within a thread (6w). 16-bit partials are read as
    int32 pairs and the output written as such (``PAIRS``); ``out`` then needs even strides and
    a 4-byte aligned start. Partials of another dtype, 16-bit ones at an odd ``d_v``, such an
    ``out``, fp16 ones without a fitting ``part_e`` or a ``part_e`` for others: ValueError."""
    bsz, num_heads, num_splits, d_v = part_o.shape
    pairs = part_o.dtype in (torch.bfloat16, torch.float16)
    scaled = part_o.dtype == torch.float16
    if part_o.dtype not in (torch.float32, torch.bfloat16, torch.float16) or (pairs and d_v % 2):
        raise ValueError(f"part_o must be float32, or bfloat16 / float16 with an even d_v; got "
                         f"{part_o.dtype} with d_v={d_v}")
    if pairs and (out.stride(-1) != 1 or out.stride(0) % 2 or out.stride(1) % 2
                  or out.data_ptr() % 4):
        raise ValueError("16-bit partials are combined into an out of whole 4-byte words: out "
                         f"must have even strides and a 4-byte aligned start, got strides "
                         f"{tuple(out.stride())}")
    nch = 1
    if scaled:
        nch = part_e.shape[-1] if isinstance(part_e, torch.Tensor) and part_e.dim() == 4 else 0
        if (nch < 1 or tuple(part_e.shape[:3]) != (bsz, num_heads, num_splits)
                or part_e.dtype != torch.float32 or not part_e.is_contiguous()
                or d_v % (2 * nch)):
            raise ValueError("float16 partials need part_e: a contiguous float32 [B, H, S, NCH] "
                             "tensor of their exponents, d_v a multiple of 2 * NCH; got "
                             f"{None if part_e is None else (tuple(part_e.shape), part_e.dtype)} "
                             f"for part_o {tuple(part_o.shape)}")
    elif part_e is not None:
        raise ValueError(f"part_e is for float16 partials only (part_o is {part_o.dtype})")
    s_pad = triton.next_power_of_2(num_splits)
    # every split's columns at once: at most _COMBINE_ELEMS 32-bit words a program
    block_d = max(16, min(triton.next_power_of_2(d_v), (2 if pairs else 1) * _COMBINE_ELEMS // s_pad))
    _sparse_mla_decode_combine[(bsz * num_heads, triton.cdiv(d_v, block_d))](
        part_o.view(torch.int32) if pairs else part_o, part_lse,
        part_e if scaled else part_lse,
        *((out.view(torch.int32), out.stride(0) // 2, out.stride(1) // 2) if pairs
          else (out, out.stride(0), out.stride(1))),
        lse, lse.stride(0),
        num_heads, num_splits,
        D_V=d_v, S_PAD=s_pad, BLOCK_D=block_d, PAIRS=pairs, SCALED=scaled, NCH=nch,
        # as many warps as a row's 32-bit words fill (128 a warp), at most 4, so that the sum
        # over the splits stays within a thread: 4 warps laid the splits across warps, whose sum
        # through shared memory had 4-way bank conflicts (bf16 pairs at B32, 2 splits: 18.6 us
        # against 7.6 for float32 partials; by columns 7.6. Float32 partials at 16-32 splits:
        # the ws call at B1 / B4 0.6-1.2 us faster. BENCHMARKS 6w)
        num_warps=min(4, max(1, block_d // (256 if pairs else 128))),
    )


def check_decode_inputs(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                        sm_scale, d_v: int) -> Tuple[str, float]:
    """Validates the arguments of a sparse MLA decode call (shapes, dtypes, strides, devices;
    see :func:`sparse_mla_decode_with_info`) before any launch: ``(kind, sm_scale)`` with the KV
    row format (``"bf16"`` or ``"fp8_ds_mla"``) and the scale as a float; ValueError naming the
    first bad argument."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16 or q.dim() != 3:
        raise ValueError("q must be a 3-D torch.bfloat16 tensor [B, H, d_qk], got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must have a unit last-dim stride, got strides {tuple(q.stride())}")
    bsz, num_heads, d_qk = q.shape
    if bsz < 1 or num_heads < 1:
        raise ValueError(f"q must have B >= 1 and H >= 1, got shape {tuple(q.shape)}")
    if not isinstance(d_v, int) or isinstance(d_v, bool) or not 16 <= d_v <= d_qk:
        raise ValueError(f"d_v must be an int in [16, d_qk={d_qk}], got {d_v!r}")
    d_rope = d_qk - d_v
    kind = kv_dtype_of(kv_cache)     # ValueError for other dtypes
    if kv_cache.dim() != 2:
        raise ValueError(f"kv_cache must be 2-D flat rows [num_slots, row], got shape "
                         f"{tuple(kv_cache.shape)}")
    if kv_cache.stride(-1) != 1:
        raise ValueError(f"kv_cache must have a unit last-dim stride, got {tuple(kv_cache.stride())}")
    if kind == "bf16":
        if kv_cache.shape[1] != d_qk:
            raise ValueError(f"bf16 kv_cache rows must have d_qk={d_qk} values, got {kv_cache.shape[1]}")
    else:
        if d_v % FP8_TILE != 0 or d_rope % 2 != 0:
            raise ValueError(f"fp8_ds_mla kv_cache needs d_v (= d_nope) a multiple of {FP8_TILE} and "
                             f"an even d_rope = d_qk - d_v; got d_v={d_v}, d_rope={d_rope}")
        rb = row_bytes("fp8_ds_mla", d_v, d_rope)
        if kv_cache.shape[1] != rb:
            raise ValueError(f"fp8_ds_mla kv_cache rows must be {rb} bytes for d_nope={d_v}, "
                             f"d_rope={d_rope}, got {kv_cache.shape[1]}")
        if kv_cache.stride(0) % 4 != 0:
            raise ValueError(f"fp8_ds_mla kv_cache row stride must be a multiple of 4 bytes, got "
                             f"{kv_cache.stride(0)}")
    num_slots = kv_cache.shape[0]
    if num_slots >= 2 ** 31:
        raise ValueError(f"kv_cache has {num_slots} rows; int32 indices address at most 2**31 - 1")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32 or indices.dim() != 2:
        raise ValueError("indices must be a 2-D torch.int32 tensor [B, K], got "
                         f"{getattr(indices, 'dtype', type(indices).__name__)} "
                         f"{tuple(getattr(indices, 'shape', ()))}")
    if indices.shape[0] != bsz:
        raise ValueError(f"indices must have B={bsz} rows, got {indices.shape[0]}")
    if indices.shape[1] > 0 and indices.stride(-1) != 1:
        raise ValueError(f"indices must have a unit last-dim stride, got {tuple(indices.stride())}")
    if not (q.device == kv_cache.device == indices.device):
        raise ValueError(f"q, kv_cache and indices must share a device, got {q.device}, "
                         f"{kv_cache.device}, {indices.device}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"tensors are on {q.device}; the Triton kernel needs a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")
    try:
        sm_scale = float(sm_scale)
    except (TypeError, ValueError):
        raise ValueError(f"sm_scale must be a float, got {sm_scale!r}") from None
    if not math.isfinite(sm_scale) or sm_scale <= 0:
        raise ValueError(f"sm_scale must be finite and > 0, got {sm_scale}")
    return kind, sm_scale


def sparse_mla_decode_with_info(
        q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
        sm_scale: float, d_v: int = 512, *,
        block_h: Optional[int] = None, block_n: int = 64, num_warps: int = 8,
        num_stages: Optional[int] = None, num_splits: Optional[int] = None,
        prefetch: Optional[str] = None, split_scores: Optional[bool] = None,
        mma_dtype: Optional[torch.dtype] = None,
        num_sms: Optional[int] = None,
        kernel: str = "triton",
        split_partials: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor, LaunchInfo]:
    """Sparse MQA decode over top-k gathered KV rows (Triton, flash-decoding).

    Args:
        q: ``[B, H, d_qk]`` torch.bfloat16 absorbed queries (NoPE part first, then rope),
            unit last-dim stride.
        kv_cache: flat KV rows ``[num_slots, d_qk]`` torch.bfloat16, or
            ``[num_slots, row_bytes]`` torch.uint8 ``fp8_ds_mla`` rows with
            ``d_nope = d_v`` (multiple of 128) and ``d_rope = d_qk - d_v``
            (see ``harness.kv_format``); unit last-dim stride. A paged cache is passed as
            ``cache.view(-1, row)``.
        indices: ``[B, K]`` torch.int32 global slot ids; entries outside
            ``[0, num_slots)`` (e.g. -1) are masked; duplicates are attended as often as they
            appear. Unit last-dim stride.
        sm_scale: softmax scale (finite float > 0) applied to ``q . k``.
        d_v: V width; V = the first ``d_v`` dims of each KV row.
        block_h: query heads per program (power of two >= 16); default 64 (H >= 64, and
            fp8_ds_mla rows with H >= 16: padded heads, as FlashMLA pads to 64 on Hopper; H200,
            B128 H16 k2048: 150.6 us against 176.5 for 16-head programs, whose ``mma.sync``
            tiles have no split scores and whose rows are dequantized by 16 heads' warps),
            else the next power of two >= H (at least 16; bf16 rows at H16: 126.7 us against
            138.5 padded).
        block_n: top-k tokens per KV tile (power of two >= 16).
        num_warps: warps per program of the main kernel (8: two warpgroups share the
            ``[64, 512]`` float32 accumulator).
        num_stages: Triton software-pipelining depth of the main loop; default 3 for
            fp8_ds_mla rows and 2 for bf16 rows (H200: 3 stages of 64-token bf16 tiles do not
            fit shared memory; fp8_ds_mla rows with ``split_scores`` just fit, see the module
            doc).
        num_splits: top-k splits (flash-decoding); default :func:`choose_num_splits`.
        prefetch: what of tile ``t + 1`` is fetched during tile ``t``, by hand, in
            registers: ``"none"``, ``"index"`` (its slot ids, so each tile's gather waits on one
            memory round trip instead of two; the default) or ``"rows"`` (the whole raw
            tile; spills registers at d_v = 512).
        split_scores: compute each tile's scores ``S`` once, its tokens split across the
            warpgroups, and pass ``P`` to the PV product through shared memory
            (the comment in the main loop), instead of every warpgroup computing all of ``S``;
            default True for head blocks of 64 or more (two warpgroups share a 64-row MMA:
            1.18x faster in bf16, 1.03x in fp8_ds_mla at B=128, H=128 on the H200), False
            below (16- and 32-head programs use mma.sync, where nothing changes).
        mma_dtype: MMA operand type, torch.bfloat16 or torch.float16; default bf16 on the
            GPU and fp16 under the Triton interpreter (see the module doc).
        num_sms: multiprocessors used by the split heuristic; default the device's (132 when
            not on a GPU).
        kernel: ``"triton"`` (this module's kernel) or ``"ws"``: the warp-specialised Gluon
            kernel (:mod:`backends.kernels.sparse_mla_decode_ws`; Hopper, both row formats,
            any head count: 16- / 32-head or 64-head programs, ``d_qk - d_v = 64``:
            ``ws_supported``), which takes ``num_stages`` (default: the most that fit, at
            most 3), ``num_splits`` and ``split_partials`` only: the other launch options
            must keep their defaults.
        split_partials: dtype of a split call's per-split partials: ``"float32"`` (FlashMLA's;
            the default, and the only one of ``kernel="triton"``) or, with ``kernel="ws"``,
            ``"float16"`` (each head's stored column range scaled by a power of two, so any
            finite values keep 11 bits; the float32 partials' error within 0.5 %) or
            ``"bfloat16"`` (1.02-1.05x the float32 partials' error with fp8_ds_mla rows,
            1.25-1.29x with bf16 rows, BENCHMARKS 6w): either 16-bit kind halves the bytes the
            decode writes and the combine reads (H200, fp8_ds_mla H128 top_k 2048: BENCHMARKS
            6x).

    Returns:
        ``out [B, H, d_v]`` torch.bfloat16 and ``lse [B, H]`` torch.float32 (natural log of
        ``sum exp(sm_scale * q . k)`` over valid indices; ``+inf`` and ``out = 0`` for a row
        with no valid index), both contiguous on ``q``'s device, and the :class:`LaunchInfo`
        of the call.
    """
    if split_partials is not None:
        split_partials_dtype(split_partials)
    if kernel == "ws":
        fixed = dict(block_h=(block_h, None), block_n=(block_n, 64), num_warps=(num_warps, 8),
                     prefetch=(prefetch, None), split_scores=(split_scores, None),
                     mma_dtype=(mma_dtype, None))
        for name, (value, default) in fixed.items():
            if value != default:
                raise ValueError(f"{name}={value!r} does not apply to kernel='ws' (its launch "
                                 "takes num_stages and num_splits only)")
        from backends.kernels.sparse_mla_decode_ws import sparse_mla_decode_ws
        return sparse_mla_decode_ws(q, kv_cache, indices, sm_scale, d_v,
                                    num_splits=num_splits, stages=num_stages, num_sms=num_sms,
                                    split_partials=split_partials or WS_SPLIT_PARTIALS)
    if kernel != "triton":
        raise ValueError(f"kernel must be 'triton' or 'ws', got {kernel!r}")
    if split_partials not in (None, "float32"):
        raise ValueError(f"split_partials={split_partials!r} applies to kernel='ws' only (this "
                         "kernel's partials are float32)")
    kind, sm_scale = check_decode_inputs(q, kv_cache, indices, sm_scale, d_v)
    bsz, num_heads, d_qk = q.shape
    d_rope = d_qk - d_v
    num_slots = kv_cache.shape[0]
    block_h, num_stages, split_scores, prefetch = _resolve_launch(
        kind, num_heads, block_h, block_n, num_warps, num_stages, split_scores, prefetch)
    if mma_dtype is None:
        mma_dtype = torch.float16 if _interpreting() else torch.bfloat16
    if mma_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"mma_dtype must be torch.bfloat16 or torch.float16, got {mma_dtype!r}")
    if mma_dtype == torch.bfloat16 and _interpreting():
        raise ValueError("mma_dtype=torch.bfloat16 does not work under TRITON_INTERPRET=1 "
                         "(the interpreter multiplies bf16 bit patterns); use torch.float16")
    top_k = indices.shape[1]
    plan = plan_splits(q, top_k, num_slots, d_v, block_h, block_n, num_splits, num_sms)
    out, lse, num_splits, _, part_o, part_lse = plan
    if num_splits == 0:
        return out, lse, LaunchInfo(block_h, block_n, num_warps, num_stages, 1, prefetch,
                                    split_scores)
    split = num_splits > 1
    _, _, stride_rope, rope_off = _row_views(kind, kv_cache.stride(0), d_v, d_rope)
    num_head_blocks = triton.cdiv(num_heads, block_h)
    kernel = _sparse_mla_decode_fwd[(bsz * num_splits * num_head_blocks,)](
        *kernel_args(q, kv_cache, kind, indices, sm_scale, d_v, plan, num_head_blocks),
        **_constexprs(kind, d_v, d_rope, stride_rope, rope_off, split, prefetch, split_scores,
                      block_h, block_n, mma_dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if split:
        combine_splits(part_o, part_lse, out, lse)
    # on the GPU the launch returns the compiled kernel (loaded, so its resources are known)
    n_regs, n_spills = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)
    metadata = getattr(kernel, "metadata", None)
    return out, lse, LaunchInfo(block_h, block_n, num_warps, num_stages, num_splits, prefetch,
                                split_scores, n_regs=None if n_regs is None else int(n_regs),
                                n_spills=None if n_spills is None else int(n_spills),
                                smem_bytes=getattr(metadata, "shared", None))
