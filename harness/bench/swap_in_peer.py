"""Our HiSparse swap-in (``swap_in_selected_pages``, ``uva_kernel`` copies) beside SGLang's own
kernel (``backends.kernels.sglang_peer``), on identical pools and selections (the swap-in part
of the ``peers`` bench).

The cases of ``harness.bench.swap_in`` (``all_misses``, ``all_hits``, ``steady_state``), each
with three rows: ours; ``<peer>_call``, the peer's full call (our canonicalising sort of the
selection, which lets upstream's kernel take any input, then the kernel); ``<peer>_kernel``,
upstream's kernel alone on the canonical selection (what SGLang runs: its top-k is already
valid and distinct). The comparison is against the kernel: our row's ``peer`` is
``<peer>_kernel`` and ``ratio_to_peer`` = ours / kernel (the ratio ``BENCHMARKS.md`` tabulates);
the call row is compared with the kernel too (``ratio_to_peer`` = call / kernel: what the sort
adds), and each case prints one line naming both ratios of ours, to the kernel and to the call. ``steady_state`` runs in lockstep: our steps run
free first (checked against nothing but the host rows; states recorded), then every call of
either side starts, in its untimed set-up, from our state before the same step, so both do the
same hits, misses and bytes. Checks: each side's device rows behind its returned slots against
the host rows (``max_rel_err``, tolerance 0) and its misses per request (expected ones; in
``steady_state`` ours as recorded).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.sglang_peer import SGLangHiSparsePeer, canonical_selection
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.swap_in import (RecordedSteps, Replay, Sizes, case_columns, fresh_chunks,
                                   loaded_coordinator, overlap_selections, row_error,
                                   set_coordinator_state, swap_check)

PeerFactory = Callable[[HiSparseCoordinator], SGLangHiSparsePeer]


def peer_check(peer: SGLangHiSparsePeer, reqs: Sequence[int], sel: torch.Tensor,
               out: torch.Tensor, misses: Sequence[int]) -> Check:
    """The peer's latest call: device rows of its pools behind ``out``, misses per request."""
    got = peer.last_counts()["misses"].cpu().tolist()
    mismatch = "" if got == list(misses) else f"misses per request {got}, expected {list(misses)}"
    return exact(row_error(peer.pools, reqs, sel.cpu().numpy(), out), mismatch)


def comparison_line(ours: Dict, call: Dict, kernel: Dict) -> str:
    """``ours / <kernel> = r (the comparison); ours / <call> = r (call = our canonicalising sort
    + the kernel)``, each ratio of median latencies, ``n/a`` unless both rows are ok."""
    def ratio(row: Dict, peer: Dict) -> str:
        if row["status"] == peer["status"] == "ok":
            return f"{row['latency_us_median'] / peer['latency_us_median']:.2f}"
        return f"n/a ({row['kernel']} {row['status']}, {peer['kernel']} {peer['status']})"
    return (f"ours / {kernel['kernel']} = {ratio(ours, kernel)} (the comparison); "
            f"ours / {call['kernel']} = {ratio(ours, call)} "
            "(call = our canonicalising sort + the kernel)")


class Pair:
    """Ours and the peer on identical pools: ``ours`` and ``pools`` are two coordinators with the
    same host KV and hot buffers; ``peer`` drives ``pools`` (None when it cannot be built:
    ``why`` says why, ``status`` is unavailable or invalid)."""

    def __init__(self, run: BenchRun, sz: Sizes, batch: int, seq_len: int, seed: int,
                 factory: PeerFactory, name: str):
        self.run, self.name, self.reqs = run, name, list(range(batch))
        self.ours = loaded_coordinator(sz, run.device, batch, seq_len, seed)
        self.pools = loaded_coordinator(sz, run.device, batch, seq_len, seed)
        self.peer: Optional[SGLangHiSparsePeer] = None
        self.status = self.why = ""
        try:
            self.peer = factory(self.pools)
        except (PeerUnavailable, PeerUnsupported) as e:
            self.status = "unavailable" if isinstance(e, PeerUnavailable) else "invalid"
            self.why = str(e)
            return
        self.peer.prefill(self.reqs)
        self.peer.begin_step(self.reqs, [seq_len] * batch)

    def measure(self, ours_fn, peer_fn, kernel_fn, setups, checks, cols: Dict) -> None:
        """Ours, the peer's call and upstream's kernel alone (``setups``/``checks``: one each);
        ours and the call are compared with the kernel alone (module doc)."""
        ours = self.run.measure(ours_fn, setup=setups[0], check=checks[0],
                                kernel="swap_in_selected_pages", copy_engine="uva_kernel", **cols)
        call = self._peer_row("call", peer_fn, setups[1], checks[1], cols)
        kernel = self._peer_row("kernel", kernel_fn, setups[2], checks[2], cols)
        self.run.compare(ours, kernel)
        self.run.compare(call, kernel)
        print(f"[{self.run.bench}] {cols['case']}: {comparison_line(ours, call, kernel)}", flush=True)

    def _peer_row(self, what: str, fn, setup, check, cols: Dict) -> Dict:
        kernel = f"{self.name}_{what}"
        if self.peer is None:
            return self.run.skip(self.status, self.why, kernel=kernel, **cols)
        return self.run.measure(fn, setup=setup, check=check, kernel=kernel, **cols)


def all_misses(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str) -> None:
    """One request, ``top_k`` never-resident positions per call."""
    n, K = sz.host_rows_a, sz.top_k
    pair = Pair(run, sz, 1, n, 11, factory, name)
    chunks = iter(fresh_chunks(sz, 3 * (1 + run.warmup + run.repeats)))
    req = torch.tensor([0], dtype=torch.int32, device=run.device)
    seq = torch.tensor([n], dtype=torch.int32, device=run.device)
    sel = torch.empty((1, K), dtype=torch.int32, device=run.device)
    canon = torch.empty_like(sel)

    def next_sel():
        sel.copy_(torch.from_numpy(next(chunks)))

    def next_canon():
        next_sel()
        canon.copy_(canonical_selection(sel, seq)[0])

    ours, peer = pair.ours, pair.peer
    pair.measure(lambda: ours.swap_in_selected_pages(req, seq, sel, 0),
                 lambda: peer.swap_in(req, seq, sel, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0),
                 (next_sel, next_sel, next_canon),
                 (lambda out: swap_check(ours, [0], sel, out, [K]),
                  lambda out: peer_check(peer, [0], sel, out, [K]),
                  lambda out: peer_check(peer, [0], canon, out, [K])),
                 case_columns(sz, "all_misses", 1, n, K))


def all_hits(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str) -> None:
    """A batch of long requests selecting only resident tokens and the newest one."""
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    pair = Pair(run, sz, B, S, 100, factory, name)
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in pair.reqs])
    req = torch.tensor(pair.reqs, dtype=torch.int32, device=run.device)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    topk = torch.from_numpy(sel.astype(np.int32)).to(run.device)
    canon = canonical_selection(topk, seq)[0]
    ours, peer, reqs = pair.ours, pair.peer, pair.reqs
    pair.measure(lambda: ours.swap_in_selected_pages(req, seq, topk, 0),
                 lambda: peer.swap_in(req, seq, topk, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0), (None, None, None),
                 (lambda out: swap_check(ours, reqs, topk, out, [0] * B, [K] * B),
                  lambda out: peer_check(peer, reqs, topk, out, [0] * B),
                  lambda out: peer_check(peer, reqs, canon, out, [0] * B)),
                 case_columns(sz, "all_hits", B, S, 0))


def steady_state(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str) -> None:
    """Overlapping steps in lockstep: every call starts from our state before its step."""
    B, K, S = sz.batch, sz.top_k, sz.seq_len_c
    pair = Pair(run, sz, B, S, 1000, factory, name)
    ours, peer, reqs = pair.ours, pair.peer, pair.reqs
    steps = sz.burn_in_c + run.warmup + run.repeats
    sels = overlap_selections(np.random.default_rng(9), steps, B, K, S, sz.overlap_c)
    req = torch.tensor(reqs, dtype=torch.int32, device=run.device)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    rec = RecordedSteps.run(ours, reqs, seq, sels, checked_rows=sz.burn_in_c)
    peer_err, differ = 0.0, []
    for i in range(steps if peer is not None else 0):    # the peer from our state, step by step
        peer.load_state(0, *rec.states[i])
        out = peer.swap_in(req, seq, rec.selections[i], 0)
        if peer.last_counts()["misses"].cpu().tolist() != rec.misses[i]:
            differ.append(i)
        if i < sz.burn_in_c:
            peer_err = max(peer_err, row_error(pair.pools, reqs, sels[i], out))
    mismatch = f"steps {differ}: the peer's misses differ from ours" if differ else ""
    timed = range(sz.burn_in_c, steps)
    topk = torch.empty((B, K), dtype=torch.int32, device=run.device)
    canon = torch.empty_like(topk)
    set_peer = None if peer is None else (lambda su, lru: peer.load_state(0, su, lru))
    replays = (Replay(rec, timed, topk, set_coordinator_state(ours)),
               Replay(rec, timed, topk, set_peer),
               Replay(rec, timed, topk, set_peer,
                      after=lambda: canon.copy_(canonical_selection(topk, seq)[0])))

    def recorded(counts: Callable[[], Dict[str, torch.Tensor]], replay: Replay, err: float,
                 failed: str) -> Check:
        got = counts()["misses"].cpu().tolist()
        want = rec.misses[replay.step]
        return exact(err, failed or ("" if got == want else
                                     f"misses per request {got}, recorded {want}"))

    pair.measure(lambda: ours.swap_in_selected_pages(req, seq, topk, 0),
                 lambda: peer.swap_in(req, seq, topk, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0), replays,
                 (lambda _: recorded(lambda: ours.last_counts, replays[0], rec.row_err, ""),
                  lambda _: recorded(peer.last_counts, replays[1], peer_err, mismatch),
                  lambda _: recorded(peer.last_counts, replays[2], peer_err, mismatch)),
                 case_columns(sz, "steady_state", B, S,
                              np.mean([sum(rec.misses[i]) for i in timed]),
                              step_overlap=sz.overlap_c))


def swap_in_peers(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str) -> None:
    """The three cases; ``name`` prefixes the peer's kernel names (``sglang``, or
    ``sglang_model`` for the Python model of upstream's kernel)."""
    for case in (all_misses, all_hits, steady_state):
        case(run, sz, factory, name)
        if run.cuda:
            torch.cuda.empty_cache()
