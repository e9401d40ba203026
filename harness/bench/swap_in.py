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

Checks (before timing): the device row behind every returned slot equals the host row of the
selected position (``max_rel_err`` = fraction of wrong rows, tolerance 0; for ``copy`` rows the
planned destination rows against their sources) and the misses per request are the expected
ones. Counts are per call (``misses``, ``hits``, ``tokens_loaded``, ``bytes_h2d``; the mean over
the timed steps for ``steady_state``); ``h2d_gbps`` follows, against ``ceiling_h2d_gbps`` (one
256 MiB pinned copy, ``harness.ceilings``).
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from backends.copy_engines import COPY_ENGINES
from backends.hisparse_coordinator import HiSparseCoordinator
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.registry import register
from harness.lru_model import CoordinatorModel


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


FULL = Sizes()
QUICK = Sizes(row_bytes=656, top_k=32, device_buffer_size=64, page_size=8, host_rows_a=4096,
              batch=3, seq_len_b=100, seq_len_c=400, burn_in_c=2, uva_rows_sweep=(4, 16))


def random_rows(n: int, row_bytes: int, device: torch.device, seed: int) -> torch.Tensor:
    """Fresh random uint8 rows ``[n, row_bytes]`` on the CPU (generated on the device when CUDA)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, device=device,
                         generator=g).cpu()


def coordinator(sz: Sizes, device: torch.device, max_requests: int, max_seq_len: int
                ) -> HiSparseCoordinator:
    """A one-layer token-mode coordinator (``uva_kernel`` copies) of these sizes."""
    return HiSparseCoordinator(
        num_layers=1, max_requests=max_requests, max_seq_len=max_seq_len,
        row_bytes=sz.row_bytes, top_k=sz.top_k, device_buffer_size=sz.device_buffer_size,
        page_size=sz.page_size, copy_engine="uva_kernel", device=device, seed=1)


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
              out: torch.Tensor) -> float:
    """Fraction of valid selected entries (``sel`` int ``[B, K]``) whose device row behind
    ``out`` (int32 ``[B, K]`` rows of ``c.device_pool(0)``) differs from the host row of that
    position (layer 0)."""
    pool = c.device_pool(0).cpu()
    bad = total = 0
    for b, r in enumerate(reqs):
        live = sel[b] >= 0
        got = pool[out[b].cpu()[torch.from_numpy(live)].long()]
        want = c.host_kv[0][torch.from_numpy(c.host_rows_of(r, sel[b][live]))].cpu()
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


def overlap_selections(rng: np.random.Generator, steps: int, batch: int, top_k: int,
                       seq_len: int, overlap: float) -> List[np.ndarray]:
    """Per step ``[batch, top_k]`` distinct positions ``< seq_len - 1``; each step keeps
    ``overlap`` of the previous step's."""
    keep = int(round(overlap * top_k))
    prev = np.stack([rng.permutation(seq_len - 1)[:top_k] for _ in range(batch)])
    out = [prev]
    for _ in range(steps - 1):
        rows = []
        for b in range(batch):
            kept = rng.choice(prev[b], keep, replace=False)
            pool = np.setdiff1d(np.arange(seq_len - 1), prev[b], assume_unique=True)
            rows.append(np.concatenate([kept, rng.choice(pool, top_k - keep, replace=False)]))
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


@register("swap_in", "HiSparse swap-in (resolve + copy engines): all misses, all hits, "
          "steady state; copies alone vs contiguous rows")
def swap_in(run: BenchRun) -> None:
    sz = QUICK if run.quick else FULL
    for case in (all_misses, all_hits, steady_state):
        case(run, sz)
        if run.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":   # the older spelling: python -m harness.bench.swap_in
    from harness.bench.__main__ import main
    raise SystemExit(main(["run", "swap_in", *__import__("sys").argv[1:]]))
