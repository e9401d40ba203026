"""Per-row top-k over variable-length rows of indexer logits (Triton), and its plan.

Algorithm (exact, deterministic; ``k`` = ``top_k``, ``L`` = a row's length, ``CAP`` = the
candidate capacity of one program, ``cap_factor * next_pow2(k)`` clamped to ``[64, 16384]``
(``candidate_capacity``; ``TopkLaunch.cap_factor``, default 4: 8192 for k = 2048, 2: 4096):

* ``L <= k`` (pass-through): positions ``0 .. L-1`` then ``-1``.
* ``k < L <= CAP`` (direct): the whole row is loaded into one program as candidates.
* ``L > CAP`` (sample + scan): a *threshold* kernel takes a strided sample of ``SAMPLE`` values
  of the row (``min(TopkLaunch.sample_max, CAP)``, 2048 by default) and finds (radix search on
  the order-preserving key) the value ``t`` of rank ``r = ceil(SAMPLE * target / L)`` in it, so
  that about ``target`` row elements are ``>= t`` (``target = min(ceil(target_factor * k),
  (k + CAP) // 2)``, ``TopkLaunch.target_factor``, default 1.5: ``1.5k``; rows longer than
  ``TopkLaunch.long_row``, 65536, ``long_target_factor``, default 2). A *scan* kernel (the row
  split into chunks over several programs, as planned) compares the values with ``t``'s float
  and compacts the positions of elements ``>= t`` into per-chunk candidate lists, in position
  order, and counts them.
  When the total lies in ``[k, CAP]`` (all but adversarial rows) the *select* kernel gathers
  the candidates into one program; otherwise it falls back to an exact search over the whole
  row (32 counting passes over the row: slow, but correct for any input, e.g. rows of
  all-equal values).
* Select: the k-th largest key ``T`` among the candidates comes from a bit-by-bit radix search
  (largest ``T`` with ``count(key >= T) >= k``; only the bits below the common prefix of the
  candidates' min and max key are searched); every element ``> T`` is taken and elements
  ``== T`` are taken in ascending position order until ``k`` are selected (ties: lower position
  wins). Positions are written in ascending order. An optional epilogue maps them through the
  PAGED or RAGGED index transform (``topk_transform.py``) before the store.

Threshold variants (``TopkLaunch``; results unchanged, the select stays exact):
``threshold_window`` (the default) stops the sample search at the first probe whose count lies
within ``window_lo .. window_hi`` (default 1 .. 9/8; long rows ``long_window_lo ..
long_window_hi``, 3/4 .. 3/2) of the target rank ``r`` instead of
resolving it bit by bit (``False``: the exact sample quantile); ``fuse_threshold`` computes the
sample threshold inside every scan program of the row (no threshold kernel). A smaller
``cap_factor`` shrinks the select program (its time scales with ``CAP``, not with the
candidates) and needs a smaller ``target_factor`` and window so that the expected candidate
count stays within ``[k, CAP]``, e.g. ``cap_factor=2, target_factor=1.5, window 7/8 .. 9/8``:
2688 .. 3456 expected at k = 2048 (with ``long_row=None``, or long rows' settings that fit too:
the default long rows' 2k does not fit a CAP of 2 next_pow2(k)). Rows whose count still leaves
``[k, CAP]`` (more often with a narrower margin, and at long rows: the sample's rank noise grows
with ``L / SAMPLE``) take the exact whole-row fallback.

``TopkLaunch(algorithm="radix")``: the rows longer than ``CAP`` go through four kernels with
fixed grids and no host sync, every chunk of a row in its own program (issue #13):

* *window* (one program per row; short rows get their whole top-k here as above): zero the
  row's ``RADIX_BINS``-bin histogram and list counter; from the strided sample, keys ``t_lo``
  and ``t_hi`` about 5 binomial standard deviations of sample rank below and above the k-th
  largest, and a bin shift ``s`` so that ``bin(key) = min((key - t_lo) >> s, RADIX_BINS - 1)``
  (keys ``>= t_lo``) puts ``[t_lo, t_hi]`` into the lower half of the bins.
* *hist* (per chunk): the chunk's bin counts added into the row's histogram (atomics).
* *collect* (per chunk): from the histogram, the bin ``tb`` of the k-th largest key (counts
  from the top); the chunk's count of keys in bins above ``tb`` is stored, the positions and
  keys in bin ``tb`` are appended to the row's list (at most ``RADIX_LIST``; unordered).
* *output* (per chunk): from the list, the exact k-th key ``T`` and the last position ``p_cut``
  of the ties at ``T`` that are taken (ties: lower positions win); each chunk rescans and writes
  its selected positions (bin above ``tb``, or key ``> T``, or key ``== T`` at a position
  ``<= p_cut``) at their ranks: the selected counts of the earlier chunks come from the stored
  counts and the list. When the k-th key falls outside the window's bins, or its bin holds more
  than ``RADIX_LIST`` keys (heavy ties, e.g. all-equal rows), chunk 0 writes the row by the
  exact whole-row path instead. The result is identical to the sample path's.

The key of a float32 ``v`` is its bit pattern mapped so that unsigned integer order equals float
order (``-inf < ... < +inf``; ``-0.0`` is first mapped to ``+0.0`` since they compare equal).
NaN logits are not supported (``validate_topk_inputs`` rejects them inside a row's length).

``plan_topk`` depends only on the lengths (and its ``cap_factor``, the plan's ``cap``): it is
computed once per step and reused by every layer (it owns the scratch buffers and decides which
rows are split across how many scan programs). A launch may use a plan whose ``cap`` is at least
its own ``CAP`` (a smaller launch capacity only changes the select program's block). The launch
configuration (``TopkLaunch``) defaults were measured on an H200 (``python -m harness.bench
indexer --tune topk`` times others).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

import torch
import triton
import triton.language as tl

SAMPLE_MAX = 2048
"""Default sample size of the threshold kernel (``TopkLaunch.sample_max``; capped at CAP)."""
CAP_FACTOR = 4
"""Default ``TopkLaunch.cap_factor`` / ``plan_topk(cap_factor=)``: CAP = 4 * next_pow2(k)."""
RATIO_DENOMINATOR = 64
"""``TopkLaunch.target_factor`` / ``window_lo`` / ``window_hi`` are read as the nearest fraction
with a denominator <= this (exact integer arithmetic in the kernels: 1.5 -> 3/2, 4/3 -> 4/3)."""
MIN_CHUNK = 4096
"""Smallest chunk a long row is split into (per scan program)."""
MAX_CHUNKS = 65535
"""Most chunks a row may be planned in: the scan grid's second extent (CUDA's limit for a
grid's y dimension); the select's chunk search covers up to 2^16."""

ALGORITHMS = ("sample", "radix")
"""``TopkLaunch.algorithm`` values."""
RADIX_BINS = 1024
"""Bins of the radix path's per-row window histogram (the last one: everything above)."""
RADIX_LIST = 512
"""Capacity of the radix path's per-row list of the k-th key's bin (more: exact fallback)."""

METHOD_NONE = 0
METHOD_PAGED = 1
METHOD_RAGGED = 2

_PLAN_BUILDS = 0


@dataclass(frozen=True)
class TopkLaunch:
    """Launch configuration of the top-k kernels.

    algorithm: ``"sample"`` (sample threshold + scan + one select program per row) or
    ``"radix"`` (the multi-program window-histogram select, module docstring); both exact and
    bit-identical. radix_bits: bits resolved per step of the sample path's k-th-key radix
    search (1, 2 or 4; 1 measured fastest); scan_block_max: elements per loop iteration of the
    scan / histogram / collect / output kernels, at most (the sample path's scan takes less
    when a chunk would otherwise run fewer than ``scan_stages`` iterations; also the select
    kernel's block cap);
    select_warps / select_stages, scan_warps / scan_stages: Triton's, per kernel (the radix
    path's per-row window kernel takes select_warps, its chunk kernels scan_warps / scan_stages).
    fuse_threshold ("sample" only): every scan program computes its row's sample threshold
    itself (the same value for all chunks of a row) instead of a separate threshold kernel.
    threshold_window ("sample" only; default on, measured fastest on the H200): the sample
    search stops at the first probe with between ``window_lo`` and ``window_hi`` (1 and 9/8;
    past ``long_row``, ``long_window_lo`` and ``long_window_hi``: 3/4 and 3/2) of the target rank
    of sample elements at or above it instead of resolving the exact sample quantile bit by bit.
    cap_factor (a power of two >= 2; default 4): the candidate capacity of one select program,
    ``CAP = candidate_capacity(k, cap_factor)`` = ``cap_factor * next_pow2(k)`` clamped to
    [64, 16384] (elements; 8192 for k = 2048, 4096 with 2). The select's block (``CAP``
    elements) is the only thing it sizes: the plan (``plan_topk(cap_factor=)``) decides which
    rows are direct (``L <= plan.cap``) and sizes the candidate lists, and must have been built
    with a ``cap_factor`` at least this one (``launch_topk`` raises otherwise). With a smaller
    one than the plan's, rows of ``CAP < L <= plan.cap`` take the exact whole-row fallback
    (correct, slow: build the plan with the launch's cap_factor). With 2 the long rows'
    default target (2k) does not fit: give ``long_row=None`` or a ``long_target_factor`` of
    at most 1.5 (``ValueError`` names it otherwise).
    target_factor ("sample" only; default 1.5): the threshold aims at
    ``target = min(ceil(target_factor * k), (k + CAP) // 2)`` elements ``>= t`` in rows of at
    most ``long_row`` elements; must lie in ``(1, (1 + cap_factor) / 2]`` (then the clamp never
    binds for ``k <= 16384 / cap_factor``).
    window_lo / window_hi ("sample" only; defaults 1 / 1.125): the threshold window as
    fractions of the target sample rank ``r`` (``[floor(window_lo * r), ceil(window_hi * r)]``,
    clamped to [1, SAMPLE]); with ``threshold_window`` the expected candidate counts at its edges
    must lie in ``[k, CAP]``: ``window_lo * target_factor >= 1`` and
    ``window_hi * target_factor <= cap_factor`` (``0 < window_lo <= 1 <= window_hi``). Ignored
    with ``threshold_window=False``. target_factor and the window bounds are read as the nearest
    fractions with denominators <= ``RATIO_DENOMINATOR`` (``launch_ratios``).
    sample_max (a power of two >= 64; default ``SAMPLE_MAX`` = 2048): the threshold's strided
    sample has ``SAMPLE = min(sample_max, CAP)`` values (the radix path's window sample too); a
    larger one narrows the candidate count's spread (its rank noise scales with
    ``sqrt(L / SAMPLE)``) at the cost of a longer threshold search.
    long_row ("sample" only; default 65536; None: no row is long, and the three ``long_``
    fields are not used): rows longer than this many elements take the threshold
    ``long_target_factor`` / ``long_window_lo`` / ``long_window_hi`` (defaults 2 / 0.75 / 1.5,
    the same rules as the short rows' three): the sample's rank noise grows with
    ``L / SAMPLE``, so a target and window as narrow as the short rows' would leave some long
    rows with fewer than k candidates (the slow exact fallback; a numpy replica of the search,
    ``results/h200-2026-12-03-topk/scripts/threshold_sim.py``: none of 1500 rows at 32K and 800
    at 64K with 1.5 and 1 .. 9/8, 0.33 % of 600 at 128K with 1.5 and 7/8 .. 9/8).
    small_select ("sample" only; default True): the select program also holds a block of
    ``CAP // 2`` elements and uses it for a row whose candidates fit it (larger counts keep the
    ``CAP`` block, so nothing more falls back), in calls whose rows are all at most
    ``long_row`` long (``plan.max_len``; a call takes as long as its slowest row, and the long
    rows' wider target rarely fits the half block); pays off with a target well below
    ``CAP // 2`` (1.5 with a window of 1 .. 9/8: 3072 .. 3456 expected at k = 2048).
    threshold_warps (1, 2, 4, 8 or 16; default 4): the threshold kernel's warps (its sample
    search is a chain of block-wide counts; H200, B=64, k=2048: 1 and 2 warps 1-2 us slower,
    8 the same, ``BENCHMARKS.md`` 6m).
    None of these changes the result.
    """

    radix_bits: int = 1
    select_warps: int = 8
    select_stages: int = 3
    scan_block_max: int = 2048
    scan_warps: int = 4
    scan_stages: int = 4
    fuse_threshold: bool = False
    threshold_window: bool = True
    algorithm: str = "sample"
    cap_factor: int = CAP_FACTOR
    target_factor: float = 1.5
    window_lo: float = 1.0
    window_hi: float = 1.125
    sample_max: int = SAMPLE_MAX
    small_select: bool = True
    long_row: Optional[int] = 65536
    long_target_factor: float = 2.0
    long_window_lo: float = 0.75
    long_window_hi: float = 1.5
    threshold_warps: int = 4

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"TopkLaunch.algorithm must be one of {', '.join(ALGORITHMS)}, "
                             f"got {self.algorithm!r}")
        if self.algorithm == "radix" and self.fuse_threshold:
            raise ValueError("TopkLaunch.fuse_threshold must be False with algorithm='radix' "
                             "(it has no sample threshold to fuse)")
        if not _is_int(self.radix_bits) or self.radix_bits not in (1, 2, 4):
            raise ValueError(f"TopkLaunch.radix_bits must be 1, 2 or 4, got {self.radix_bits!r}")
        v = self.scan_block_max
        if not _is_int(v) or v < 16 or v & (v - 1):
            raise ValueError(f"TopkLaunch.scan_block_max must be a power of two >= 16, got {v!r}")
        for name in ("select_warps", "scan_warps", "threshold_warps"):
            if not _is_int(getattr(self, name)) or getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"TopkLaunch.{name} must be one of 1, 2, 4, 8, 16, "
                                 f"got {getattr(self, name)!r}")
        for name in ("select_stages", "scan_stages"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"TopkLaunch.{name} must be an int >= 1, got {v!r}")
        _check_cap_factor("TopkLaunch.cap_factor", self.cap_factor)
        if not isinstance(self.small_select, bool):
            raise ValueError(f"TopkLaunch.small_select must be True or False, "
                             f"got {self.small_select!r}")
        v = self.sample_max
        if not _is_int(v) or v < 64 or v & (v - 1):
            raise ValueError(f"TopkLaunch.sample_max must be a power of two >= 64, got {v!r}")
        if self.long_row is not None and (not _is_int(self.long_row) or self.long_row < 0):
            raise ValueError(f"TopkLaunch.long_row must be an int >= 0 (elements) or None (no "
                             f"row is long), got {self.long_row!r}")
        for name in _RATIOS + _LONG_RATIOS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"TopkLaunch.{name} must be a finite number, got {v!r}")
        if self.algorithm == "radix":
            changed = [n for n in _RATIOS + _LONG_RATIOS + ("long_row",)
                       if getattr(self, n) != _SAMPLE_ONLY_DEFAULTS[n]]
            if changed:
                raise ValueError(f"TopkLaunch.{changed[0]} applies to algorithm='sample' only "
                                 f"(the radix path has no sample target); leave it at "
                                 f"{_SAMPLE_ONLY_DEFAULTS[changed[0]]!r} with algorithm='radix'")
            return
        self._check_ratios("", *launch_ratios(self))
        if self.long_row is not None:
            self._check_ratios("long_", *launch_ratios(self, long=True))

    def _check_ratios(self, prefix: str, tf: Fraction, lo: Fraction, hi: Fraction) -> None:
        """The target and window rules (class docstring) for the short (``prefix`` "") or
        long ("long_") rows' fields."""
        name = lambda n: f"TopkLaunch.{prefix}{n}"
        value = lambda n: getattr(self, prefix + n)
        if not 1 < tf <= Fraction(1 + self.cap_factor, 2):
            raise ValueError(f"{name('target_factor')} must be in (1, (1 + cap_factor) / 2] = "
                             f"(1, {(1 + self.cap_factor) / 2:g}] for cap_factor="
                             f"{self.cap_factor}, got {value('target_factor')!r}")
        if not 0 < lo <= 1:
            raise ValueError(f"{name('window_lo')} must be in (0, 1], got {value('window_lo')!r}")
        if hi < 1:
            raise ValueError(f"{name('window_hi')} must be >= 1, got {value('window_hi')!r}")
        if self.threshold_window and lo * tf < 1:
            raise ValueError(f"{name('window_lo')} must be >= 1 / {prefix}target_factor = "
                             f"{1 / value('target_factor'):.4g} (the window's low edge expects at "
                             f"least k candidates), got {value('window_lo')!r}")
        if self.threshold_window and hi * tf > self.cap_factor:
            raise ValueError(f"{name('window_hi')} must be <= cap_factor / {prefix}target_factor "
                             f"= {self.cap_factor / value('target_factor'):.4g} (the window's high "
                             f"edge expects at most CAP candidates), got {value('window_hi')!r}")


_RATIOS = ("target_factor", "window_lo", "window_hi")
_LONG_RATIOS = ("long_target_factor", "long_window_lo", "long_window_hi")
_SAMPLE_ONLY_DEFAULTS = {n: TopkLaunch.__dataclass_fields__[n].default
                         for n in _RATIOS + _LONG_RATIOS + ("long_row",)}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_cap_factor(name: str, v) -> None:
    if not _is_int(v) or v < 2 or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= 2 (e.g. 2 or 4), got {v!r}")


def _ratio(x: float) -> Fraction:
    return Fraction(x).limit_denominator(RATIO_DENOMINATOR)


def launch_ratios(launch: TopkLaunch, long: bool = False):
    """``(target_factor, window_lo, window_hi)`` of ``launch`` (``long``: the ``long_``
    ones) as the ``Fraction``s the kernels use (nearest with a denominator <=
    ``RATIO_DENOMINATOR``)."""
    prefix = "long_" if long else ""
    return tuple(_ratio(getattr(launch, prefix + n)) for n in _RATIOS)


def sample_target(top_k: int, launch: TopkLaunch = TopkLaunch(), long: bool = False) -> int:
    """Elements of a long row the sample threshold aims to keep (``>= t``):
    ``min(ceil(target_factor * k), (k + CAP) // 2)`` with ``CAP`` the launch's capacity
    (3072 for k = 2048 by default; ``long``: with ``long_target_factor``, 4096)."""
    cap = candidate_capacity(top_k, launch.cap_factor)
    return min(math.ceil(launch_ratios(launch, long)[0] * top_k), (top_k + cap) // 2)


def plan_build_count() -> int:
    """How many times ``plan_topk`` has run in this process (the harness reads it per step)."""
    return _PLAN_BUILDS


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def candidate_capacity(top_k: int, cap_factor: int = CAP_FACTOR) -> int:
    """Candidates one select program holds (elements): ``cap_factor * next_pow2(top_k)`` clamped
    to [64, 16384] (a power of two; 8192 for k = 2048 at the default cap_factor 4)."""
    return max(64, min(16384, cap_factor * _next_pow2(top_k)))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).multi_processor_count
    return 132


# ----------------------------------------------------------------------------------------------
# Triton helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def _order_key(v):
    """float32 -> uint32 key whose unsigned order is the float order."""
    bits = v.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 -> +0.0 (they compare equal)
    flip = (bits >> 31) | -2147483648  # negative: flip all bits; positive: flip the sign bit
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _common_prefix(key):
    """``(T, nbits)``: the high bits the counted keys (``key > 0``) share, with the ``nbits``
    low bits below them zero (a float conversion bounds the highest differing bit from above;
    over-estimating only costs a step)."""
    kmax = tl.max(key, axis=0)
    kmin = tl.min(tl.where(key > 0, key, kmax), axis=0)
    diff = (kmax ^ kmin).to(tl.float32)
    nbits = tl.where(kmax == kmin, 0,
                     ((diff.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126)
    nbits = tl.minimum(nbits, 32)
    top = tl.full([], 1, tl.uint32) << (tl.maximum(nbits, 1) - 1).to(tl.uint32)
    low = tl.where(nbits > 0, top + (top - 1), 0)  # bits [0, nbits), all-uint32 math
    return kmax & ~low, nbits


@triton.jit
def _kth_largest_key(key, k, BITS: tl.constexpr):
    """``(T, n_ge)``: the largest uint32 ``T`` with ``count(key >= T) >= k`` (= the k-th largest
    key) and ``n_ge = count(key >= T)`` (int32), or -1 when that is every counted key (``T``
    stayed at the keys' common prefix, ``BITS`` 1 only: then every counted key is ``>= T``, and
    the caller knows how many it counted; ``BITS`` 2 and 4 always count).

    Entries to ignore must carry key 0: every probe is >= 1, so they are never counted (no real
    float maps to 0; only the negative NaN ``0xFFFFFFFF`` would). Only the bits below the common
    prefix of the counted keys are searched (``_common_prefix``). ``BITS`` 1: a bisection (one
    block count per bit); 2 or 4: a radix select, one ``BITS``-bit digit per step from the top:
    a histogram of the digit over the keys that match the prefix found so far, the largest digit
    whose keys at or above it still reach the rank, the rank reduced by the keys above it.
    """
    T, nbits = _common_prefix(key)
    if BITS == 1:
        bit = tl.where(nbits > 0, tl.full([], 1, tl.uint32) << (tl.maximum(nbits, 1) - 1).to(tl.uint32), 0)
        n_ge = tl.full([], -1, tl.int32)
        for _ in range(0, nbits):
            cand = T | bit
            cnt = tl.sum((key >= cand).to(tl.int32), axis=0)
            T = tl.where(cnt >= k, cand, T)
            n_ge = tl.where(cnt >= k, cnt, n_ge)
            bit = bit >> 1
    else:
        NB: tl.constexpr = 1 << BITS
        bins = tl.arange(0, 2 * NB)
        steps = (nbits + BITS - 1) // BITS
        sh = (steps * BITS - BITS).to(tl.uint32)
        # bits of T decided so far (the prefix above the first digit)
        fixed = ~((tl.full([], 1, tl.uint32) << (sh + BITS)) - 1)
        fixed = tl.where(steps * BITS >= 32, tl.zeros([], dtype=tl.uint32), fixed)
        T = T & fixed
        need = k
        for _ in range(0, steps):
            match = (key > 0) & ((key & fixed) == T)
            digit = ((key >> sh) & (NB - 1)).to(tl.int32)
            h = tl.histogram(tl.where(match, digit, NB), 2 * NB)   # bins >= NB: not matching
            h = tl.where(bins < NB, h, 0)
            ge = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h       # matching keys, digit >= d
            d = tl.max(tl.where((bins < NB) & (ge >= need), bins, 0), axis=0)
            need = need - tl.sum(tl.where(bins > d, h, 0), axis=0)
            T = T | (d.to(tl.uint32) << sh)
            fixed = fixed | (tl.full([], NB - 1, tl.uint32) << sh)
            sh = sh - BITS
        n_ge = tl.sum((key >= T).to(tl.int32), axis=0)
    return T, n_ge


@triton.jit
def _transform_positions(pos, row, METHOD: tl.constexpr, bt_ptr, stride_bt, req_ptr,
                         HAS_REQ: tl.constexpr, page_size, off_ptr):
    """Index-transform epilogue on int32 positions of one row (``-1`` stays ``-1``).

    METHOD 0: identity; 1 (PAGED): ``block_table[req, p // P] * P + p % P`` with ``req`` the row
    (or ``req_ptr[row]``); 2 (RAGGED): ``p + off_ptr[row]``.
    """
    if METHOD == 1:
        if HAS_REQ:
            req = tl.load(req_ptr + row).to(tl.int64)
        else:
            req = row.to(tl.int64)
        valid = pos >= 0
        p = tl.where(valid, pos, 0)
        page = tl.load(bt_ptr + req * stride_bt + p // page_size, mask=valid, other=0)
        res = tl.where(valid, page * page_size + p % page_size, -1)
    elif METHOD == 2:
        off = tl.load(off_ptr + row)
        res = tl.where(pos >= 0, pos + off, -1)
    else:
        res = pos
    return res


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _windowed_rank_key(key, r_lo, r_hi):
    """A uint32 ``T`` with ``r_lo <= count(key >= T)``: the first probe of a bit bisection from
    the top (over the bits below the common prefix of the keys' min and max, as in
    ``_kth_largest_key``) whose count lies in ``[r_lo, r_hi]``, else the ``r_lo``-th largest
    key. Entries to ignore carry key 0 (never counted); needs ``r_lo <=`` the counted entries.
    """
    T, nbits = _common_prefix(key)  # count(key >= T) = every counted entry
    bit = tl.where(nbits > 0, tl.full([], 1, tl.uint32) << (tl.maximum(nbits, 1) - 1).to(tl.uint32), 0)
    steps = nbits
    while steps > 0:
        cand = T | bit
        cnt = tl.sum((key >= cand).to(tl.int32), axis=0)
        T = tl.where(cnt >= r_lo, cand, T)
        steps = tl.where((cnt >= r_lo) & (cnt <= r_hi), 0, steps - 1)
        bit = bit >> 1
    return T


@triton.jit
def _row_threshold(base, length, target, target_long, long_row, SAMPLE: tl.constexpr,
                   RADIX_BITS: tl.constexpr, WINDOW: tl.constexpr, WLO_N: tl.constexpr,
                   WLO_D: tl.constexpr, WHI_N: tl.constexpr, WHI_D: tl.constexpr,
                   LLO_N: tl.constexpr, LLO_D: tl.constexpr, LHI_N: tl.constexpr,
                   LHI_D: tl.constexpr):
    """uint32 key of a strided sample's quantile such that about ``target`` of the row's
    ``length`` elements are >= it (WINDOW: anywhere from ``WLO_N / WLO_D`` to ``WHI_N / WHI_D``
    of that, e.g. 1 to 9/8: sample ranks ``r .. ceil(9r/8)``); a row longer than ``long_row``
    aims at ``target_long`` with the window ``LLO_N / LLO_D .. LHI_N / LHI_D`` instead."""
    i = tl.arange(0, SAMPLE).to(tl.int64)
    pos = (i * length) // SAMPLE
    key = _order_key(tl.load(base + pos))
    long = length > long_row
    r = tl.minimum(tl.maximum((SAMPLE * tl.where(long, target_long, target) + length - 1)
                              // length, 1), SAMPLE)
    if WINDOW:
        r_lo = tl.where(long, (LLO_N * r) // LLO_D, (WLO_N * r) // WLO_D)
        r_hi = tl.where(long, (LHI_N * r + LHI_D - 1) // LHI_D, (WHI_N * r + WHI_D - 1) // WHI_D)
        t = _windowed_rank_key(key, tl.maximum(r_lo, 1), tl.minimum(r_hi, SAMPLE))
    else:
        t, _ = _kth_largest_key(key, r, RADIX_BITS)
    return t


@triton.jit
def _topk_threshold_kernel(logits_ptr, stride_l, n_cols, len_ptr, thr_ptr, target, target_long,
                           long_row, CAP: tl.constexpr, SAMPLE: tl.constexpr,
                           RADIX_BITS: tl.constexpr, WINDOW: tl.constexpr, WLO_N: tl.constexpr,
                           WLO_D: tl.constexpr, WHI_N: tl.constexpr, WHI_D: tl.constexpr,
                           LLO_N: tl.constexpr, LLO_D: tl.constexpr, LHI_N: tl.constexpr,
                           LHI_D: tl.constexpr):
    """Per row longer than ``CAP`` (the launch's capacity): key of a sample quantile such that
    about ``target`` elements are >= it (``target_long`` past ``long_row`` elements; the
    windows as in ``_row_threshold``)."""
    row = tl.program_id(0)
    length = tl.minimum(tl.load(len_ptr + row), n_cols)
    if length > CAP:
        t = _row_threshold(logits_ptr + row.to(tl.int64) * stride_l, length, target,
                           target_long, long_row, SAMPLE, RADIX_BITS, WINDOW, WLO_N, WLO_D,
                           WHI_N, WHI_D, LLO_N, LLO_D, LHI_N, LHI_D)
        tl.store(thr_ptr + row, t.to(tl.int32, bitcast=True))


@triton.jit
def _threshold_value(t):
    """float32 ``f`` with ``v >= f`` exactly when ``_order_key(v) >= t``, for every non-NaN
    float32 ``v`` (uint32 ``t``; keys below -inf's are raised to it first, keys above +inf's
    give a NaN, which no value reaches): the scan compares the values themselves."""
    t = tl.maximum(t, tl.full([], 0x007FFFFF, tl.uint32))         # the key of -inf
    bits = tl.where(t >= 0x80000000, t ^ 0x80000000, ~t)
    return bits.to(tl.int32, bitcast=True).to(tl.float32, bitcast=True)


@triton.jit
def _scan_values(p, sel, slot_base, cnt, CAP: tl.constexpr):
    """Append the positions ``p`` (int32 ``[R, 4]``, row-major in position order) where ``sel``
    holds to the candidate list after its ``cnt`` entries; the new count. The prefix sum runs
    within each thread's 4 values first and across the ``R`` row totals after (a 1-D prefix sum
    over the whole block costs 2.6x the instructions, by the sm_90a compile)."""
    s = sel.to(tl.int32)
    rows = tl.sum(s, axis=1)
    slot = cnt + (tl.cumsum(rows, axis=0) - rows)[:, None] + tl.cumsum(s, axis=1) - 1
    tl.store(slot_base + slot, p, mask=sel & (slot < CAP))
    return cnt + tl.sum(rows, axis=0)


@triton.jit
def _topk_scan_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, thr_ptr, cand_ptr,
                      cnt_ptr, chunk_size, max_chunks, target, target_long, long_row,
                      CAP: tl.constexpr, BLOCK: tl.constexpr, FUSE_THRESHOLD: tl.constexpr,
                      SAMPLE: tl.constexpr, RADIX_BITS: tl.constexpr, WINDOW: tl.constexpr,
                      WLO_N: tl.constexpr, WLO_D: tl.constexpr, WHI_N: tl.constexpr,
                      WHI_D: tl.constexpr, LLO_N: tl.constexpr, LLO_D: tl.constexpr,
                      LHI_N: tl.constexpr, LHI_D: tl.constexpr):
    """One chunk of a long row: positions of elements >= the row's threshold, in order
    (FUSE_THRESHOLD: the threshold computed here from the row's sample, else read). ``CAP``:
    the capacity and stride of a chunk's list (the plan's ``cap``; the count goes on past it)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n_chunks = tl.load(chunks_ptr + row)
    if chunk < n_chunks:
        length = tl.minimum(tl.load(len_ptr + row), n_cols)
        base = logits_ptr + row.to(tl.int64) * stride_l
        if FUSE_THRESHOLD:
            t = _row_threshold(base, length, target, target_long, long_row, SAMPLE,
                               RADIX_BITS, WINDOW, WLO_N, WLO_D, WHI_N, WHI_D, LLO_N, LLO_D,
                               LHI_N, LHI_D)
        else:
            t = tl.load(thr_ptr + row).to(tl.uint32, bitcast=True)
        start = chunk * chunk_size
        end = tl.minimum(start + chunk_size, length)
        slot_base = cand_ptr + (row.to(tl.int64) * max_chunks + chunk) * CAP
        tf = _threshold_value(t)
        r = tl.arange(0, BLOCK // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]   # [BLOCK / 4, 4]
        cnt = 0
        n_full = tl.maximum(end - start, 0) // BLOCK
        for it in range(0, n_full):  # full blocks: unmasked (vectorised) loads
            p = start + it * BLOCK + r
            cnt = _scan_values(p, tl.load(base + p) >= tf, slot_base, cnt, CAP)
        p = start + n_full * BLOCK + r
        m = p < end
        cnt = _scan_values(p, m & (tl.load(base + p, mask=m, other=0.0) >= tf), slot_base, cnt,
                           CAP)
        tl.store(cnt_ptr + row * max_chunks + chunk, cnt)


@triton.jit
def _passthrough_row(length, top_k, out_row, row, METHOD: tl.constexpr, bt_ptr, stride_bt,
                     req_ptr, HAS_REQ: tl.constexpr, page_size, off_ptr, BLOCK: tl.constexpr):
    """A row with ``length <= top_k``: every position, then -1 padding."""
    for off in range(0, top_k, BLOCK):
        i = off + tl.arange(0, BLOCK)
        pos = tl.where(i < length, i, -1)
        res = _transform_positions(pos, row, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ,
                                   page_size, off_ptr)
        tl.store(out_row + i, res, mask=i < top_k)


@triton.jit
def _exact_row(base, length, top_k, out_row, row, METHOD: tl.constexpr, bt_ptr, stride_bt,
               req_ptr, HAS_REQ: tl.constexpr, page_size, off_ptr, BLOCK: tl.constexpr):
    """Exact top-k of one whole row for any input: the k-th key by 32 counting passes (bit
    bisection), one pass counting the keys above it, one writing (slow; the fallback)."""
    T = tl.zeros([], dtype=tl.uint32)
    bit = tl.full([], 1, tl.uint32) << 31
    for _ in range(32):
        cand = T | bit
        cnt = 0
        for off in range(0, length, BLOCK):
            p = off + tl.arange(0, BLOCK)
            m = p < length
            key = _order_key(tl.load(base + p, mask=m, other=0.0))
            cnt += tl.sum((m & (key >= cand)).to(tl.int32), axis=0)
        T = tl.where(cnt >= top_k, cand, T)
        bit = bit >> 1
    n_gt = 0
    for off in range(0, length, BLOCK):
        p = off + tl.arange(0, BLOCK)
        m = p < length
        key = _order_key(tl.load(base + p, mask=m, other=0.0))
        n_gt += tl.sum((m & (key > T)).to(tl.int32), axis=0)
    need = top_k - n_gt
    n_eq = 0
    n_out = 0
    for off in range(0, length, BLOCK):
        p = off + tl.arange(0, BLOCK)
        m = p < length
        key = _order_key(tl.load(base + p, mask=m, other=0.0))
        eq = m & (key == T)
        sel = (m & (key > T)) | (eq & (n_eq + tl.cumsum(eq.to(tl.int32), axis=0) <= need))
        slot = n_out + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        res = _transform_positions(p, row, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ,
                                   page_size, off_ptr)
        tl.store(out_row + slot, res, mask=sel)
        n_eq += tl.sum(eq.to(tl.int32), axis=0)
        n_out += tl.sum(sel.to(tl.int32), axis=0)


@triton.jit
def _select_row(row, logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr, cnt_ptr,
                max_chunks, chunk_size, out_ptr, stride_o, top_k, bt_ptr, stride_bt, req_ptr,
                page_size, off_ptr, METHOD: tl.constexpr, HAS_REQ: tl.constexpr,
                CAP: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
                STRIDE: tl.constexpr, CHUNKS: tl.constexpr, SMALL: tl.constexpr = 0):
    """Final top-k of one row (pass-through / candidates / exact fallback) + transform epilogue.

    ``CAP``: the launch's candidate capacity (the block this program holds; a direct row longer
    than it, or more candidates than it, takes the exact fallback); ``STRIDE``: the capacity of
    one chunk's candidate list in ``cand_ptr`` (the plan's ``cap``, >= ``CAP``); ``SMALL``
    (``TopkLaunch.small_select``): 0, or a smaller block (``CAP // 2``) used when the row's
    candidates fit it (the select's time scales with its block); ``CHUNKS``: a power of two
    >= ``max_chunks`` (a row's chunk counts are read as one vector)."""
    length = tl.minimum(tl.load(len_ptr + row), n_cols)
    out_row = out_ptr + row.to(tl.int64) * stride_o
    base = logits_ptr + row.to(tl.int64) * stride_l
    if length <= top_k:
        _passthrough_row(length, top_k, out_row, row, METHOD, bt_ptr, stride_bt, req_ptr,
                         HAS_REQ, page_size, off_ptr, BLOCK)
    else:
        n_chunks = tl.load(chunks_ptr + row)
        c = tl.arange(0, CHUNKS)
        counts = tl.load(cnt_ptr + row * max_chunks + c, mask=c < n_chunks, other=0)
        total = tl.where(n_chunks > 0, tl.sum(counts, axis=0), length)
        # the chunks must cover the row (a plan built for shorter rows falls back, still exact)
        covered = n_chunks.to(tl.int64) * chunk_size >= length
        if (total >= top_k) & (total <= CAP) & ((n_chunks == 0) | covered):
            if SMALL > 0:
                if total <= SMALL:
                    _select_candidates(row, base, n_chunks, total, counts, cand_ptr, max_chunks,
                                       out_row, top_k, METHOD, bt_ptr, stride_bt, req_ptr,
                                       HAS_REQ, page_size, off_ptr, SMALL, RADIX_BITS, STRIDE,
                                       CHUNKS)
                else:
                    _select_candidates(row, base, n_chunks, total, counts, cand_ptr, max_chunks,
                                       out_row, top_k, METHOD, bt_ptr, stride_bt, req_ptr,
                                       HAS_REQ, page_size, off_ptr, CAP, RADIX_BITS, STRIDE,
                                       CHUNKS)
            else:
                _select_candidates(row, base, n_chunks, total, counts, cand_ptr, max_chunks,
                                   out_row, top_k, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ,
                                   page_size, off_ptr, CAP, RADIX_BITS, STRIDE, CHUNKS)
        else:
            _exact_row(base, length, top_k, out_row, row, METHOD, bt_ptr, stride_bt, req_ptr,
                       HAS_REQ, page_size, off_ptr, BLOCK)


@triton.jit
def _select_candidates(row, base, n_chunks, total, counts, cand_ptr, max_chunks, out_row,
                       top_k, METHOD: tl.constexpr, bt_ptr, stride_bt, req_ptr,
                       HAS_REQ: tl.constexpr, page_size, off_ptr, NB: tl.constexpr,
                       RADIX_BITS: tl.constexpr, STRIDE: tl.constexpr, CHUNKS: tl.constexpr):
    """The top-k of one row from its ``total`` (``top_k <= total <= NB``) candidates, in a block
    of ``NB`` elements: the positions ``0 .. total-1`` of a direct row (no chunks), else the
    chunks' candidate lists (int32 ``counts[CHUNKS]`` entries each, zero past ``n_chunks``)
    concatenated in chunk order (= position order), each ``STRIDE`` entries apart in
    ``cand_ptr``. Writes ``top_k`` positions, ascending, through the transform epilogue."""
    idx = tl.arange(0, NB)
    valid = idx < total
    if n_chunks > 0:
        ends = tl.cumsum(counts, axis=0)      # one past each chunk's last block entry
        # the chunk of entry i: the number of chunks ending at or before it, by a binary search
        # over the non-decreasing ends (an empty chunk ends where it starts: passed over)
        chunk = tl.zeros([NB], dtype=tl.int32)
        for j in tl.static_range(1, 17):  # CHUNKS / 2, ..., 1 (CHUNKS <= 2^16: MAX_CHUNKS)
            if (CHUNKS >> j) > 0:
                chunk += tl.where(tl.gather(ends, chunk + ((CHUNKS >> j) - 1), axis=0) <= idx,
                                  CHUNKS >> j, 0)
        start = tl.gather(ends - counts, tl.minimum(chunk, CHUNKS - 1), axis=0)
        src = (row.to(tl.int64) * max_chunks + chunk) * STRIDE + idx - start
        pos = tl.load(cand_ptr + src, mask=valid, other=0)
    else:
        pos = idx
    key = tl.where(valid, _order_key(tl.load(base + pos, mask=valid, other=0.0)), 0)
    T, n_ge = _kth_largest_key(key, top_k, RADIX_BITS)  # T >= 1: invalid (key 0) never match
    if tl.where(n_ge < 0, total, n_ge) == top_k:
        sel = key >= T      # no tie at T beyond the k-th: every key >= T is taken
    else:
        gt = key > T
        eq = key == T
        need = top_k - tl.sum(gt.to(tl.int32), axis=0)
        sel = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    res = _transform_positions(pos, row, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ,
                               page_size, off_ptr)
    tl.store(out_row + slot, res, mask=sel)


@triton.jit
def _topk_select_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr, cnt_ptr,
                        max_chunks, chunk_size, out_ptr, stride_o, top_k,
                        bt_ptr, stride_bt, req_ptr, page_size, off_ptr,
                        METHOD: tl.constexpr, HAS_REQ: tl.constexpr, CAP: tl.constexpr,
                        BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, STRIDE: tl.constexpr,
                        CHUNKS: tl.constexpr, SMALL: tl.constexpr):
    """Sample path, one program per row: ``_select_row``."""
    _select_row(tl.program_id(0), logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr,
                cnt_ptr, max_chunks, chunk_size, out_ptr, stride_o, top_k, bt_ptr, stride_bt,
                req_ptr, page_size, off_ptr, METHOD, HAS_REQ, CAP, BLOCK, RADIX_BITS, STRIDE,
                CHUNKS, SMALL)


@triton.jit
def _radix_window_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr, cnt_ptr,
                         max_chunks, chunk_size, out_ptr, stride_o, top_k, bt_ptr, stride_bt,
                         req_ptr, page_size, off_ptr, win_ptr, hist_ptr, list_cnt_ptr,
                         METHOD: tl.constexpr, HAS_REQ: tl.constexpr, CAP: tl.constexpr,
                         BLOCK: tl.constexpr, SAMPLE: tl.constexpr, NB: tl.constexpr,
                         NB_BITS: tl.constexpr, STRIDE: tl.constexpr, CHUNKS: tl.constexpr):
    """Radix path, one program per row. Short rows (no chunks): their whole top-k
    (``_select_row``). Long rows: zero the row's histogram and list counter, and store the
    window (``t_lo`` key, bin ``shift``) from a strided sample of ``SAMPLE`` values."""
    row = tl.program_id(0)
    n_chunks = tl.load(chunks_ptr + row)
    if n_chunks == 0:
        _select_row(row, logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr, cnt_ptr,
                    max_chunks, chunk_size, out_ptr, stride_o, top_k, bt_ptr, stride_bt,
                    req_ptr, page_size, off_ptr, METHOD, HAS_REQ, CAP, BLOCK, 1, STRIDE, CHUNKS)
    else:
        length = tl.minimum(tl.load(len_ptr + row), n_cols)
        base = logits_ptr + row.to(tl.int64) * stride_l
        i = tl.arange(0, SAMPLE).to(tl.int64)
        key = _order_key(tl.load(base + (i * length) // SAMPLE))
        # sample rank of the k-th largest, +- 5 standard deviations (binomial) and one
        r = tl.minimum(tl.maximum((SAMPLE * top_k + length - 1) // tl.maximum(length, 1), 1),
                       SAMPLE)
        margin = (5.0 * tl.sqrt(r.to(tl.float32))).to(tl.int32) + 1
        r_lo = tl.minimum(r + margin, SAMPLE)
        r_hi = tl.maximum(r - margin, 1)
        t_lo = _windowed_rank_key(key, r_lo, tl.minimum(r_lo + r_lo // 4, SAMPLE))
        t_hi = _windowed_rank_key(key, tl.maximum((3 * r_hi) // 4, 1), r_hi)
        d = tl.where(t_hi > t_lo, t_hi - t_lo, 0)
        # bit length of d (a float conversion may over-estimate it by one: coarser bins only)
        nbits = tl.where(d == 0, 0, ((d.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF)
                         - 126)
        shift = tl.maximum(nbits - (NB_BITS - 1), 0)  # the window fills bins < NB / 2
        tl.store(win_ptr + 2 * row, t_lo.to(tl.int32, bitcast=True))
        tl.store(win_ptr + 2 * row + 1, shift)
        j = tl.arange(0, NB)
        tl.store(hist_ptr + row * NB + j, tl.zeros([NB], dtype=tl.int32))
        tl.store(list_cnt_ptr + row, 0)


@triton.jit
def _block_keys(base, p, end, MASKED: tl.constexpr):
    """Keys of positions ``p`` and their validity (MASKED: ``p < end``, else all valid)."""
    if MASKED:
        m = p < end
        key = _order_key(tl.load(base + p, mask=m, other=0.0))
    else:
        m = p >= 0
        key = _order_key(tl.load(base + p))
    return key, m


@triton.jit
def _radix_bin(key, m, t_lo, shift, NB: tl.constexpr):
    """int32 bin of each key: ``min((key - t_lo) >> shift, NB - 1)`` for valid keys
    ``>= t_lo``, else -1 (bins grow with the key)."""
    b = tl.minimum((key - t_lo) >> shift, tl.full([], NB - 1, tl.uint32))
    return tl.where(m & (key >= t_lo), b.to(tl.int32), -1)


@triton.jit
def _radix_row_state(row, len_ptr, n_cols, chunks_ptr, chunk_size, win_ptr, hist_ptr, top_k,
                     NB: tl.constexpr, LIST: tl.constexpr):
    """From a long row's finished histogram: the bin ``tb`` holding its k-th largest key, the
    rank ``kp`` of that key within the bin, the bin's count, and whether the fast path holds
    (the k-th key lies in a window bin below the last, the bin fits the list, the plan's
    chunks cover the row)."""
    length = tl.minimum(tl.load(len_ptr + row), n_cols)
    n_chunks = tl.load(chunks_ptr + row)
    j = tl.arange(0, NB)
    h = tl.load(hist_ptr + row * NB + j)
    ge = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # count of keys in bins >= j
    tb = tl.max(tl.where(ge >= top_k, j, -1), axis=0)
    h_tb = tl.sum(tl.where(j == tb, h, 0), axis=0)
    kp = top_k - (tl.sum(tl.where(j == tb, ge, 0), axis=0) - h_tb)
    covered = n_chunks.to(tl.int64) * chunk_size >= length
    ok = (tb >= 0) & (tb < NB - 1) & (h_tb <= LIST) & covered
    t_lo = tl.load(win_ptr + 2 * row).to(tl.uint32, bitcast=True)
    shift = tl.load(win_ptr + 2 * row + 1).to(tl.uint32)
    return tb, kp, h_tb, ok, t_lo, shift, length


@triton.jit
def _hist_block(base, p, end, t_lo, shift, hrow, NB: tl.constexpr, MASKED: tl.constexpr):
    key, m = _block_keys(base, p, end, MASKED)
    bn = _radix_bin(key, m, t_lo, shift, NB)
    tl.atomic_add(hrow + bn, 1, mask=(bn >= 0) & (bn < NB - 1), sem="relaxed")
    return tl.sum((bn == NB - 1).to(tl.int32), axis=0)


@triton.jit
def _radix_hist_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, chunk_size, win_ptr,
                       hist_ptr, NB: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of a long row: add its window histogram into the row's (atomics; the last
    bin, everything above the window, counted here and added once)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if chunk < tl.load(chunks_ptr + row):
        length = tl.minimum(tl.load(len_ptr + row), n_cols)
        base = logits_ptr + row.to(tl.int64) * stride_l
        t_lo = tl.load(win_ptr + 2 * row).to(tl.uint32, bitcast=True)
        shift = tl.load(win_ptr + 2 * row + 1).to(tl.uint32)
        hrow = hist_ptr + row * NB
        start = chunk * chunk_size
        end = tl.minimum(start + chunk_size, length)
        n_full = tl.maximum(end - start, 0) // BLOCK
        top = 0
        for it in range(0, n_full):
            top += _hist_block(base, start + it * BLOCK + tl.arange(0, BLOCK), end, t_lo, shift,
                               hrow, NB, False)
        top += _hist_block(base, start + n_full * BLOCK + tl.arange(0, BLOCK), end, t_lo, shift,
                           hrow, NB, True)
        if top > 0:
            tl.atomic_add(hrow + NB - 1, top, sem="relaxed")


@triton.jit
def _collect_block(base, p, end, t_lo, shift, tb, list_cnt_ptr, lpos, lkey, NB: tl.constexpr,
                   MASKED: tl.constexpr):
    key, m = _block_keys(base, p, end, MASKED)
    bn = _radix_bin(key, m, t_lo, shift, NB)
    inb = bn == tb
    n_in = tl.sum(inb.to(tl.int32), axis=0)
    if n_in > 0:
        slot = tl.atomic_add(list_cnt_ptr, n_in, sem="relaxed") + tl.cumsum(inb.to(tl.int32),
                                                                            axis=0) - 1
        tl.store(lpos + slot, p, mask=inb)
        tl.store(lkey + slot, key.to(tl.int32, bitcast=True), mask=inb)
    return tl.sum((bn > tb).to(tl.int32), axis=0)


@triton.jit
def _radix_collect_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, chunk_size, win_ptr,
                          hist_ptr, list_cnt_ptr, list_pos_ptr, list_key_ptr, sure_ptr,
                          max_chunks, top_k, NB: tl.constexpr, LIST: tl.constexpr,
                          BLOCK: tl.constexpr):
    """One chunk of a long row: count its keys in bins above the k-th key's bin (stored per
    chunk) and append the positions and keys of that bin to the row's list (unordered)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if chunk < tl.load(chunks_ptr + row):
        tb, kp, h_tb, ok, t_lo, shift, length = _radix_row_state(
            row, len_ptr, n_cols, chunks_ptr, chunk_size, win_ptr, hist_ptr, top_k, NB, LIST)
        if ok:
            base = logits_ptr + row.to(tl.int64) * stride_l
            lpos = list_pos_ptr + row * LIST
            lkey = list_key_ptr + row * LIST
            start = chunk * chunk_size
            end = tl.minimum(start + chunk_size, length)
            n_full = tl.maximum(end - start, 0) // BLOCK
            n_sure = 0
            for it in range(0, n_full):
                n_sure += _collect_block(base, start + it * BLOCK + tl.arange(0, BLOCK), end,
                                         t_lo, shift, tb, list_cnt_ptr + row, lpos, lkey, NB,
                                         False)
            n_sure += _collect_block(base, start + n_full * BLOCK + tl.arange(0, BLOCK), end,
                                     t_lo, shift, tb, list_cnt_ptr + row, lpos, lkey, NB, True)
            tl.store(sure_ptr + row * max_chunks + chunk, n_sure)


@triton.jit
def _output_block(base, p, end, t_lo, shift, tb, T, p_cut, before, out_row, row,
                  METHOD: tl.constexpr, bt_ptr, stride_bt, req_ptr, HAS_REQ: tl.constexpr,
                  page_size, off_ptr, NB: tl.constexpr, MASKED: tl.constexpr):
    key, m = _block_keys(base, p, end, MASKED)
    bn = _radix_bin(key, m, t_lo, shift, NB)
    sel = (bn > tb) | ((bn == tb) & ((key > T) | ((key == T) & (p <= p_cut))))
    slot = before + tl.cumsum(sel.to(tl.int32), axis=0) - 1
    res = _transform_positions(p, row, METHOD, bt_ptr, stride_bt, req_ptr, HAS_REQ, page_size,
                               off_ptr)
    tl.store(out_row + slot, res, mask=sel)
    return before + tl.sum(sel.to(tl.int32), axis=0)


@triton.jit
def _radix_output_kernel(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, chunk_size, win_ptr,
                         hist_ptr, list_pos_ptr, list_key_ptr, sure_ptr, max_chunks, out_ptr,
                         stride_o, top_k, bt_ptr, stride_bt, req_ptr, page_size, off_ptr,
                         METHOD: tl.constexpr, HAS_REQ: tl.constexpr, NB: tl.constexpr,
                         LIST: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk of a long row: from the row's list, the exact k-th key ``T`` and the last
    position ``p_cut`` of the ties taken; write the chunk's selected positions at their ranks
    (chunk 0 runs the exact whole-row path instead when the fast path does not hold)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    if chunk < tl.load(chunks_ptr + row):
        tb, kp, h_tb, ok, t_lo, shift, length = _radix_row_state(
            row, len_ptr, n_cols, chunks_ptr, chunk_size, win_ptr, hist_ptr, top_k, NB, LIST)
        base = logits_ptr + row.to(tl.int64) * stride_l
        out_row = out_ptr + row.to(tl.int64) * stride_o
        if ok:
            li = tl.arange(0, LIST)
            lv = li < h_tb
            lk = tl.load(list_key_ptr + row * LIST + li, mask=lv, other=0).to(tl.uint32,
                                                                               bitcast=True)
            lp = tl.load(list_pos_ptr + row * LIST + li, mask=lv, other=0)
            T, _ = _kth_largest_key(lk, kp, 1)  # unused slots carry key 0: never counted
            need = kp - tl.sum((lk > T).to(tl.int32), axis=0)  # ties at T taken, >= 1
            eqm = lv & (lk == T)
            # the need-th smallest tie position = the need-th largest of ~pos (>= 2^31)
            cut, _ = _kth_largest_key(tl.where(eqm, (~lp).to(tl.uint32, bitcast=True), 0), need, 1)
            p_cut = ~(cut.to(tl.int32, bitcast=True))
            start = chunk * chunk_size
            lsel = lv & ((lk > T) | (eqm & (lp <= p_cut)))
            c = tl.arange(0, CHUNKS_P2)
            before = (tl.sum(tl.load(sure_ptr + row * max_chunks + c, mask=c < chunk, other=0),
                             axis=0)
                      + tl.sum((lsel & (lp < start)).to(tl.int32), axis=0))
            end = tl.minimum(start + chunk_size, length)
            n_full = tl.maximum(end - start, 0) // BLOCK
            for it in range(0, n_full):
                before = _output_block(base, start + it * BLOCK + tl.arange(0, BLOCK), end, t_lo,
                                       shift, tb, T, p_cut, before, out_row, row, METHOD, bt_ptr,
                                       stride_bt, req_ptr, HAS_REQ, page_size, off_ptr, NB,
                                       False)
            _output_block(base, start + n_full * BLOCK + tl.arange(0, BLOCK), end, t_lo, shift,
                          tb, T, p_cut, before, out_row, row, METHOD, bt_ptr, stride_bt, req_ptr,
                          HAS_REQ, page_size, off_ptr, NB, True)
        elif chunk == 0:  # (a row shorter than planned: no k-th key in the histogram)
            if length <= top_k:
                _passthrough_row(length, top_k, out_row, row, METHOD, bt_ptr, stride_bt,
                                 req_ptr, HAS_REQ, page_size, off_ptr, BLOCK)
            else:
                _exact_row(base, length, top_k, out_row, row, METHOD, bt_ptr, stride_bt,
                           req_ptr, HAS_REQ, page_size, off_ptr, BLOCK)


# ----------------------------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------------------------


@dataclass
class TopkPlan:
    """What ``plan_topk`` decided for one step's lengths; consumed by every top-k call.

    Attributes:
        top_k: k the plan was built for.
        batch: number of rows ``B``.
        max_len: longest row (host int): sizes the grids.
        lengths: int32 ``[B]`` row lengths (device).
        row_chunks: int32 ``[B]`` (device): 0 for rows handled by one select program
            (pass-through ``L <= top_k`` or direct ``L <= cap``), else the number of scan
            programs the row is split over, ``ceil(L / chunk_size)``.
        cap: the candidate capacity the plan was built for (elements;
            ``candidate_capacity(top_k, cap_factor)``): rows longer than it are split into scan
            chunks, and it is the capacity (stride) of each chunk's candidate list. A launch
            uses ``candidate_capacity(top_k, launch.cap_factor)``, which must not exceed it.
        cap_factor: the ``plan_topk(cap_factor=)`` it was built with.
        chunk_size: elements per scan program.
        max_chunks: ``ceil(max_len / chunk_size)`` if any row is long, else 0 (no scan launch).
        candidates: int32 ``[B, max_chunks, cap]`` scratch (positions of candidates; per chunk
            at most ``cap``, in position order).
        counts: int32 ``[B, max_chunks]`` scratch (candidates per chunk).
        thresholds: int32 ``[B]`` scratch (threshold keys, uint32 bit patterns).
        radix_window: int32 ``[B', 2]`` scratch of the radix path (window key, bin shift);
            ``B' = B`` when some row is long, else 0 (as for the other ``radix_*``).
        radix_hist: int32 ``[B', RADIX_BINS]`` scratch (per-row window histograms; zeroed by
            the radix path's first kernel of every call).
        radix_list_count: int32 ``[B']`` scratch (entries in each row's list; zeroed likewise).
        radix_list_pos / radix_list_key: int32 ``[B', RADIX_LIST]`` scratch (positions and keys
            of the k-th key's bin).
        radix_sure: int32 ``[B', max_chunks]`` scratch (per chunk: keys above that bin).
        uses: number of top-k calls that consumed this plan.
    """

    top_k: int
    batch: int
    max_len: int
    lengths: torch.Tensor
    row_chunks: torch.Tensor
    cap: int
    chunk_size: int
    max_chunks: int
    candidates: torch.Tensor
    counts: torch.Tensor
    thresholds: torch.Tensor
    radix_window: torch.Tensor
    radix_hist: torch.Tensor
    radix_list_count: torch.Tensor
    radix_list_pos: torch.Tensor
    radix_list_key: torch.Tensor
    radix_sure: torch.Tensor
    cap_factor: int = CAP_FACTOR
    uses: int = field(default=0)

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    @property
    def needs_scan(self) -> bool:
        """True when some row is longer than ``cap`` (threshold + scan kernels launch)."""
        return self.max_chunks > 0


def plan_topk(seq_lens: torch.Tensor, top_k: int, *, max_len: Optional[int] = None,
              chunk_size: Optional[int] = None, num_sms: Optional[int] = None,
              cap_factor: int = CAP_FACTOR) -> TopkPlan:
    """Plan the top-k of one step from the row lengths alone (reuse it for every layer).

    Args:
        seq_lens: int32 ``[B]`` row lengths (>= 0), on the device the logits will be on.
        top_k: k (>= 1; may exceed every length: rows are then -1 padded).
        max_len: ``max(seq_lens)`` if the caller knows it (avoids a device->host sync; the
            caller then vouches for ``seq_lens >= 0`` on the GPU). Rows longer than ``max_len``
            stay correct (they take the exact fallback) but slow.
        chunk_size: elements per scan program (power of two >= 16, and large enough that the
            longest row takes at most ``MAX_CHUNKS``); default: chosen so the long rows give
            about 4 programs per SM, at least ``MIN_CHUNK``.
        num_sms: SM count (default: the device's; 132 on the CPU).
        cap_factor: the candidate capacity ``cap = candidate_capacity(top_k, cap_factor)``
            (a power of two >= 2; default 4): rows longer than it are scanned in chunks, and it
            sizes the chunks' candidate lists ``[B, max_chunks, cap]``. Launches with this
            ``TopkLaunch.cap_factor`` or a smaller one may use the plan (smaller: rows of
            ``CAP < L <= cap`` take the exact whole-row fallback).
    Returns:
        A ``TopkPlan`` (small tensors plus scratch buffers).
    """
    global _PLAN_BUILDS
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        raise ValueError("seq_lens must be a 1-D int32 tensor")
    B = seq_lens.shape[0]
    dev = seq_lens.device
    if max_len is None or seq_lens.device.type == "cpu":  # (a sync only when max_len is None)
        if B and bool((seq_lens < 0).any()):
            raise ValueError("seq_lens must be >= 0")
    if max_len is None:
        max_len = int(seq_lens.max().item()) if B else 0
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    _check_cap_factor("cap_factor", cap_factor)
    cap = candidate_capacity(top_k, cap_factor)
    if chunk_size is None:
        target = 4 * (num_sms or _num_sms(dev))
        chunk_size = max(MIN_CHUNK, _next_pow2(triton.cdiv(max(B * max_len, 1), target)))
        chunk_size = min(chunk_size, max(MIN_CHUNK, _next_pow2(max_len)))
    elif chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size}")
    long_rows = max_len > cap
    max_chunks = triton.cdiv(max_len, chunk_size) if long_rows else 0
    if max_chunks > MAX_CHUNKS:
        raise ValueError(f"chunk_size={chunk_size} splits a row of {max_len} elements into "
                         f"{max_chunks} chunks, more than the scan's grid takes ({MAX_CHUNKS}): "
                         f"use chunk_size >= {_next_pow2(triton.cdiv(max_len, MAX_CHUNKS))}")
    lens = seq_lens.clamp_min(0)
    row_chunks = torch.where(lens > cap, (lens + chunk_size - 1) // chunk_size,
                             torch.zeros_like(lens)).clamp_max(max_chunks).to(torch.int32)
    _PLAN_BUILDS += 1
    nr = B if long_rows else 0

    def scratch(*shape):
        return torch.zeros((nr, *shape), dtype=torch.int32, device=dev)

    return TopkPlan(
        top_k=top_k, batch=B, max_len=max_len, lengths=seq_lens, row_chunks=row_chunks, cap=cap,
        chunk_size=chunk_size, max_chunks=max_chunks,
        candidates=torch.empty((B, max_chunks, cap), dtype=torch.int32, device=dev),
        counts=torch.zeros((B, max_chunks), dtype=torch.int32, device=dev),
        thresholds=torch.zeros((B,), dtype=torch.int32, device=dev),
        radix_window=scratch(2), radix_hist=scratch(RADIX_BINS), radix_list_count=scratch(),
        radix_list_pos=scratch(RADIX_LIST), radix_list_key=scratch(RADIX_LIST),
        radix_sure=scratch(max_chunks), cap_factor=cap_factor,
    )


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def validate_topk_inputs(logits: torch.Tensor, lengths: torch.Tensor, top_k: int) -> None:
    """Torch-side checks that read data (device sync; call outside timed regions).

    Raises ValueError unless every length is in ``[0, logits.shape[1]]`` and no logit inside a
    row's length is NaN (``-inf`` / ``+inf`` are allowed).
    """
    _check_topk_shapes(logits, lengths, top_k)
    if lengths.numel():
        if bool((lengths < 0).any()):
            raise ValueError("lengths must be >= 0")
        if bool((lengths > logits.shape[1]).any()):
            raise ValueError(f"lengths must be <= logits.shape[1] = {logits.shape[1]}")
        cols = torch.arange(logits.shape[1], device=logits.device)
        inside = cols[None, :] < lengths[:, None]
        if bool((torch.isnan(logits) & inside).any()):
            raise ValueError("logits contain NaN inside a row's length")


def _check_topk_shapes(logits: torch.Tensor, lengths: torch.Tensor, top_k: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError("logits must be a float32 [B, N] tensor")
    if logits.shape[1] > 0 and logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along its last dimension")
    if (not isinstance(lengths, torch.Tensor) or lengths.dtype != torch.int32
            or lengths.shape != (logits.shape[0],)):
        raise ValueError(f"lengths must be an int32 tensor of shape [{logits.shape[0]}]")
    if lengths.device != logits.device:
        raise ValueError(f"lengths is on {lengths.device}, logits on {logits.device}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")


def _check_plan(plan: TopkPlan, logits: torch.Tensor, lengths: torch.Tensor, top_k: int) -> None:
    if not isinstance(plan, TopkPlan):
        raise ValueError("plan must be a TopkPlan from plan_topk()")
    if plan.top_k != top_k:
        raise ValueError(f"plan was built for top_k={plan.top_k}, called with top_k={top_k}")
    if plan.batch != logits.shape[0]:
        raise ValueError(f"plan was built for {plan.batch} rows, logits have {logits.shape[0]}")
    if plan.device != logits.device:
        raise ValueError(f"plan is on {plan.device}, logits on {logits.device}")
    if plan.lengths is not lengths and (plan.lengths.data_ptr() != lengths.data_ptr()):
        raise ValueError("plan was built for a different lengths tensor")


def launch_topk(logits: torch.Tensor, lengths: torch.Tensor, top_k: int, plan: TopkPlan,
                out: torch.Tensor, method: int = METHOD_NONE, block_table: Optional[torch.Tensor] = None,
                row_req: Optional[torch.Tensor] = None, page_size: int = 1,
                row_offsets: Optional[torch.Tensor] = None,
                launch: TopkLaunch = TopkLaunch()) -> torch.Tensor:
    """Launch the planned kernels (no validation: callers validate). ``out``: int32 [B, top_k]."""
    B, N = logits.shape
    plan.uses += 1
    if B == 0:
        return out
    dummy = lengths
    bt = block_table if block_table is not None else dummy
    stride_bt = block_table.stride(0) if block_table is not None else 0
    req = row_req if row_req is not None else dummy
    offs = row_offsets if row_offsets is not None else dummy
    cap, sample, threshold = _launch_params(launch, top_k)
    if cap > plan.cap:
        launch_capacity(launch, top_k, plan)  # raises
    if plan.needs_scan and launch.algorithm == "radix":
        _launch_radix(logits, lengths, top_k, plan, out, method, bt, stride_bt, req,
                      row_req is not None, page_size, offs, launch, cap, sample)
        return out
    if plan.needs_scan:
        if not launch.fuse_threshold:
            _topk_threshold_kernel[(B,)](logits, logits.stride(0), N, lengths, plan.thresholds,
                                         CAP=cap, SAMPLE=sample, RADIX_BITS=launch.radix_bits,
                                         **threshold, num_warps=launch.threshold_warps)
        _topk_scan_kernel[(B, plan.max_chunks)](
            logits, logits.stride(0), N, lengths, plan.row_chunks, plan.thresholds,
            plan.candidates, plan.counts, plan.chunk_size, plan.max_chunks,
            CAP=plan.cap, BLOCK=_sample_scan_block(launch, plan),
            FUSE_THRESHOLD=launch.fuse_threshold, SAMPLE=sample,
            RADIX_BITS=launch.radix_bits, **threshold,
            num_warps=launch.scan_warps, num_stages=launch.scan_stages)
    _topk_select_kernel[(B,)](
        logits, logits.stride(0), N, lengths, plan.row_chunks, plan.candidates, plan.counts,
        max(plan.max_chunks, 1), plan.chunk_size, out, out.stride(0), top_k,
        bt, stride_bt, req, page_size, offs,
        METHOD=method, HAS_REQ=row_req is not None, CAP=cap,
        BLOCK=min(launch.scan_block_max, cap), RADIX_BITS=launch.radix_bits, STRIDE=plan.cap,
        CHUNKS=_chunks_block(plan), SMALL=_small_block(launch, plan, cap),
        num_warps=_select_warps(launch, cap), num_stages=launch.select_stages)
    return out


@functools.lru_cache(maxsize=1024)
def _launch_params(launch: TopkLaunch, top_k: int):
    """``(CAP, SAMPLE, threshold)`` of ``launch`` at ``top_k``: the threshold and scan kernels'
    keyword arguments (the targets, ``long_row`` and the windows' fractions), cached (the
    fractions cost ~8 us of host time per call otherwise)."""
    cap = candidate_capacity(top_k, launch.cap_factor)
    _, lo, hi = launch_ratios(launch)
    _, llo, lhi = launch_ratios(launch, long=True)
    threshold = dict(target=sample_target(top_k, launch),
                     target_long=sample_target(top_k, launch, long=True),
                     long_row=2 ** 31 - 1 if launch.long_row is None else min(launch.long_row,
                                                                               2 ** 31 - 1),
                     WINDOW=launch.threshold_window, WLO_N=lo.numerator, WLO_D=lo.denominator,
                     WHI_N=hi.numerator, WHI_D=hi.denominator, LLO_N=llo.numerator,
                     LLO_D=llo.denominator, LHI_N=lhi.numerator, LHI_D=lhi.denominator)
    return cap, min(launch.sample_max, cap), threshold


def launch_capacity(launch: TopkLaunch, top_k: int, plan: Optional[TopkPlan] = None) -> int:
    """The select's candidate capacity ``CAP`` of ``launch`` at ``top_k`` (elements,
    ``candidate_capacity(top_k, launch.cap_factor)``); raises ValueError when it exceeds the
    plan's (its candidate lists would be too small)."""
    cap = candidate_capacity(top_k, launch.cap_factor)
    if plan is not None and cap > plan.cap:
        raise ValueError(f"TopkLaunch.cap_factor={launch.cap_factor} needs a candidate capacity "
                         f"of {cap} at top_k={top_k}, more than the plan's {plan.cap}: build the "
                         f"plan with plan_topk(..., cap_factor={launch.cap_factor})")
    return cap


def _sample_scan_block(launch: TopkLaunch, plan: TopkPlan) -> int:
    """Elements per iteration of the sample path's scan (a power of two): at most
    ``scan_block_max``, and small enough that a chunk takes ``scan_stages`` iterations (H200,
    B=64, 32K, the 1-D prefix-sum scan: 4096-element chunks in 1024-element blocks 43.0 us, in
    2048-element blocks 46.8 us; 128K: 16384-element chunks unchanged). Compiled for sm_90a the
    scan's loads are not software-pipelined at any ``scan_stages`` (Triton pipelines loads that
    feed a dot), so ``scan_stages`` acts through this block size only."""
    per_stage = max(16, plan.chunk_size // launch.scan_stages)
    return min(launch.scan_block_max, 1 << (per_stage.bit_length() - 1))   # a power of two


def _small_block(launch: TopkLaunch, plan: TopkPlan, cap: int) -> int:
    """The select's half block (``TopkLaunch.small_select``; 0: none): ``cap // 2`` when it
    still holds ``2 k`` and no row of the call is longer than ``long_row``."""
    use = (launch.small_select and cap >= 2 * plan.top_k
           and (launch.long_row is None or plan.max_len <= launch.long_row))
    return cap // 2 if use else 0


def _chunks_block(plan: TopkPlan) -> int:
    """The select's block over a row's chunk counts: a power of two >= ``plan.max_chunks``."""
    return _next_pow2(max(plan.max_chunks, 1))


def _select_warps(launch: TopkLaunch, cap: int) -> int:
    """The select program's warps (``cap``: the launch's candidate capacity)."""
    return launch.select_warps if cap >= 4096 else min(launch.select_warps, 8)


def _launch_radix(logits, lengths, top_k, plan, out, method, bt, stride_bt, req, has_req,
                  page_size, offs, launch, cap, sample):
    """The radix path's four kernels (module docstring); fixed grids, no host sync. ``cap``:
    the launch's candidate capacity (the direct rows' select), ``sample``: its sample size."""
    B, N = logits.shape
    sl = logits.stride(0)
    C = plan.max_chunks
    block = min(launch.scan_block_max, plan.chunk_size)
    chunk_kw = dict(num_warps=launch.scan_warps, num_stages=launch.scan_stages)
    _radix_window_kernel[(B,)](
        logits, sl, N, lengths, plan.row_chunks, plan.candidates, plan.counts, C,
        plan.chunk_size, out, out.stride(0), top_k, bt, stride_bt, req, page_size, offs,
        plan.radix_window, plan.radix_hist, plan.radix_list_count,
        METHOD=method, HAS_REQ=has_req, CAP=cap,
        BLOCK=min(launch.scan_block_max, cap), SAMPLE=sample, NB=RADIX_BINS,
        NB_BITS=RADIX_BINS.bit_length() - 1, STRIDE=plan.cap, CHUNKS=_chunks_block(plan),
        num_warps=_select_warps(launch, cap), num_stages=launch.select_stages)
    _radix_hist_kernel[(B, C)](logits, sl, N, lengths, plan.row_chunks, plan.chunk_size,
                               plan.radix_window, plan.radix_hist, NB=RADIX_BINS, BLOCK=block,
                               **chunk_kw)
    _radix_collect_kernel[(B, C)](
        logits, sl, N, lengths, plan.row_chunks, plan.chunk_size, plan.radix_window,
        plan.radix_hist, plan.radix_list_count, plan.radix_list_pos, plan.radix_list_key,
        plan.radix_sure, C, top_k, NB=RADIX_BINS, LIST=RADIX_LIST, BLOCK=block, **chunk_kw)
    _radix_output_kernel[(B, C)](
        logits, sl, N, lengths, plan.row_chunks, plan.chunk_size, plan.radix_window,
        plan.radix_hist, plan.radix_list_pos, plan.radix_list_key, plan.radix_sure, C, out,
        out.stride(0), top_k, bt, stride_bt, req, page_size, offs,
        METHOD=method, HAS_REQ=has_req, NB=RADIX_BINS, LIST=RADIX_LIST,
        CHUNKS_P2=_next_pow2(C), BLOCK=block, **chunk_kw)


def topk_per_row(logits: torch.Tensor, lengths: torch.Tensor, top_k: int, *,
                 plan: Optional[TopkPlan] = None, out: Optional[torch.Tensor] = None,
                 check: bool = False, launch: TopkLaunch = TopkLaunch()) -> torch.Tensor:
    """Top-``top_k`` positions of each row's first ``lengths[b]`` logits.

    Args:
        logits: float32 ``[B, N]`` (last dim contiguous); entries past a row's length are ignored.
        lengths: int32 ``[B]`` valid length of each row (``0 <= lengths[b] <= N``).
        top_k: k >= 1 (may exceed the lengths: the row is then -1 padded).
        plan: a ``plan_topk(lengths, top_k)`` result to reuse (built here if None, with the
            launch's cap_factor); its ``cap_factor`` must be >= the launch's.
        out: optional int32 ``[B, top_k]`` output.
        check: also run ``validate_topk_inputs`` (syncs; reads the data).
        launch: the kernels' launch configuration.
    Returns:
        int32 ``[B, top_k]``: selected positions in ascending order, then ``-1`` where the row
        has fewer than ``top_k`` elements. Ties at the k-th value go to lower positions.
    """
    _check_topk_shapes(logits, lengths, top_k)
    if check:
        validate_topk_inputs(logits, lengths, top_k)
    if plan is None:
        plan = plan_topk(lengths, top_k, cap_factor=launch.cap_factor)
    _check_plan(plan, logits, lengths, top_k)
    launch_capacity(launch, top_k, plan)
    out = _check_out(out, logits, top_k)
    return launch_topk(logits, lengths, top_k, plan, out, launch=launch)


def _check_out(out: Optional[torch.Tensor], logits: torch.Tensor, top_k: int) -> torch.Tensor:
    B = logits.shape[0]
    if out is None:
        return torch.empty((B, top_k), dtype=torch.int32, device=logits.device)
    if out.dtype != torch.int32 or out.shape != (B, top_k) or out.device != logits.device \
            or (top_k > 1 and out.stride(1) != 1):
        raise ValueError(f"out must be an int32 [{B}, {top_k}] tensor on {logits.device}, "
                         f"contiguous along its last dimension")
    return out
