"""``swap_in``: the HiSparse swap-in (``HiSparseCoordinator``: resolve kernel + copy engines).

Cases (default sizes: fp8_ds_mla rows of 656 B, top_k 2048, device_buffer_size 4096, 64-token
pages; ``--quick``: ``QUICK``):

* ``all_misses``: one request, every call ``top_k`` never-resident rows scattered over a 1 M-row
  host pool (``context_len``): ``swap_in_selected_pages`` per copy engine; then ``copy`` alone
  replaying that call's miss plan (``scattered_rows``) and the same bytes from contiguous rows
  (``contiguous_rows``); the ``uva_kernel`` copy per rows-per-program (``variant`` rowsN).
* ``all_hits``: batch 64, every selected token resident (and the newest): the swap-in per
  engine, and ``resolve_selection`` alone at batch 64 and at batch 1.
* ``steady_state``: batch 64, each step keeping 85 % of the previous step's selection
  (``step_overlap``). The steps are first run free (checked against ``harness.lru_model``:
  misses every step, device rows in the burn-in steps, the final LRU orders) and the hot-buffer
  state before each step recorded; each timed call then starts, in its untimed set-up, from the
  recorded state of its step, so every engine times the same checked steps.
* ``gather`` (issue #13): the ``uva_kernel`` copy alone (``GatherCase``): ``gather_rows`` rows
  of 656 B from host pools of ``gather_pools`` rows, per host allocation (``--host-alloc``,
  ``backends/host_memory.py``: torch's pinned allocator, pageable memory registered with
  cudaHostRegister as SGLang's pool, or a transparent-huge-page mapping registered), row
  distribution (``GATHER_DISTS``: random, sorted, a 64 MiB window,
  whole 4 KiB pages, contiguous) and launch variant (``GATHER_VARIANTS``, at the smallest
  pool), ``gather_runs`` independent runs each (fresh rows; ``seed`` = run). A pool that cannot
  be allocated is skipped with a printed reason. Printed last: GB/s of each run's median and
  the spread of those medians (``gather_summary``).
* ``context``: swap-in at equal misses vs context (batch 32, 85 % overlap, the rest never
  selected before, 16K..128K, the coordinator's own host pool, per ``--host-alloc`` and
  ``--host-page-order``): ``resolve_selection``, ``copy_planned_misses`` and
  ``swap_in_selected_pages`` timed apart, each call an exact re-run of a recorded step
  (``context``; ``context_summary`` prints resolve / copy / total per context).

``--section`` picks sections (default all); ``summary(DIR)`` reprints both summaries of a
stored run. The coordinators resolve with the Triton kernel (``ResolveLaunch()``);
``--resolve-kernel triton,cuda`` times the ``context`` section with the CUDA resolve too
(``hisparse.resolve_kernel``'s default on a GPU; ``swap_in_peer`` times it in the other cases).

Checks (before timing): the device row behind every returned slot equals the host row of the
selected position (``max_rel_err`` = fraction of wrong rows, tolerance 0; for ``copy`` rows the
planned destination rows against their sources) and the misses per request are the expected
ones. Counts are per call (``misses``, ``hits``, ``tokens_loaded``, ``bytes_h2d``; the mean over
the timed steps for ``steady_state``); ``h2d_gbps`` follows, against ``ceiling_h2d_gbps`` (one
256 MiB pinned copy, ``harness.ceilings``).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from backends.copy_engines import (COPY_ENGINES, UVA_CUDA_LAUNCH, UvaKernelEngine,
                                   uva_engine_per_sm)
from backends.hisparse_coordinator import DEFAULT_HOST_ALLOC, HOST_PAGE_ORDERS, HiSparseCoordinator
from backends.host_memory import (HOST_ALLOCS, HUGETLB_PAGE, HostRows, hugetlb_free_pages,
                                  hugetlb_shortage)
from backends.kernels.swap_in import RESOLVE_KERNELS, ResolveLaunch
from backends.kernels.swap_in_cuda import cuda_resolve_unavailable
from harness import results
from harness.env import host_virtualized
from harness.timing import HostTranslationFlusher
from harness.bench.measure import NAN, BenchRun, Check, exact
from harness.bench.registry import register
from harness.bench.table import format_table
from harness.lru_model import CoordinatorModel
from harness.memory import host_available_bytes


#: uva_kernel launch variants of the gather section: name -> ``UvaKernelEngine`` keyword
#: arguments, ``programs`` given as a multiple of the SM count (``programs_per_sm``; 0 = the
#: capacity grid). ``default`` is the coordinator's launch on CUDA (``UVA_CUDA_LAUNCH``);
#: ``capacity_rows4`` the capacity grid with 4 rows a program (the default before 2026-12-02).
GATHER_VARIANTS: Dict[str, Dict[str, object]] = {
    "default": dict(UVA_CUDA_LAUNCH),
    "capacity_rows4": {},
    "rows1_w1": dict(rows_per_program=1, num_warps=1),
    "rows2_w2": dict(rows_per_program=2, num_warps=2),
    "rows8_w4": dict(rows_per_program=8, num_warps=4),
    "rows8_w8": dict(rows_per_program=8, num_warps=8),
    "rows16_w8": dict(rows_per_program=16, num_warps=8),
    "rows32_w8": dict(rows_per_program=32, num_warps=8),
    "rows4_ldcg": dict(load_cache=".cg"),
    "rows4_ldcv": dict(load_cache=".cv"),
    "rows4_stcs": dict(store_cache=".cs"),
    "rows8_w8_cg_cs": dict(rows_per_program=8, num_warps=8, load_cache=".cg", store_cache=".cs"),
    "persist1x_rows8": dict(rows_per_program=8, num_warps=8, programs_per_sm=1),
    "persist4x_rows4": dict(rows_per_program=4, num_warps=4, programs_per_sm=4),
    "persist8x_rows2": dict(rows_per_program=2, num_warps=2, programs_per_sm=8),
    # around the default (16 one-warp programs an SM, one row each), 2026-12-02 third session
    "persist8x_rows1_w2": dict(rows_per_program=1, num_warps=2, programs_per_sm=8),
    "persist16x_rows1_w2": dict(rows_per_program=1, num_warps=2, programs_per_sm=16),
    "persist32x_rows1_w1": dict(rows_per_program=1, num_warps=1, programs_per_sm=32),
    "persist16x_rows2_w2": dict(rows_per_program=2, num_warps=2, programs_per_sm=16),
    "persist16x_rows1_w1_ldcv": dict(rows_per_program=1, num_warps=1, programs_per_sm=16,
                                     load_cache=".cv"),
    "persist16x_rows1_w1_stcs": dict(rows_per_program=1, num_warps=1, programs_per_sm=16,
                                     store_cache=".cs"),
}
#: gather row distributions (``gather_host_rows``)
GATHER_DISTS = ("random", "sorted", "window", "pages_4k", "contiguous")
SECTIONS = ("all_misses", "all_hits", "steady_state", "gather", "context")
#: host-address translations of the context section's timed calls (``--host-translations``)
HOST_TRANSLATIONS = ("cycled", "cold")
OS_PAGE = 4096


@dataclass(frozen=True)
class Sizes:
    row_bytes: int = 656
    top_k: int = 2048
    device_buffer_size: int = 4096
    page_size: int = 64
    host_rows_a: int = 1 << 20         # all_misses: host pool rows (one request's positions)
    batch: int = 64                    # all_hits, steady_state
    seq_len_b: int = 6000
    seq_len_c: int = 16384
    overlap_c: float = 0.85
    burn_in_c: int = 4                 # steady_state: free steps before the timed ones
    uva_rows_sweep: Tuple[int, ...] = (1, 2, 4, 8, 16)    # uva_kernel rows per program (default 4)
    gather_pools: Tuple[int, ...] = (1 << 20, 1 << 22, 1 << 24)  # gather: host pool rows
    gather_rows: Tuple[int, ...] = (256, 2048, 16384)             # gather: rows per copy
    gather_runs: int = 3               # gather: independent runs (fresh rows) per variant
    window_bytes: int = 64 << 20       # gather: the 'window' rows lie in one span this long
    gather_variants: Tuple[str, ...] = tuple(GATHER_VARIANTS)
    context_batch: int = 32
    context_lens: Tuple[int, ...] = (16384, 32768, 65536, 131072)
    context_timed_steps: int = 3       # context: distinct steps the timed calls cycle over
    context_variants: Tuple[str, ...] = ("default", "capacity_rows4")  # context: copy engines
    evict_bytes: int = 2 << 30         # host memory read to flush the CPU caches after set-up


FULL = Sizes()
QUICK = Sizes(row_bytes=656, top_k=32, device_buffer_size=64, page_size=8, host_rows_a=4096,
              batch=3, seq_len_b=100, seq_len_c=400, burn_in_c=2, uva_rows_sweep=(4, 16),
              gather_pools=(4096, 16384), gather_rows=(16, 64), gather_runs=2,
              window_bytes=128 * 656, gather_variants=("default", "capacity_rows4", "rows16_w8"),
              context_batch=2, context_lens=(200, 400), context_timed_steps=2,
              evict_bytes=1 << 20)


def random_rows(n: int, row_bytes: int, device: torch.device, seed: int) -> torch.Tensor:
    """Fresh random uint8 rows ``[n, row_bytes]`` on the CPU (generated on the device when CUDA)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, device=device,
                         generator=g).cpu()


def coordinator(sz: Sizes, device: torch.device, max_requests: int, max_seq_len: int,
                host_alloc: str = DEFAULT_HOST_ALLOC,
                host_page_order: str = "shuffled") -> HiSparseCoordinator:
    """A one-layer token-mode coordinator (``uva_kernel`` copies) of these sizes."""
    return HiSparseCoordinator(
        num_layers=1, max_requests=max_requests, max_seq_len=max_seq_len,
        row_bytes=sz.row_bytes, top_k=sz.top_k, device_buffer_size=sz.device_buffer_size,
        page_size=sz.page_size, copy_engine="uva_kernel", host_alloc=host_alloc,
        host_page_order=host_page_order, device=device, seed=1)


def loaded_coordinator(sz: Sizes, device: torch.device, batch: int, seq_len: int, seed: int
                       ) -> HiSparseCoordinator:
    """``coordinator`` with random host KV for requests ``0..batch-1``, prefilled to
    ``seq_len - 1`` tokens and begun on a step at ``seq_len``."""
    c = coordinator(sz, device, batch, seq_len)
    for r in range(batch):
        c.load_host_kv(0, r, random_rows(seq_len, sz.row_bytes, device, seed + r))
    c.prefill(list(range(batch)), [seq_len - 1] * batch)
    c.begin_step(list(range(batch)), [seq_len] * batch)
    return c


def row_error(c: HiSparseCoordinator, reqs: Sequence[int], sel: np.ndarray,
              out: torch.Tensor, mirror: Optional[torch.Tensor] = None) -> float:
    """Fraction of valid selected entries (``sel`` int ``[B, K]``) whose device row behind
    ``out`` (int32 ``[B, K]`` rows of ``c.device_pool(0)``) differs from the host row of that
    position (layer 0). ``mirror``: a device copy of the host pool of layer 0 to compare with
    instead (the CPU then never reads the host rows, which would leave them in its caches)."""
    pool = c.device_pool(0) if mirror is not None else c.device_pool(0).cpu()
    bad = total = 0
    for b, r in enumerate(reqs):
        live = sel[b] >= 0
        got = pool[out[b].to(pool.device)[torch.from_numpy(live).to(pool.device)].long()]
        rows = torch.from_numpy(c.host_rows_of(r, sel[b][live]))
        want = mirror[rows.to(mirror.device)] if mirror is not None else c.host_kv[0][rows].cpu()
        bad += int((got != want).any(dim=1).sum())
        total += int(live.sum())
    return bad / max(total, 1)


def swap_check(c: HiSparseCoordinator, reqs: Sequence[int], sel: torch.Tensor,
               out: torch.Tensor, misses: Sequence[int], hits: Optional[Sequence[int]] = None
               ) -> Check:
    """The latest call's device rows (``row_error``) and its misses (and hits) per request."""
    counts = {k: v.cpu().tolist() for k, v in c.last_counts.items()}
    mismatch = ""
    if counts["misses"] != list(misses):
        mismatch = f"misses per request {counts['misses']}, expected {list(misses)}"
    elif hits is not None and counts["hits"] != list(hits):
        mismatch = f"hits per request {counts['hits']}, expected {list(hits)}"
    return exact(row_error(c, reqs, sel.cpu().numpy(), out), mismatch)


def plan_check(c: HiSparseCoordinator, plan: torch.Tensor, batch: int) -> Check:
    """Every row a miss plan names (``backends/copy_engines.py``: count, host rows, device
    rows; token mode) holds its host row in the device pool of layer 0."""
    m = (plan.shape[1] - 1) // 2
    p = plan[:batch].cpu().long()
    dev = c.device_kv[0].cpu()
    bad = total = 0
    for b in range(batch):
        n = int(p[b, 0])
        src, dst = p[b, 1:1 + n], p[b, 1 + m:1 + m + n]
        bad += int((dev[dst] != c.host_kv[0][src].cpu()).any(dim=1).sum())
        total += n
    return exact(bad / max(total, 1))


def fresh_chunks(sz: Sizes, calls: int, seed: int = 3) -> np.ndarray:
    """int32 ``[calls, 1, top_k]``: disjoint positions of one request that were never resident
    (beyond the first ``device_buffer_size``), so each call of them is all misses."""
    n, K, D = sz.host_rows_a, sz.top_k, sz.device_buffer_size
    fresh = np.random.default_rng(seed).permutation(np.arange(D, n - 1)).astype(np.int32)
    if len(fresh) < calls * K:
        raise ValueError(f"host_rows_a={n} too small for {calls} calls of {K} fresh rows")
    return fresh[:calls * K].reshape(calls, 1, K)


def fresh_positions(steps: int, top_k: int, overlap: float) -> int:
    """Positions never drawn before that ``overlap_selections`` with ``fresh_from`` needs."""
    return top_k + (steps - 1) * (top_k - int(round(overlap * top_k)))


def overlap_selections(rng: np.random.Generator, steps: int, batch: int, top_k: int,
                       seq_len: int, overlap: float, fresh_from: Optional[int] = None
                       ) -> List[np.ndarray]:
    """Per step ``[batch, top_k]`` distinct positions ``< seq_len - 1``; each step keeps
    ``overlap`` of the previous step's. ``fresh_from``: every other position is drawn from
    ``[fresh_from, seq_len - 1)`` and was never drawn before (so with a hot buffer that holds the
    last two selections and prefilled positions below ``fresh_from``, each step misses exactly
    ``top_k - round(overlap * top_k)`` positions per request, whatever the context); None: the
    others are any positions outside the previous step's selection."""
    keep = int(round(overlap * top_k))
    lo = 0 if fresh_from is None else fresh_from
    if fresh_from is not None and seq_len - 1 - lo < fresh_positions(steps, top_k, overlap):
        raise ValueError(f"fresh_from={fresh_from}: [{lo}, {seq_len - 1}) holds fewer than the "
                         f"{fresh_positions(steps, top_k, overlap)} fresh positions {steps} "
                         f"steps need")
    orders = [lo + rng.permutation(seq_len - 1 - lo) for _ in range(batch)]
    prev = np.stack([o[:top_k] for o in orders])
    used = top_k
    out = [prev]
    for _ in range(steps - 1):
        rows = []
        for b in range(batch):
            kept = rng.choice(prev[b], keep, replace=False)
            if fresh_from is None:
                pool = np.setdiff1d(np.arange(seq_len - 1), prev[b], assume_unique=True)
                new = rng.choice(pool, top_k - keep, replace=False)
            else:
                new = orders[b][used:used + top_k - keep]
            rows.append(np.concatenate([kept, new]))
        used += top_k - keep
        prev = np.stack(rows)
        out.append(prev)
    return out


@dataclass
class RecordedSteps:
    """A free run of ``HiSparseCoordinator`` steps: ``states[i]`` (slot_unit, lru) of layer 0
    before step i, ``misses[i]`` per request, ``selections[i]`` int32 ``[B, K]`` on the device,
    ``row_err`` the worst ``row_error`` over the first ``checked_rows`` steps."""

    states: List[Tuple[torch.Tensor, torch.Tensor]]
    misses: List[List[int]]
    selections: List[torch.Tensor]
    row_err: float

    @classmethod
    def run(cls, c: HiSparseCoordinator, reqs: Sequence[int], seq: torch.Tensor,
            sels: Sequence[np.ndarray], checked_rows: int) -> "RecordedSteps":
        req = torch.tensor(list(reqs), dtype=torch.int32, device=c.device)
        sel_t = [torch.from_numpy(s.astype(np.int32)).to(c.device) for s in sels]
        states, misses, err = [], [], 0.0
        for i, s in enumerate(sel_t):
            states.append((c.slot_unit[0].clone(), c.lru[0].clone()))
            out = c.swap_in_selected_pages(req, seq, s, 0)
            misses.append(c.last_counts["misses"].cpu().tolist())
            if i < checked_rows:
                err = max(err, row_error(c, reqs, sels[i], out))
        return cls(states, misses, sel_t, err)


class Replay:
    """Untimed set-up of one timed call: the recorded state before the next of ``steps``
    (cycling) set by ``set_state(slot_unit, lru)``, and that step's selection written into
    ``topk``. ``step`` is the step of the latest call."""

    def __init__(self, rec: RecordedSteps, steps: Sequence[int], topk: torch.Tensor,
                 set_state: Callable[[torch.Tensor, torch.Tensor], None],
                 after: Optional[Callable[[], None]] = None):
        self.rec, self.steps, self.topk = rec, list(steps), topk
        self.set_state, self.after = set_state, after
        self.calls = itertools.count()
        self.step = self.steps[0]

    def __call__(self) -> None:
        self.step = self.steps[next(self.calls) % len(self.steps)]
        self.set_state(*self.rec.states[self.step])
        self.topk.copy_(self.rec.selections[self.step])
        if self.after is not None:
            self.after()


def set_coordinator_state(c: HiSparseCoordinator) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def set_state(slot_unit: torch.Tensor, lru: torch.Tensor) -> None:
        c.slot_unit[0].copy_(slot_unit)
        c.lru[0].copy_(lru)
    return set_state


def case_columns(sz: Sizes, case: str, batch: int, seq_len: int, misses: float, **extra
                 ) -> Dict[str, object]:
    """Columns of a swap-in row: sizes, and per-call counts for ``misses`` missed rows."""
    m = int(round(misses))
    return {"case": case, "batch_size": batch, "context_len": seq_len, "top_k": sz.top_k,
            "device_buffer_size": sz.device_buffer_size, "page_size": sz.page_size,
            "kv_row_bytes": sz.row_bytes, "load_granularity": "token", "misses": m,
            "hits": batch * sz.top_k - m, "tokens_loaded": m, "bytes_h2d": m * sz.row_bytes,
            **extra}


def _rows_variant(rows_per_program: Optional[int]) -> Dict[str, object]:
    if rows_per_program is None:
        return {}
    return {"variant": f"rows{rows_per_program}",
            "launch_config": json.dumps({"rows_per_program": rows_per_program})}


def all_misses(run: BenchRun, sz: Sizes) -> None:
    n, K = sz.host_rows_a, sz.top_k
    c = loaded_coordinator(sz, run.device, 1, n, seed=11)
    chunks = iter(fresh_chunks(sz, len(COPY_ENGINES) * (1 + run.warmup + run.repeats)))
    req = torch.tensor([0], dtype=torch.int32, device=run.device)
    seq = torch.tensor([n], dtype=torch.int32, device=run.device)
    sel = torch.empty((1, K), dtype=torch.int32, device=run.device)
    cols = case_columns(sz, "all_misses", 1, n, K)

    def next_selection():
        sel.copy_(torch.from_numpy(next(chunks)))

    host, dev = c.host_kv[0], c.device_kv[0]
    contiguous = torch.zeros_like(c.plan[:1])
    contiguous[0, 0] = K
    contiguous[0, 1:1 + K] = torch.arange(K, dtype=torch.int32)
    contiguous[0, 1 + c.max_misses:1 + c.max_misses + K] = torch.arange(K, dtype=torch.int32)
    copy_cols = {**cols, "hits": None, "misses": None}
    for engine in COPY_ENGINES:
        c.set_copy_engine(engine)
        run.measure(lambda: c.swap_in_selected_pages(req, seq, sel, 0), setup=next_selection,
                    check=lambda out: swap_check(c, [0], sel, out, [K]),
                    kernel="swap_in_selected_pages", copy_engine=engine, **cols)
        plan = c.plan.clone()              # the last call's: K rows scattered over the host pool
        for case, p in (("scattered_rows", plan), ("contiguous_rows", contiguous)):
            run.measure(lambda: c.engine.copy(host, dev, p, 1, 1), check=lambda _: plan_check(c, p, 1),
                        kernel="copy", copy_engine=engine, **{**copy_cols, "case": case})
    for rows in sz.uva_rows_sweep:
        c.set_copy_engine("uva_kernel", rows_per_program=rows)
        run.measure(lambda: c.engine.copy(host, dev, plan, 1, 1),
                    check=lambda _: plan_check(c, plan, 1), kernel="copy", copy_engine="uva_kernel",
                    **{**copy_cols, "case": "scattered_rows"}, **_rows_variant(rows))


def all_hits(run: BenchRun, sz: Sizes) -> None:
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    c = loaded_coordinator(sz, run.device, B, S, seed=100)
    reqs = list(range(B))
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in reqs])
    req = torch.tensor(reqs, dtype=torch.int32, device=run.device)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    topk = torch.from_numpy(sel.astype(np.int32)).to(run.device)
    for engine in COPY_ENGINES:
        c.set_copy_engine(engine)
        run.measure(lambda: c.swap_in_selected_pages(req, seq, topk, 0),
                    check=lambda out: swap_check(c, reqs, topk, out, [0] * B, [K] * B),
                    kernel="swap_in_selected_pages", copy_engine=engine,
                    **case_columns(sz, "all_hits", B, S, 0))
    for n in (B, 1):
        run.measure(lambda: c.resolve_selection(req[:n], seq[:n], topk[:n], 0),
                    check=lambda out: swap_check(c, reqs[:n], topk[:n], out, [0] * n, [K] * n),
                    kernel="resolve_selection", **case_columns(sz, "all_hits", n, S, 0,
                                                                tokens_loaded=None, bytes_h2d=None))


def steady_state(run: BenchRun, sz: Sizes) -> None:
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_c
    c = loaded_coordinator(sz, run.device, B, S, seed=1000)
    reqs = list(range(B))
    steps = sz.burn_in_c + run.warmup + run.repeats
    sels = overlap_selections(np.random.default_rng(9), steps, B, K, S, sz.overlap_c)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    model = CoordinatorModel(1, D, sz.page_size, "token")
    model.prefill(reqs, [S - 1] * B)
    model.begin_step(reqs, [S] * B)
    want = [[x.misses for x in model.swap_in(reqs, [S] * B, s.tolist(), 0)] for s in sels]
    rec = RecordedSteps.run(c, reqs, seq, sels, checked_rows=sz.burn_in_c)
    lru = c.lru[0].cpu().tolist()
    differ = [i for i in range(steps) if rec.misses[i] != want[i]]
    mismatch = (f"steps {differ}: misses differ from the model" if differ else
                "" if all(lru[r] == model.buffer(0, r).lru for r in reqs) else
                "final LRU order differs from the model")
    timed = range(sz.burn_in_c, steps)
    req = torch.tensor(reqs, dtype=torch.int32, device=run.device)
    topk = torch.empty((B, K), dtype=torch.int32, device=run.device)
    cols = case_columns(sz, "steady_state", B, S, np.mean([sum(rec.misses[i]) for i in timed]),
                        step_overlap=sz.overlap_c)
    variants = [(e, None) for e in COPY_ENGINES] + [("uva_kernel", r) for r in sz.uva_rows_sweep
                                                     if r != 4]
    for engine, rows_per_program in variants:
        c.set_copy_engine(engine, rows_per_program=rows_per_program)
        replay = Replay(rec, timed, topk, set_coordinator_state(c))
        run.measure(lambda: c.swap_in_selected_pages(req, seq, topk, 0), setup=replay,
                    check=lambda _: exact(rec.row_err, mismatch or _misses_vs(
                        c.last_counts["misses"].cpu().tolist(), rec.misses[replay.step])),
                    kernel="swap_in_selected_pages", copy_engine=engine,
                    **_rows_variant(rows_per_program), **cols)


def _misses_vs(got: List[int], want: List[int]) -> str:
    return "" if got == want else f"misses per request {got}, recorded {want}"


# ------------------------------------------------------------------------ host pools
class HostPool:
    """A uint8 ``[rows, row_bytes]`` host pool for the zero-copy kernel (``HostRows`` in
    ``alloc`` memory: 'pinned', 'registered' or 'thp'), filled with
    fresh random bytes. ``mirror``: the same bytes on ``device`` (checks compare with it, so the
    CPU never reads the pool and leaves no row in its caches); ``huge_fraction``: share of the
    pool's bytes backed by transparent huge pages (NaN where not readable). ``close()`` frees
    it."""

    def __init__(self, rows: int, row_bytes: int, alloc: str, device: torch.device, seed: int):
        self.alloc, self.nbytes = alloc, rows * row_bytes
        self._memory = HostRows((rows, row_bytes), alloc, device.type == "cuda")
        self.tensor = self._memory.tensor
        self.mirror = torch.empty((rows, row_bytes), dtype=torch.uint8, device=device)
        fill_random(self.tensor, self.mirror, seed)
        self.huge_fraction = self._memory.huge_fraction

    def close(self) -> None:
        """Drops this object's references to the pool: the memory goes back once no other
        tensor views it."""
        self.tensor = self._memory = self.mirror = None
        release_cached_pinned()


def release_cached_pinned() -> None:
    """Gives the pinned blocks torch's caching host allocator keeps back to the system."""
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()


def fill_random(t: torch.Tensor, mirror: torch.Tensor, seed: int, chunk_rows: int = 1 << 18
                ) -> None:
    """Fills the host rows ``t`` and their device ``mirror`` (both uint8 ``[rows, row_bytes]``)
    with the same fresh random bytes, generated on the mirror's device ``chunk_rows`` at a time."""
    g = torch.Generator(device=mirror.device).manual_seed(seed)
    for a in range(0, t.shape[0], chunk_rows):
        n = min(chunk_rows, t.shape[0] - a)
        torch.randint(0, 256, (n, t.shape[1]), dtype=torch.uint8, device=mirror.device,
                      generator=g, out=mirror[a:a + n])
        t[a:a + n].copy_(mirror[a:a + n])


def evict_host_caches(nbytes: int = 2 << 30) -> None:
    """Reads ``nbytes`` of fresh host memory, pushing the pool's rows (written by the CPU or by
    DMA just before) out of the CPU caches: timed reads then come from DRAM, as in serving."""
    scratch = np.ones(nbytes // 8, dtype=np.int64)
    int(scratch.sum())


def pool_fits(nbytes: int, alloc: str) -> Tuple[bool, str]:
    """Whether a host pool of ``nbytes`` can be allocated now (torch's pinned allocator rounds
    up to a power of two), and the reason when not."""
    if alloc in HUGETLB_PAGE:
        why = hugetlb_shortage(nbytes, alloc)
        return not why, why
    need = next_pow2_bytes(nbytes) if alloc == "pinned" else nbytes
    avail = host_available_bytes()
    if need > 0.8 * avail:
        return False, (f"needs {need / 2**30:.1f} GiB of host memory ({alloc}), "
                       f"MemAvailable is {avail / 2**30:.1f} GiB")
    return True, ""


def next_pow2_bytes(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def host_facts(device: torch.device) -> str:
    """One line of what decides host-memory reads over PCIe: the GPU's NUMA node, the CPUs this
    process may run on (and their nodes), transparent huge pages, IOMMU groups."""
    def read(path: str) -> str:
        try:
            return open(path).read().strip()
        except OSError:
            return "?"
    facts = []
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        bdf = (f"{getattr(p, 'pci_domain_id', 0):04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
               if hasattr(p, "pci_bus_id") else "")
        if bdf:
            facts.append(f"gpu {bdf} numa_node={read(f'/sys/bus/pci/devices/{bdf}/numa_node')}")
    import os
    cpus = sorted(os.sched_getaffinity(0))
    nodes = sorted({n for c in cpus for n in os.listdir(f"/sys/devices/system/cpu/cpu{c}")
                    if n.startswith("node")}) if os.path.isdir("/sys/devices/system/cpu") else []
    facts.append(f"cpus {len(cpus)} on {','.join(nodes) or '?'}")
    facts.append(f"thp {read('/sys/kernel/mm/transparent_hugepage/enabled')}")
    facts.append("hugetlb free " + ", ".join(f"{a[-2:]} {n}"
                                              for a, n in hugetlb_free_pages().items()))
    facts.append(f"virtualized {host_virtualized()}")
    groups = "/sys/kernel/iommu_groups"
    facts.append(f"iommu_groups {len(os.listdir(groups)) if os.path.isdir(groups) else 0}")
    return "; ".join(facts)


# ------------------------------------------------------------------------ gather
def gather_host_rows(dist: str, rng: np.random.Generator, pool_rows: int, n: int,
                     row_bytes: int, window_bytes: int) -> np.ndarray:
    """``n`` distinct host rows (int64) of a pool of ``pool_rows`` rows, in plan order:

    * ``random``: uniform over the pool, random order (as the swap-in's misses);
    * ``sorted``: the same kind of rows in ascending (4 KiB page) order;
    * ``window``: uniform within one random span of ``window_bytes``, random order;
    * ``pages_4k``: every row starting in randomly chosen 4 KiB OS pages (about
      4096 / row_bytes rows a page: fewest pages touched), in address order;
    * ``contiguous``: ``n`` consecutive rows at a random offset.
    """
    if dist == "random":
        return rng.choice(pool_rows, n, replace=False).astype(np.int64)
    if dist == "sorted":
        return np.sort(rng.choice(pool_rows, n, replace=False)).astype(np.int64)
    if dist == "window":
        w = min(pool_rows, window_bytes // row_bytes)
        if w < n:
            raise ValueError(f"window of {window_bytes} bytes holds {w} rows < {n}")
        return rng.integers(0, pool_rows - w + 1) + rng.choice(w, n, replace=False).astype(np.int64)
    if dist == "pages_4k":
        pages = pool_rows * row_bytes // OS_PAGE
        chosen = np.sort(rng.choice(pages, min(pages, n // (OS_PAGE // row_bytes) + 2),
                                    replace=False))
        first = -(-chosen * OS_PAGE // row_bytes)
        last = -(-(chosen + 1) * OS_PAGE // row_bytes)           # exclusive
        rows = np.concatenate([np.arange(a, b) for a, b in zip(first, last)])
        rows = rows[rows < pool_rows]
        if len(rows) < n:
            raise ValueError(f"pages_4k: {len(rows)} rows in the chosen pages < {n}")
        return rows[:n].astype(np.int64)
    if dist == "contiguous":
        return rng.integers(0, pool_rows - n + 1) + np.arange(n, dtype=np.int64)
    raise ValueError(f"gather distribution must be one of {GATHER_DISTS}, got {dist!r}")


def gather_engine(variant: str, device: torch.device) -> UvaKernelEngine:
    """The ``UvaKernelEngine`` of a ``GATHER_VARIANTS`` entry on ``device``."""
    return uva_engine_per_sm(device, **GATHER_VARIANTS[variant])


class GatherCase:
    """One timed gather: ``n`` rows of ``pool`` (rows from ``gather_host_rows``) into a device
    pool of ``n`` rows at a random permutation of its rows (the plan: int32 ``[1, 1 + 2n]``).
    ``setup`` inverts every device row (untimed), so each call must rewrite all of them, and
    with ``cpu_read`` first reads the rows on the CPU (they are then in its caches: the warm
    case the checks of the older copy rows create); ``check`` compares the planned device rows
    with their rows in the pool's device mirror."""

    def __init__(self, pool: HostPool, host_rows: np.ndarray, rng: np.random.Generator,
                 device: torch.device, cpu_read: bool = False):
        n = len(host_rows)
        self.pool, self.mirror, self.cpu_read = pool.tensor, pool.mirror, cpu_read
        self.src = torch.from_numpy(host_rows)
        self.dst = torch.from_numpy(rng.permutation(n).astype(np.int64))
        plan = np.concatenate([[n], host_rows, self.dst.numpy()]).astype(np.int32)[None]
        self.plan = torch.from_numpy(plan).to(device)
        g = torch.Generator(device=device).manual_seed(int(rng.integers(1 << 31)))
        self.dev = torch.randint(0, 256, (n, self.pool.shape[1]), dtype=torch.uint8,
                                 device=device, generator=g)

    def setup(self) -> None:
        if self.cpu_read:
            self.pool.index_select(0, self.src)
        self.dev.bitwise_not_()

    def call(self, engine: UvaKernelEngine):
        return lambda: engine.copy(self.pool, self.dev, self.plan, 1, 1)

    def check(self, _=None) -> Check:
        got = self.dev[self.dst.to(self.dev.device)]
        want = self.mirror[self.src.to(self.mirror.device)]
        return exact(float((got != want).any(dim=1).float().mean()))


def gather(run: BenchRun, sz: Sizes) -> None:
    """The copy alone: ``GatherCase`` rows per host allocation, pool size, row count,
    distribution and launch variant, ``gather_runs`` independent runs each (fresh rows and a
    fresh plan per run, ``seed`` = the run). Launch variants at the smallest pool; every row
    count at every pool (random rows, default variant); every distribution at the middle row
    count."""
    print(f"[swap_in] host: {host_facts(run.device)}", flush=True)
    mid = sz.gather_rows[len(sz.gather_rows) // 2]
    for alloc in run.args.host_alloc:
        for pi, pool_rows in enumerate(sz.gather_pools):
            nbytes = pool_rows * sz.row_bytes
            ok, why = pool_fits(nbytes, alloc)
            if not ok:
                print(f"[swap_in] gather: {alloc} pool of {pool_rows} rows skipped: {why}",
                      flush=True)
                continue
            try:
                pool = HostPool(pool_rows, sz.row_bytes, alloc, run.device, seed=pool_rows)
            except (RuntimeError, MemoryError, OSError) as e:
                print(f"[swap_in] gather: {alloc} pool of {pool_rows} rows skipped: "
                      f"allocation failed: {e}", flush=True)
                continue
            evict_host_caches(sz.evict_bytes)
            print(f"[swap_in] gather: {alloc} pool {pool_rows} rows ({nbytes / 2**30:.2f} GiB), "
                  f"huge-page backed {pool.huge_fraction:.0%}", flush=True)
            cases = [(n, "random", v) for n in sz.gather_rows
                     for v in (sz.gather_variants if pi == 0 and alloc == "pinned"
                               else ("default",))]
            cases += [(mid, d, "default") for d in GATHER_DISTS if d != "random"]
            cases += [(mid, "random_cpu_read", "default")]
            for n, case, variant in cases:
                engine = gather_engine(variant, run.device)
                dist = case.replace("_cpu_read", "")
                for rep in range(sz.gather_runs):
                    rng = np.random.default_rng([pool_rows, n, GATHER_DISTS.index(dist), rep])
                    g = GatherCase(pool, gather_host_rows(dist, rng, pool_rows, n, sz.row_bytes,
                                                          sz.window_bytes),
                                   rng, run.device, cpu_read=case != dist)
                    run.measure(g.call(engine), setup=g.setup, check=g.check, kernel="gather",
                                case=case if alloc == "pinned" else f"{case}+{alloc}",
                                variant=variant, launch_config=json.dumps(engine.launch_config()),
                                copy_engine="uva_kernel", kv_row_bytes=sz.row_bytes, misses=n,
                                tokens_loaded=n, bytes_h2d=n * sz.row_bytes, host_bytes=nbytes,
                                seed=rep)
            g = None                                   # its plan views the pool
            pool.close()
    print(gather_summary(run.rows), flush=True)


def gather_summary(rows: Sequence[Dict]) -> str:
    """Per (case, pool, rows, variant) of the ok gather rows: GB/s of each run's median, their
    median and spread ((max - min) / median), sorted by pool, rows, case, GB/s."""
    df = pd.DataFrame([r for r in rows if r.get("kernel") == "gather" and r["status"] == "ok"])
    if df.empty:
        return "(no gather rows)"
    out = []
    for (case, pool, n, variant), g in df.groupby(["case", "host_bytes", "misses", "variant"]):
        gb = g.sort_values("seed")["h2d_gbps"].to_numpy(float)
        med = float(np.median(gb))
        out.append({"case": case, "pool_rows": pool // int(g["kv_row_bytes"].iloc[0]), "rows": n,
                    "variant": variant, "runs": " ".join(f"{x:.1f}" for x in gb),
                    "gbps": med, "spread": (gb.max() - gb.min()) / med if med else NAN,
                    "us": float(np.median(g["latency_us_median"]))})
    out.sort(key=lambda r: (r["pool_rows"], r["rows"], r["case"], -r["gbps"]))
    return "== gather (copy alone; GB/s of each run's median) ==\n" + format_table(out, [
        ("case", "case", "s"), ("pool_rows", "pool_rows", "d"), ("rows", "rows", "d"),
        ("variant", "variant", "s"), ("us", "us", ".1f"), ("GB/s", "gbps", ".1f"),
        ("spread", "spread", "%"), ("runs_GB/s", "runs", "s")])


# ------------------------------------------------------------------------ context
def context(run: BenchRun, sz: Sizes) -> None:
    """Swap-in at equal misses vs context: batch ``context_batch``, ``top_k``, ``overlap_c``
    overlap, the coordinator's own host pool (``context_batch * S`` rows, shuffled pages) per
    context S. After ``burn_in_c`` free steps (each checked by ``row_error``), the hot-buffer
    state *and device pool* before each of ``context_timed_steps`` steps is recorded; each timed
    call restores its step's (untimed), so every call is an exact re-run of a recorded step:
    ``resolve_selection`` (checked: slot table and misses equal the free run's),
    ``copy_planned_misses`` after an untimed resolve and ``swap_in_selected_pages`` (both checked
    by ``row_error`` against a device mirror of the host pool: every selected row right). The
    CPU caches are flushed of host rows after set-up (``evict_host_caches``) and the checks never
    read the host pool on the CPU, so timed reads come from DRAM. Equal misses: the positions
    not kept from the previous step were never selected nor prefilled (``overlap_selections``
    with ``fresh_from``), so every step misses ``top_k - round(overlap_c * top_k)`` per request at
    every context. Host alloc 'thp': the coordinator's pool in huge pages (``host_alloc``); per
    ``--host-page-order`` (case suffix ``+sequential``): the host pages handed out shuffled or in
    order (each request's pages adjacent in the pool)."""
    B, K = sz.context_batch, sz.top_k
    reqs = list(range(B))
    print(f"[swap_in] host: {host_facts(run.device)}", flush=True)
    for alloc, order in itertools.product(run.args.host_alloc, run.args.host_page_order):
        for S in sz.context_lens:
            nbytes = B * S * sz.row_bytes
            ok, why = pool_fits(nbytes, alloc)
            if not ok:
                print(f"[swap_in] context {S} ({alloc}) skipped: {why}", flush=True)
                continue
            c = coordinator(sz, run.device, B, S, host_alloc=alloc, host_page_order=order)
            if alloc not in ("pinned", "registered"):
                print(f"[swap_in] context {S}: {c._host_memory.huge_fraction:.0%} of the host "
                      f"pool in huge pages", flush=True)
            mirror = torch.zeros((c.host_rows, sz.row_bytes), dtype=torch.uint8,
                                 device=run.device)
            for r in reqs:
                kv = random_rows(S, sz.row_bytes, run.device, 7 * S + r)
                c.load_host_kv(0, r, kv)
                mirror[torch.from_numpy(c.host_rows_of(r, np.arange(S))).to(run.device)] = \
                    kv.to(run.device)
            c.prefill(reqs, [S - 1] * B)
            c.begin_step(reqs, [S] * B)
            evict_host_caches(sz.evict_bytes)        # the CPU wrote (and prefill read) host rows
            steps = sz.burn_in_c + sz.context_timed_steps
            sels = overlap_selections(np.random.default_rng(S), steps, B, K, S, sz.overlap_c,
                                      fresh_from=sz.device_buffer_size)
            req = torch.tensor(reqs, dtype=torch.int32, device=run.device)
            seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
            timed = list(range(sz.burn_in_c, steps))
            states, outs, misses, err = {}, [], [], 0.0
            for i, sel in enumerate(sels):
                if i in timed:
                    states[i] = (c.slot_unit[0].clone(), c.lru[0].clone(),
                                 c.device_kv[0].clone())
                topk_i = torch.from_numpy(sel.astype(np.int32)).to(run.device)
                outs.append(c.swap_in_selected_pages(req, seq, topk_i, 0).clone())
                misses.append(c.last_counts["misses"].cpu().tolist())
                err = max(err, row_error(c, reqs, sel, outs[-1], mirror))
            topk = torch.empty((B, K), dtype=torch.int32, device=run.device)
            calls = itertools.count()
            current = [timed[0]]

            def restore(resolve: bool = False) -> None:
                i = current[0] = timed[next(calls) % len(timed)]
                slot_unit, lru, pool = states[i]
                c.slot_unit[0].copy_(slot_unit)
                c.lru[0].copy_(lru)
                c.device_kv[0].copy_(pool)
                topk.copy_(torch.from_numpy(sels[i].astype(np.int32)))
                if resolve:
                    c.resolve_selection(req, seq, topk, 0)

            def verdict(out: Optional[torch.Tensor] = None) -> Check:
                i = current[0]
                got = c.last_counts["misses"].cpu().tolist()
                mismatch = "" if got == misses[i] else \
                    f"misses per request {got}, recorded {misses[i]}"
                if err:
                    mismatch = mismatch or f"free run: {err:.3g} of the rows wrong"
                if out is None:       # the slot table alone: the free run's
                    wrong = float((c.out[0, :B] != outs[i]).any(dim=1).float().mean())
                else:
                    wrong = row_error(c, reqs, sels[i], out, mirror)
                return exact(wrong, mismatch)

            for kernel in run.args.resolve_kernel:
                if kernel == "cuda":
                    why = cuda_resolve_unavailable(run.device, K, sz.device_buffer_size)
                    if why:
                        print(f"[swap_in] context {S}: the CUDA resolve skipped: {why}",
                              flush=True)
                        continue
                c.set_resolve_launch(ResolveLaunch(kernel=kernel))
                case = "context" + ("" if alloc == "pinned" else f"+{alloc}") \
                    + ("" if order == "shuffled" else f"+{order}") \
                    + ("" if kernel == "triton" else f"+{kernel}")
                cols = case_columns(sz, case, B, S,
                                    np.mean([sum(misses[i]) for i in timed]),
                                    step_overlap=sz.overlap_c, copy_engine="uva_kernel",
                                    host_bytes=c.host_bytes())
                run.measure(lambda: c.resolve_selection(req, seq, topk, 0), setup=restore,
                            check=lambda _: verdict(), kernel="resolve_selection",
                            **{**cols, "tokens_loaded": None, "bytes_h2d": None})
                for translations, variant in itertools.product(run.args.host_translations,
                                                               sz.context_variants):
                    flush = (HostTranslationFlusher.shared(str(run.device))
                             if translations == "cold" else None)
                    c.engine = gather_engine(variant, run.device)
                    launch = dict(variant=variant,
                                  launch_config=json.dumps(c.engine.launch_config()))
                    cols_t = {**cols, "case": case + ("+cold" if flush else "")}
                    run.measure(lambda: c.copy_planned_misses(0),
                                setup=lambda: restore(resolve=True),
                                check=lambda _: verdict(c.out[0, :B]), host_flush=flush,
                                kernel="copy_planned_misses", **{**cols_t, "hits": None},
                                **launch)
                    run.measure(lambda: c.swap_in_selected_pages(req, seq, topk, 0),
                                setup=restore, check=verdict, host_flush=flush,
                                kernel="swap_in_selected_pages", **cols_t, **launch)
            del c, states, restore, verdict, mirror
            release_cached_pinned()
            if run.cuda:
                torch.cuda.empty_cache()
    print(context_summary(run.rows), flush=True)


def context_summary(rows: Sequence[Dict]) -> str:
    """Per (case, copy variant, context) of the context rows: misses per step, resolve / copy /
    total median microseconds, the total's growth over the shortest context's, copy GB/s."""
    df = pd.DataFrame([r for r in rows if str(r.get("case", "")).startswith("context")
                       and r.get("kernel") in ("resolve_selection", "copy_planned_misses",
                                               "swap_in_selected_pages")])
    if df.empty:
        return "(no context rows)"

    def median_us(h: pd.DataFrame) -> float:
        return float(h["latency_us_median"].iloc[0]) if len(h) and h["status"].iloc[0] == "ok" \
            else NAN
    out = []
    resolve = df[df["kernel"] == "resolve_selection"]
    copies = df[df["kernel"] != "resolve_selection"]
    for (case, variant), g in copies.groupby(["case", "variant"]):
        base = None
        for S, h in g.groupby("context_len", sort=True):
            copy = h[h["kernel"] == "copy_planned_misses"]
            total = median_us(h[h["kernel"] == "swap_in_selected_pages"])
            base = total if base is None else base
            out.append({"case": case, "variant": variant, "ctx": S,
                        "misses": int(h["misses"].iloc[0]),
                        "host_gib": float(h["host_bytes"].iloc[0]) / 2**30,
                        "resolve": median_us(resolve[(resolve["case"]
                                                      == case.replace("+cold", ""))
                                                     & (resolve["context_len"] == S)]),
                        "copy": median_us(copy), "total": total,
                        "growth": total / base - 1 if base else NAN,
                        "gbps": float(copy["h2d_gbps"].iloc[0]) if len(copy) else NAN})
    return "== swap-in at equal misses vs context (median us) ==\n" + format_table(out, [
        ("case", "case", "s"), ("variant", "variant", "s"), ("ctx", "ctx", "d"),
        ("misses", "misses", "d"), ("host_GiB", "host_gib", ".2f"),
        ("resolve_us", "resolve", ".1f"), ("copy_us", "copy", ".1f"), ("total_us", "total", ".1f"),
        ("growth", "growth", "%"), ("copy_GB/s", "gbps", ".1f")])


def summary(out_dir: str) -> None:
    """Prints the gather and context summaries of a stored ``swap_in`` run (``--out`` DIR)."""
    rows = results.load(out_dir).to_dict("records")
    print(gather_summary(rows))
    print(context_summary(rows))


def _comma_list(flag: str, allowed: Sequence[str]):
    """An argparse type: a non-empty comma list of ``allowed`` names (``flag`` in the message)."""
    def parse(text: str) -> Tuple[str, ...]:
        names = tuple(x for x in text.split(",") if x)
        if not names or any(x not in allowed for x in names):
            raise argparse.ArgumentTypeError(f"{flag} takes a comma list of "
                                             f"{', '.join(allowed)}; got {text!r}")
        return names
    return parse


def _positive_ints(flag: str, what: str):
    """An argparse type: a non-empty comma list of positive integers (``flag``, ``what`` they
    count, in the message)."""
    def parse(text: str) -> Tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(",") if x)
        except ValueError:
            values = ()
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"{flag} takes a comma list of positive {what}; "
                                             f"got {text!r}")
        return values
    return parse


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--section", type=_comma_list("--section", SECTIONS), default=SECTIONS,
                        help=f"comma list of sections to run (default all: {','.join(SECTIONS)})")
    parser.add_argument("--host-alloc", type=_comma_list("--host-alloc", HOST_ALLOCS),
                        default=HOST_ALLOCS,
                        help="host pools of the gather and context sections, comma list of "
                        "pinned (cudaHostAlloc), registered (pageable + cudaHostRegister: "
                        "SGLang's and the coordinator's default), thp (transparent huge-page "
                        "mapping, registered), hugetlb_2m and hugetlb_1g (explicit huge pages "
                        "from the kernel's reserved pool, registered; skipped without enough "
                        "free pages); hisparse.host_alloc takes the same names. Default: all")
    parser.add_argument("--host-page-order", type=_comma_list("--host-page-order",
                                                              HOST_PAGE_ORDERS),
                        default=("shuffled",),
                        help="free-page orders of the context section's host pools, comma list "
                        "of shuffled (a long-running pool; the default) and sequential (a fresh "
                        "pool: each request's pages adjacent); hisparse.host_page_order takes "
                        "the same names")
    parser.add_argument("--host-translations", type=_comma_list("--host-translations",
                                                                HOST_TRANSLATIONS),
                        default=HOST_TRANSLATIONS,
                        help="the context section's copy and swap-in timed with the GPU's "
                        "host-address translations as the cycle of recorded steps leaves them "
                        "(cycled) and evicted before each call (cold: case suffix +cold, what "
                        "a served model's other layers leave); default both")
    parser.add_argument("--resolve-kernel", type=_comma_list("--resolve-kernel", RESOLVE_KERNELS),
                        default=("triton",),
                        help="resolves of the context section, comma list of triton (the "
                        "default) and cuda (backends/kernels/swap_in_cuda.py; case suffix "
                        "+cuda; skipped with the reason where it cannot run)")
    parser.add_argument("--gather-pools", type=_positive_ints("--gather-pools", "row counts"),
                        default=None,
                        help="host pool sizes (rows) of the gather section, comma list "
                        "(default: 1M,4M,16M rows; --quick: its own)")
    parser.add_argument("--contexts", type=_positive_ints("--contexts", "context lengths"),
                        default=None, help="context lengths of the context section, comma list "
                        "(default: 16K,32K,64K,128K; each above the hot buffer's 4096 slots)")
    parser.add_argument("--context-batch", type=_positive_ints("--context-batch", "batch sizes"),
                        default=None, help="requests of the context section (default 32; one "
                        "value)")


@register("swap_in", "HiSparse swap-in (resolve + copy engines): all misses, all hits, "
          "steady state; copies alone vs contiguous rows; zero-copy gather vs pool size; "
          "swap-in vs context", options=options)
def swap_in(run: BenchRun) -> None:
    sz = QUICK if run.quick else FULL
    if run.args.gather_pools:
        sz = dataclasses.replace(sz, gather_pools=run.args.gather_pools)
    if run.args.contexts:
        need = sz.device_buffer_size + 1 + fresh_positions(
            sz.burn_in_c + sz.context_timed_steps, sz.top_k, sz.overlap_c)
        low = [S for S in run.args.contexts if S < need]
        if low:
            raise SystemExit(f"--contexts: {low} below {need}: the context section's steps "
                             f"select positions never resident (above the hot buffer's "
                             f"{sz.device_buffer_size} slots), {need - sz.device_buffer_size - 1}"
                             f" of them")
        sz = dataclasses.replace(sz, context_lens=run.args.contexts)
    if run.args.context_batch:
        if len(run.args.context_batch) != 1:
            raise SystemExit(f"--context-batch takes one value, got {run.args.context_batch}")
        sz = dataclasses.replace(sz, context_batch=run.args.context_batch[0])
    run_section = {"all_misses": all_misses, "all_hits": all_hits, "steady_state": steady_state,
                   "gather": gather, "context": context}
    for name in run.args.section:
        run_section[name](run, sz)
        if run.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":   # the older spelling: python -m harness.bench.swap_in
    from harness.bench.__main__ import main
    raise SystemExit(main(["run", "swap_in", *__import__("sys").argv[1:]]))
