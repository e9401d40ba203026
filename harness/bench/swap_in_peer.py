"""Our HiSparse swap-in (``HiSparseCoordinator.swap_in_selected_pages``, ``uva_kernel`` copies)
beside SGLang's own kernel (``backends/kernels/sglang_peer.py``), on identical pools and
selections, measured in the same process (part of ``python -m harness.bench peers``).

Scenarios (``harness.bench.swap_in.BenchSizes``: 656 B rows, top_k 2048, 4096 hot slots):
  (a) one request, every call ``top_k`` missed rows scattered over a 1 M-row host pool;
  (b) batch 64, every selected token resident (all hits): the resolve cost alone;
  (c) batch 64, each step keeping 85 % of the previous selection, in lockstep: before each of
      upstream's calls its hot-buffer state is set (untimed) to ours before the same step, so
      both do exactly the same hits, misses and bytes.
Each side is timed twice where it differs: ``peer_us`` is the peer's full call (our
canonicalising sort of the selection, which lets upstream's kernel take arbitrary input, plus
the kernel), ``peer_kernel_us`` upstream's kernel alone on the canonical selection (what SGLang
runs, its top-k being already valid and distinct). ``*_rel_err``: fraction of selected entries
whose device row differs from the host row (0 when correct). Misses are checked equal per
request between the two sides in (a)-(c) before any timing.
"""
from __future__ import annotations

import itertools
from typing import Callable, Dict, List

import numpy as np
import torch

from backends.hisparse_coordinator import HiSparseCoordinator
from backends.kernels.sglang_peer import SGLangHiSparsePeer, canonical_selection
from harness.bench.swap_in import (BenchSizes, _coordinator, _overlap_selections, _random_rows,
                                   row_error)
from harness.timing import time_fn

PeerFactory = Callable[[HiSparseCoordinator], SGLangHiSparsePeer]


def _pair(sz: BenchSizes, device, reqs: List[int], seq_len: int, seed: int, peer_factory: PeerFactory):
    """Two coordinators with identical host KV and hot buffers (ours, and the peer's pools)."""
    ours = _coordinator(sz, device, len(reqs), seq_len)
    pools = _coordinator(sz, device, len(reqs), seq_len)
    for r in reqs:
        rows = _random_rows(seq_len, sz.row_bytes, device, seed + r)
        ours.load_host_kv(0, r, rows)
        pools.load_host_kv(0, r, rows)
    for c in (ours, pools):
        c.prefill(reqs, [seq_len - 1] * len(reqs))
        c.begin_step(reqs, [seq_len] * len(reqs))
    peer = peer_factory(pools)
    peer.prefill(reqs)
    peer.begin_step(reqs, [seq_len] * len(reqs))
    return ours, pools, peer


def _row(name: str, B: int, sz: BenchSizes, **kw) -> Dict:
    return {"kernel": f"swap_in {name}", "B": B, "top_k": sz.top_k, "peer": "sglang",
            "device_buffer_size": sz.device_buffer_size, **kw}


def _misses_equal(ours: HiSparseCoordinator, peer: SGLangHiSparsePeer, what: str) -> float:
    mo = ours.last_counts["misses"].cpu()
    mp = peer.last_counts()["misses"].cpu()
    if not torch.equal(mo.to(torch.int64), mp):
        raise AssertionError(f"{what}: misses differ (ours {mo.tolist()}, sglang {mp.tolist()})")
    return float(mo.double().mean())


def _time_pair(row: Dict, device, sz: BenchSizes, ours_fn, peer_fn, kernel_fn, setups) -> Dict:
    """Times ours, the peer's call and upstream's kernel alone; ``setups`` gives each its own
    untimed per-call set-up."""
    kw = dict(warmup=sz.warmup, repeats=sz.repeats)
    t_o = time_fn(ours_fn, device, setup=setups[0], **kw)
    t_p = time_fn(peer_fn, device, setup=setups[1], **kw)
    t_k = time_fn(kernel_fn, device, setup=setups[2], **kw)
    row.update(ours_us=t_o.median_us, peer_us=t_p.median_us, peer_kernel_us=t_k.median_us,
               ours_over_peer=t_o.median_us / t_p.median_us,
               ours_over_peer_kernel=t_o.median_us / t_k.median_us)
    return row


def scattered_misses(sz: BenchSizes, device, peer_factory: PeerFactory) -> Dict:
    """(a) one request, ``top_k`` never-resident positions per call."""
    n, K, D = sz.host_rows_a, sz.top_k, sz.device_buffer_size
    ours, pools, peer = _pair(sz, device, [0], n, 11, peer_factory)
    fresh = np.random.default_rng(3).permutation(np.arange(D, n - 1)).astype(np.int32)
    calls = 1 + 3 * (sz.warmup + sz.repeats)
    if len(fresh) < calls * K:
        raise ValueError(f"host_rows_a={n} too small for {calls} calls of {K} fresh rows")
    chunks = fresh[:calls * K].reshape(calls, 1, K)
    req = torch.tensor([0], dtype=torch.int32, device=device)
    seq = torch.tensor([n], dtype=torch.int32, device=device)
    topk = torch.from_numpy(chunks[0]).to(device)
    out_o = ours.swap_in_selected_pages(req, seq, topk, 0)
    out_p = peer.swap_in(req, seq, topk, 0)
    if _misses_equal(ours, peer, "(a)") != K:
        raise AssertionError(f"(a) expected {K} misses")
    row = _row("(a) all misses", 1, sz, misses_per_req=float(K),
               ours_rel_err=row_error(ours, [0], chunks[0], out_o),
               peer_rel_err=row_error(pools, [0], chunks[0], out_p))
    it = iter(range(1, calls))
    sel = torch.empty_like(topk)
    canon = torch.empty_like(topk)

    def next_sel():
        sel.copy_(torch.from_numpy(chunks[next(it)]))

    def next_canon():
        next_sel()
        canon.copy_(canonical_selection(sel, seq)[0])

    return _time_pair(row, device, sz, lambda: ours.swap_in_selected_pages(req, seq, sel, 0),
                      lambda: peer.swap_in(req, seq, sel, 0),
                      lambda: peer.swap_in_direct(req, seq, canon, 0),
                      (next_sel, next_sel, next_canon))


def all_hits(sz: BenchSizes, device, peer_factory: PeerFactory) -> Dict:
    """(b) batch of long requests selecting only resident tokens and the newest one."""
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    reqs = list(range(B))
    ours, pools, peer = _pair(sz, device, reqs, S, 100, peer_factory)
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in reqs])
    req = torch.tensor(reqs, dtype=torch.int32, device=device)
    seq = torch.full((B,), S, dtype=torch.int32, device=device)
    topk = torch.from_numpy(sel.astype(np.int32)).to(device)
    out_o = ours.swap_in_selected_pages(req, seq, topk, 0)
    out_p = peer.swap_in(req, seq, topk, 0)
    if _misses_equal(ours, peer, "(b)") != 0:
        raise AssertionError("(b) expected all hits")
    row = _row("(b) all hits", B, sz, misses_per_req=0.0,
               ours_rel_err=row_error(ours, reqs, sel, out_o),
               peer_rel_err=row_error(pools, reqs, sel, out_p))
    canon = canonical_selection(topk, seq)[0]
    return _time_pair(row, device, sz, lambda: ours.swap_in_selected_pages(req, seq, topk, 0),
                      lambda: peer.swap_in(req, seq, topk, 0),
                      lambda: peer.swap_in_direct(req, seq, canon, 0), (None, None, None))


def steady_state(sz: BenchSizes, device, peer_factory: PeerFactory) -> Dict:
    """(c) overlapping steps; upstream starts each call from our state before the same step."""
    B, K, S = sz.batch, sz.top_k, sz.seq_len_c
    reqs = list(range(B))
    ours, pools, peer = _pair(sz, device, reqs, S, 1000, peer_factory)
    steps = sz.burn_in_c + sz.warmup + sz.repeats
    sels = _overlap_selections(np.random.default_rng(9), steps, B, K, S, sz.overlap_c)
    sel_t = [torch.from_numpy(s.astype(np.int32)).to(device) for s in sels]
    req = torch.tensor(reqs, dtype=torch.int32, device=device)
    seq = torch.full((B,), S, dtype=torch.int32, device=device)
    states, misses, errs = [], [], [0.0, 0.0]
    for i in range(steps):                       # ours, recording the state before each step
        states.append((ours.slot_unit[0].clone(), ours.lru[0].clone()))
        out_o = ours.swap_in_selected_pages(req, seq, sel_t[i], 0)
        peer.load_state(0, *states[i])
        out_p = peer.swap_in(req, seq, sel_t[i], 0)
        misses.append(_misses_equal(ours, peer, f"(c) step {i}"))
        if i < sz.burn_in_c:
            errs[0] = max(errs[0], row_error(ours, reqs, sels[i], out_o))
            errs[1] = max(errs[1], row_error(pools, reqs, sels[i], out_p))
    timed = range(sz.burn_in_c, steps)
    row = _row(f"(c) {round(sz.overlap_c * 100)}% overlap", B, sz,
               misses_per_req=float(np.mean([misses[i] for i in timed])),
               ours_rel_err=errs[0], peer_rel_err=errs[1])
    topk = torch.empty_like(sel_t[0])
    canon = torch.empty_like(sel_t[0])

    def replay(set_state, canonical: bool = False):
        """Set-up of one timed call: the next timed step's state (as ours had it) and selection."""
        calls = itertools.count()

        def setup():
            i = timed[next(calls) % len(timed)]
            set_state(*states[i])
            topk.copy_(sel_t[i])
            if canonical:
                canon.copy_(canonical_selection(topk, seq)[0])
        return setup

    def set_ours(slot_unit, lru):
        ours.slot_unit[0].copy_(slot_unit)
        ours.lru[0].copy_(lru)

    def set_peer(slot_unit, lru):
        peer.load_state(0, slot_unit, lru)

    return _time_pair(row, device, sz, lambda: ours.swap_in_selected_pages(req, seq, topk, 0),
                      lambda: peer.swap_in(req, seq, topk, 0),
                      lambda: peer.swap_in_direct(req, seq, canon, 0),
                      (replay(set_ours), replay(set_peer), replay(set_peer, canonical=True)))


def swap_in_peer_rows(sz: BenchSizes, device, peer_factory: PeerFactory = SGLangHiSparsePeer
                      ) -> List[Dict]:
    """(a), (b), (c) as rows of the peers table."""
    rows = []
    for scenario in (scattered_misses, all_hits, steady_state):
        rows.append(scenario(sz, device, peer_factory))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows
