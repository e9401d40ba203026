"""Our HiSparse swap-in (``swap_in_selected_pages``, ``uva_kernel`` copies) beside SGLang's own
kernel (``backends.kernels.sglang_peer``), on identical pools and selections: the swap-in part
of the ``peers`` bench, and the ``swap_in_peer`` bench on its own
(``python -m harness.bench run swap_in_peer``).

The cases of ``harness.bench.swap_in`` (``all_misses``: B=1; ``all_hits``: B=64;
``steady_state``: B=64, 85 % step overlap), each with one row of ours per ``lru_order``
(``upstream``, SGLang's order and our default, and ``position``; column ``lru_order``, variant
the order) and two rows of the peer: ``<peer>_call``, the peer's full call (our canonicalising
sort of the selection, which lets upstream's kernel take any input, then the kernel);
``<peer>_kernel``, upstream's kernel alone on the canonical selection (what SGLang runs: its
top-k is already valid and distinct). The comparison is against the kernel: each of our rows'
``peer`` is ``<peer>_kernel`` and ``ratio_to_peer`` = ours / kernel (the ratio ``BENCHMARKS.md``
tabulates); the call row is compared with the kernel too (``ratio_to_peer`` = call / kernel:
what the sort adds), and each case prints one line per order naming both ratios of ours, to the
kernel and to the call. ``all_hits`` adds ``resolve_selection`` alone (the resolve kernel, no
copy) per order at B=64 and B=1, and the upstream resolve at 4 and 16 warps (``ResolveLaunch``;
variant ``upstream w<N>``; the default is 8). On CUDA devices the CUDA resolve
(``ResolveLaunch(kernel='cuda')``, ``backends/kernels/swap_in_cuda.py``) adds a row of ours in
every case (variant ``upstream cuda``) and the resolve alone at its default (32) and 16 warps.

Launch variants (``swap_in_peer`` only, ``LAUNCH_VARIANTS``): every case adds rows of ours in the
upstream order with the launch before 2026-12-03 (``upstream 12-02``: the resolve's scattered
stores by ``tl.store``, the copy a plain launch), with one of the two changes of the default
alone (``upstream ptx-misses``: the miss path's stores by inline PTX; ``upstream pdl``: the copy
a programmatic dependent of the resolve) and with every scattered store by PTX
(``upstream ptx-all pdl``), and the default at 16 resolve warps (``upstream w16``), each its
own coordinator on the same pools, checked like the others;
``all_hits`` adds the resolve alone with every store by PTX (``upstream ptx-all``) at 8 and 16
warps. Under the interpreter the variants run the same code (no PTX, no PDL).

``steady_state`` runs in lockstep: per order our steps run free first (checked against nothing
but the host rows; states recorded), then every timed call starts, in its untimed set-up, from
that order's recorded state before the same step; the peer's calls start from the ``upstream``
order's states (SGLang's own trajectory: in that order ours and the kernel evolve identically,
``tests/test_sglang_peer.py``), so ours in the upstream order and the peer do the same hits,
misses and bytes; the ``position`` rows follow their own trajectory (their misses column says
how many). Checks: each side's device rows behind its returned slots against the host rows
(``max_rel_err``, tolerance 0) and its misses per request (expected ones; in ``steady_state``
the recorded ones).
"""
from __future__ import annotations

import json
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from backends.hisparse_coordinator import LRU_ORDERS, HiSparseCoordinator
from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.sglang_peer import SGLangHiSparsePeer, canonical_selection
from backends.kernels.swap_in import ResolveLaunch
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.registry import register
from harness.bench.swap_in import (FULL, QUICK, RecordedSteps, Replay, Sizes, case_columns,
                                   fresh_chunks, loaded_coordinator, overlap_selections,
                                   random_rows, row_error, set_coordinator_state, swap_check)
from harness.sglang_model import modelled_peer

PeerFactory = Callable[[HiSparseCoordinator], SGLangHiSparsePeer]
#: warps of the extra upstream resolve rows in ``all_hits`` (the default launch is 8)
RESOLVE_WARPS = (4, 16)
#: rows of ours in every case: variant -> (lru_order, resolve launch, the copy's ``pdl``; None:
#: the default); one per order always, the launch variants (module doc) in ``swap_in_peer``
ORDER_VARIANTS = {o: (o, ResolveLaunch(), None) for o in LRU_ORDERS}
LAUNCH_VARIANTS = {
    "upstream 12-02": ("upstream", ResolveLaunch(ptx_scatter="none"), False),
    "upstream ptx-misses": ("upstream", ResolveLaunch(), False),
    "upstream pdl": ("upstream", ResolveLaunch(ptx_scatter="none"), True),
    "upstream ptx-all pdl": ("upstream", ResolveLaunch(ptx_scatter="all"), True),
    "upstream w16": ("upstream", ResolveLaunch(num_warps=16), None),
}
#: the CUDA resolve (``backends/kernels/swap_in_cuda.py``), on CUDA devices only: a row of
#: ours in every case, and the resolve alone in ``all_hits`` at its default and 16 warps
CUDA_VARIANTS = {"upstream cuda": ("upstream", ResolveLaunch(kernel="cuda"), None)}
CUDA_RESOLVE_WARPS = (None, 16)


def ordered_coordinator(sz: Sizes, device: torch.device, batch: int, seq_len: int, seed: int,
                        lru_order: str, resolve_launch: Optional[ResolveLaunch] = None,
                        pdl: Optional[bool] = None) -> HiSparseCoordinator:
    """``harness.bench.swap_in.loaded_coordinator`` in ``lru_order``: the same host KV, page
    shuffle and hot buffers for the same ``seed`` (so its pools equal the peer's); its resolve
    launch and the copy's ``pdl`` as given (None: the defaults)."""
    c = HiSparseCoordinator(
        num_layers=1, max_requests=batch, max_seq_len=seq_len, row_bytes=sz.row_bytes,
        top_k=sz.top_k, device_buffer_size=sz.device_buffer_size, page_size=sz.page_size,
        copy_engine="uva_kernel", lru_order=lru_order, resolve_launch=resolve_launch,
        device=device, seed=1)
    c.set_copy_engine("uva_kernel", pdl=pdl)
    for r in range(batch):
        c.load_host_kv(0, r, random_rows(seq_len, sz.row_bytes, device, seed + r))
    c.prefill(list(range(batch)), [seq_len - 1] * batch)
    c.begin_step(list(range(batch)), [seq_len] * batch)
    return c


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
    """Ours (one coordinator per variant of ``variants``, ``ORDER_VARIANTS`` /
    ``LAUNCH_VARIANTS``: ``ours[variant]``) and the peer on identical pools: every coordinator
    has the same host KV and hot buffers; ``peer`` drives ``pools`` (None when it cannot be
    built: ``why`` says why, ``status`` is unavailable or invalid)."""

    def __init__(self, run: BenchRun, sz: Sizes, batch: int, seq_len: int, seed: int,
                 factory: PeerFactory, name: str, variants: Dict[str, tuple]):
        self.run, self.name, self.reqs = run, name, list(range(batch))
        self.variants = variants
        self.ours = {v: ordered_coordinator(sz, run.device, batch, seq_len, seed, *spec)
                     for v, spec in variants.items()}
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

    def measure(self, ours: Dict[str, tuple], peer_fn, kernel_fn, setups, checks,
                cols: Dict, ours_cols: Optional[Dict[str, Dict]] = None) -> None:
        """Ours per variant (``ours[variant] = (fn, setup, check)``), the peer's call and
        upstream's kernel alone (``setups``/``checks``: one each); every row of ours and the call
        are compared with the kernel alone (module doc). ``ours_cols[variant]``: columns of that
        variant's row in place of ``cols``."""
        rows = {}
        for v, (fn, setup, check) in ours.items():
            c = (ours_cols or {}).get(v, cols)
            order = self.variants[v][0]
            rows[v] = self.run.measure(fn, setup=setup, check=check,
                                       kernel="swap_in_selected_pages", variant=v,
                                       lru_order=order, copy_engine="uva_kernel",
                                       launch_config=launch_json(self.ours[v]), **c)
        call = self._peer_row("call", peer_fn, setups[0], checks[0], cols)
        kernel = self._peer_row("kernel", kernel_fn, setups[1], checks[1], cols)
        for v, row in rows.items():
            self.run.compare(row, kernel)
            order = self.variants[v][0]
            label = f"lru_order={order}" + ("" if v == order else f" ({v})")
            print(f"[{self.run.bench}] {cols['case']} {label}: "
                  f"{comparison_line(row, call, kernel)}", flush=True)
        self.run.compare(call, kernel)

    def _peer_row(self, what: str, fn, setup, check, cols: Dict) -> Dict:
        kernel = f"{self.name}_{what}"
        if self.peer is None:
            return self.run.skip(self.status, self.why, kernel=kernel, **cols)
        return self.run.measure(fn, setup=setup, check=check, kernel=kernel, **cols)


def launch_json(c: HiSparseCoordinator) -> str:
    """The resolve's launch and the copy's ``pdl`` of a coordinator, as JSON."""
    pdl = bool(getattr(c.engine, "pdl", False))
    if c.resolve_launch.kernel == "cuda":
        s = c.cuda_resolve_shape
        return json.dumps({"kernel": "cuda", "threads": s.threads, "entries_per_thread": s.ept,
                           "lanes_per_thread": s.lpt, "hash_size": s.hash_size, "pdl": pdl})
    return json.dumps({"kernel": "triton", "block_c": c.block_c, "num_warps": c.resolve_warps,
                       "ptx_scatter": c.resolve_launch.ptx_scatter if c.resolve_ptx_scatter
                       else "none", "pdl": pdl})


def all_misses(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str,
               variants: Dict[str, tuple]) -> None:
    """One request, ``top_k`` never-resident positions per call."""
    n, K = sz.host_rows_a, sz.top_k
    pair = Pair(run, sz, 1, n, 11, factory, name, variants)
    chunks = iter(fresh_chunks(sz, (2 + len(variants)) * (1 + run.warmup + run.repeats)))
    req = torch.tensor([0], dtype=torch.int32, device=run.device)
    seq = torch.tensor([n], dtype=torch.int32, device=run.device)
    sel = torch.empty((1, K), dtype=torch.int32, device=run.device)
    canon = torch.empty_like(sel)

    def next_sel():
        sel.copy_(torch.from_numpy(next(chunks)))

    def next_canon():
        next_sel()
        canon.copy_(canonical_selection(sel, seq)[0])

    peer = pair.peer
    ours = {o: (lambda c=c: c.swap_in_selected_pages(req, seq, sel, 0), next_sel,
                lambda out, c=c: swap_check(c, [0], sel, out, [K]))
            for o, c in pair.ours.items()}
    pair.measure(ours,
                 lambda: peer.swap_in(req, seq, sel, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0),
                 (next_sel, next_canon),
                 (lambda out: peer_check(peer, [0], sel, out, [K]),
                  lambda out: peer_check(peer, [0], canon, out, [K])),
                 case_columns(sz, "all_misses", 1, n, K))


def all_hits(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str,
             variants: Dict[str, tuple]) -> None:
    """A batch of long requests selecting only resident tokens and the newest one; then the
    resolve kernel alone per order (and upstream launch variants) at this batch and at 1."""
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    pair = Pair(run, sz, B, S, 100, factory, name, variants)
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in pair.reqs])
    req = torch.tensor(pair.reqs, dtype=torch.int32, device=run.device)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    topk = torch.from_numpy(sel.astype(np.int32)).to(run.device)
    canon = canonical_selection(topk, seq)[0]
    peer, reqs = pair.peer, pair.reqs
    ours = {o: (lambda c=c: c.swap_in_selected_pages(req, seq, topk, 0), None,
                lambda out, c=c: swap_check(c, reqs, topk, out, [0] * B, [K] * B))
            for o, c in pair.ours.items()}
    pair.measure(ours,
                 lambda: peer.swap_in(req, seq, topk, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0), (None, None),
                 (lambda out: peer_check(peer, reqs, topk, out, [0] * B),
                  lambda out: peer_check(peer, reqs, canon, out, [0] * B)),
                 case_columns(sz, "all_hits", B, S, 0))
    launches = [(o, ResolveLaunch()) for o in LRU_ORDERS] + \
        [("upstream", ResolveLaunch(num_warps=w)) for w in RESOLVE_WARPS]
    if any(v in variants for v in LAUNCH_VARIANTS):
        launches += [("upstream", ResolveLaunch(ptx_scatter="all")),
                     ("upstream", ResolveLaunch(num_warps=16, ptx_scatter="all"))]
    if run.cuda:
        launches += [("upstream", ResolveLaunch(kernel="cuda", num_warps=w))
                     for w in CUDA_RESOLVE_WARPS]
    for order, launch in launches:
        c = pair.ours[order]
        c.set_resolve_launch(launch)
        variant = " ".join([order] + ([] if launch.kernel == "triton" else [launch.kernel])
                           + ([] if launch.num_warps is None else [f"w{launch.num_warps}"])
                           + ([] if launch.ptx_scatter == "misses" or launch.kernel == "cuda"
                              else [f"ptx-{launch.ptx_scatter}"]))
        for n in (B, 1):
            run.measure(lambda: c.resolve_selection(req[:n], seq[:n], topk[:n], 0),
                        check=lambda out: swap_check(c, reqs[:n], topk[:n], out, [0] * n, [K] * n),
                        kernel="resolve_selection", variant=variant, lru_order=order,
                        launch_config=launch_json(c),
                        **case_columns(sz, "all_hits", n, S, 0, tokens_loaded=None,
                                       bytes_h2d=None))
        c.set_resolve_launch(ResolveLaunch())


def steady_state(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str,
                 variants: Dict[str, tuple]) -> None:
    """Overlapping steps in lockstep: every call starts from its variant's recorded state
    before its step; the peer's from the upstream order's."""
    B, K, S = sz.batch, sz.top_k, sz.seq_len_c
    pair = Pair(run, sz, B, S, 1000, factory, name, variants)
    peer, reqs = pair.peer, pair.reqs
    steps = sz.burn_in_c + run.warmup + run.repeats
    sels = overlap_selections(np.random.default_rng(9), steps, B, K, S, sz.overlap_c)
    req = torch.tensor(reqs, dtype=torch.int32, device=run.device)
    seq = torch.full((B,), S, dtype=torch.int32, device=run.device)
    recs = {o: RecordedSteps.run(c, reqs, seq, sels, checked_rows=sz.burn_in_c)
            for o, c in pair.ours.items()}
    rec = recs["upstream"]
    peer_err, differ = 0.0, []
    # the peer from our state, step by step, on the selection as ours saw it (it meets upstream's
    # contract): the same slot assignments, so the device rows stay those of our trajectory
    for i in range(steps if peer is not None else 0):
        peer.load_state(0, *rec.states[i])
        out = peer.swap_in_direct(req, seq, rec.selections[i], 0)
        if peer.last_counts()["misses"].cpu().tolist() != rec.misses[i]:
            differ.append(i)
        if i < sz.burn_in_c:
            peer_err = max(peer_err, row_error(pair.pools, reqs, sels[i], out))
    mismatch = f"steps {differ}: the peer's misses differ from ours" if differ else ""
    timed = range(sz.burn_in_c, steps)
    topk = {o: torch.empty((B, K), dtype=torch.int32, device=run.device) for o in recs}
    peer_topk = torch.empty((B, K), dtype=torch.int32, device=run.device)
    canon = torch.empty_like(peer_topk)
    set_peer = None if peer is None else (lambda su, lru: peer.load_state(0, su, lru))
    replays = {o: Replay(recs[o], timed, topk[o], set_coordinator_state(c))
               for o, c in pair.ours.items()}
    peer_replays = (Replay(rec, timed, peer_topk, set_peer),
                    Replay(rec, timed, peer_topk, set_peer,
                           after=lambda: canon.copy_(canonical_selection(peer_topk, seq)[0])))

    def recorded(counts: Callable[[], Dict[str, torch.Tensor]], replay: Replay, err: float,
                 failed: str) -> Check:
        got = counts()["misses"].cpu().tolist()
        want = replay.rec.misses[replay.step]
        return exact(err, failed or ("" if got == want else
                                     f"misses per request {got}, recorded {want}"))

    def columns(r: RecordedSteps) -> Dict:
        return case_columns(sz, "steady_state", B, S,
                            np.mean([sum(r.misses[i]) for i in timed]), step_overlap=sz.overlap_c)

    ours = {o: (lambda c=c, o=o: c.swap_in_selected_pages(req, seq, topk[o], 0), replays[o],
                lambda _, c=c, o=o: recorded(lambda: c.last_counts, replays[o], recs[o].row_err, ""))
            for o, c in pair.ours.items()}
    pair.measure(ours,
                 lambda: peer.swap_in(req, seq, peer_topk, 0),
                 lambda: peer.swap_in_direct(req, seq, canon, 0), peer_replays,
                 (lambda _: recorded(peer.last_counts, peer_replays[0], peer_err, mismatch),
                  lambda _: recorded(peer.last_counts, peer_replays[1], peer_err, mismatch)),
                 columns(rec), ours_cols={o: columns(r) for o, r in recs.items()})


def swap_in_peers(run: BenchRun, sz: Sizes, factory: PeerFactory, name: str,
                  launch_variants: bool = False) -> None:
    """The three cases; ``name`` prefixes the peer's kernel names (``sglang``, or
    ``sglang_model`` for the Python model of upstream's kernel); ``launch_variants``: rows of
    ours for ``LAUNCH_VARIANTS`` too (module doc)."""
    variants = {**ORDER_VARIANTS, **(LAUNCH_VARIANTS if launch_variants else {}),
                **(CUDA_VARIANTS if run.cuda else {})}
    for case in (all_misses, all_hits, steady_state):
        case(run, sz, factory, name, variants)
        if run.cuda:
            torch.cuda.empty_cache()


@register("swap_in_peer", "our HiSparse swap-in in both LRU orders and launch variants beside "
          "SGLang's kernel: all misses B=1, all hits B=64, 85% overlap B=64; the resolve alone")
def swap_in_peer(run: BenchRun) -> None:
    """The swap-in cases of ``peers`` alone (``--quick``: tiny sizes and the Python model of
    upstream's kernel in place of the compiled one)."""
    if run.quick:
        swap_in_peers(run, QUICK, modelled_peer, "sglang_model", launch_variants=True)
    else:
        swap_in_peers(run, FULL, SGLangHiSparsePeer, "sglang", launch_variants=True)
