"""How ``pattern=calibrated`` is calibrated: steady-state miss rates of the HiSparse
coordinator's exact LRU (``harness/lru_model.py``) on its selections, the offline optimum for
comparison, and the consecutive-step and adjacent-layer overlaps.

Protocol (``CalibrationProtocol``; the full-size defaults are what the fit used): top-k 2048,
context 32K (every request longer than the largest hot buffer, 4 x top-k, so none is *short*),
8 requests x 2 layers (layer 1 inherits ``layer_share`` of its positions from layer 0), the
hot buffers of 1 x, 2 x and 4 x top-k start as after prefill (positions 0 .. D-1), 48 warm-up
decode steps (the 4 x buffer holds about 26 steps of history; after prefill its miss rate
settles within about 20 steps), then 64 measured steps. A miss rate is misses / (hits +
misses) over every measured (step, layer, request), the newest token counted as a hit in the
reserved slot, as the coordinator counts. ``python -m harness.selection_calibration`` runs it
and prints the table (``--quick`` the reduced size the tests use).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np

from harness.calibrated_selection import calibrated_selections
from harness.lru_model import HotBufferModel
from harness.selection import PatternParams
from harness.workload import synthetic_seq_lens

#: published exact-LRU miss rates at top-k 2048 by hot buffer size (multiple of top-k): HiSparse
TARGET_MISS = {1: 0.300, 2: 0.134, 4: 0.067}
#: published offline-optimal miss rate at a 2 x buffer (HiSparse): reported beside ours, not fitted
TARGET_OPTIMAL_2X = 0.082


@dataclass(frozen=True)
class CalibrationProtocol:
    top_k: int = 2048
    context_len: int = 32768
    requests: int = 8
    layers: int = 2
    warmup_steps: int = 48
    measured_steps: int = 64
    seed: int = 0


#: the reduced size of the tests: the model is scale-free in top_k while the context holds
#: its history (about 9 x top_k tokens), so the same rates are expected
QUICK = CalibrationProtocol(top_k=256, context_len=4096, requests=4, layers=2,
                            warmup_steps=40, measured_steps=48)


def selections(protocol: CalibrationProtocol, params: PatternParams) -> tuple[np.ndarray, np.ndarray]:
    """(topk int32 [steps, layers, requests, top_k], seq_lens int32 [steps, requests])."""
    p = protocol
    seq_lens = synthetic_seq_lens(p.context_len, p.warmup_steps + p.measured_steps, p.requests)
    topk = calibrated_selections(seq_lens, p.layers, p.top_k, params.reuse_overlap,
                                 params.reuse_alpha, params.layer_share, p.seed)
    return topk, seq_lens


def lru_miss_rate(topk: np.ndarray, seq_lens: np.ndarray, buffer_size: int, warmup_steps: int,
                  layers: Sequence[int] | None = None) -> float:
    """Exact-LRU (token granularity) misses / selected over steps >= warmup_steps, every request
    and the given layers (all by default); hot buffers of ``buffer_size`` slots after prefill."""
    steps, num_layers, batch, _ = topk.shape
    hits = misses = 0
    for layer in (range(num_layers) if layers is None else layers):
        for req in range(batch):
            buf = HotBufferModel(buffer_size, 1, "token")
            buf.prefill(int(seq_lens[0, req]) - 1)
            for s in range(steps):
                n = int(seq_lens[s, req])
                buf.begin_step(n)
                r = buf.step(n, topk[s, layer, req].tolist())
                if s >= warmup_steps:
                    hits, misses = hits + r.hits, misses + r.misses
    return misses / (hits + misses)


def optimal_miss_rate(topk: np.ndarray, seq_lens: np.ndarray, buffer_size: int,
                      warmup_steps: int, layer: int = 0) -> float:
    """The offline optimum (Belady: evict what is next needed furthest in the future) for the
    same buffers, start state and counting as ``lru_miss_rate`` (newest token: reserved hit)."""
    steps, _, batch, _ = topk.shape
    hits = misses = 0
    for req in range(batch):
        sel = topk[:, layer, req]
        length = int(seq_lens.max())
        next_use = np.full(length, steps, dtype=np.int64)  # refreshed backwards per step
        nxt = np.empty_like(sel, dtype=np.int64)
        for s in range(steps - 1, -1, -1):
            row = sel[s][sel[s] >= 0]
            nxt[s, : row.size] = next_use[row]
            next_use[row] = s
        resident = np.zeros(length, dtype=bool)
        resident[: min(buffer_size, int(seq_lens[0, req]) - 1)] = True
        when = next_use.copy()  # for resident tokens: the next step that wants them
        for s in range(steps):
            n = int(seq_lens[s, req])
            row = sel[s][sel[s] >= 0]
            hit, miss = row.size, 0
            if n > buffer_size:
                keep = row != n - 1  # the newest token: reserved slot
                want = row[keep]
                missed = want[~resident[want]]
                hit, miss = row.size - missed.size, missed.size
                when[want] = nxt[s, : row.size][keep]
                held = np.flatnonzero(resident)
                over = held.size + missed.size - buffer_size
                if over > 0:
                    spare = held[~np.isin(held, want)]
                    resident[spare[np.argpartition(-when[spare], over - 1)[:over]]] = False
                resident[missed] = True
            if s >= warmup_steps:
                hits, misses = hits + hit, misses + miss
    return misses / (hits + misses)


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean |a_row & b_row| / |a_row| over rows of two selections ``[..., top_k]`` (rows of
    distinct positions, -1 padded)."""
    both = np.sort(np.concatenate([a, b], axis=-1), axis=-1)
    shared = ((both[..., 1:] == both[..., :-1]) & (both[..., 1:] >= 0)).sum(-1)
    return float((shared / np.maximum((a >= 0).sum(-1), 1)).mean())


def measure(protocol: CalibrationProtocol, params: PatternParams, multiples=(1, 2, 4),
            optimum: bool = False) -> Dict[str, float]:
    """Miss rates by buffer multiple (``miss_1x`` ...), ``optimal_2x`` (when asked),
    ``step_overlap`` and ``layer_overlap`` of the calibrated selections under ``protocol``."""
    topk, seq_lens = selections(protocol, params)
    k, w = protocol.top_k, protocol.warmup_steps
    out = {f"miss_{m}x": lru_miss_rate(topk, seq_lens, m * k, w) for m in multiples}
    if optimum:
        out["optimal_2x"] = optimal_miss_rate(topk, seq_lens, 2 * k, w)
    out["step_overlap"] = overlap(topk[1:], topk[:-1])
    if protocol.layers > 1:
        out["layer_overlap"] = overlap(topk[:, 1:], topk[:, :-1])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tests' reduced size")
    ap.add_argument("--reuse-overlap", type=float, default=PatternParams.reuse_overlap)
    ap.add_argument("--reuse-alpha", type=float, default=PatternParams.reuse_alpha)
    ap.add_argument("--layer-share", type=float, default=PatternParams.layer_share)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    base = QUICK if a.quick else CalibrationProtocol()
    protocol = CalibrationProtocol(**{**base.__dict__, "seed": a.seed})
    params = PatternParams("calibrated", reuse_overlap=a.reuse_overlap, reuse_alpha=a.reuse_alpha,
                           layer_share=a.layer_share)
    got = measure(protocol, params, optimum=True)
    print(f"{protocol}\n{params}")
    print("| quantity | measured | published |\n|---|---|---|")
    for m, target in TARGET_MISS.items():
        print(f"| LRU miss rate, {m}x top-k buffer | {got[f'miss_{m}x']:.2%} | {target:.1%} |")
    print(f"| offline-optimal miss rate, 2x | {got['optimal_2x']:.2%} | {TARGET_OPTIMAL_2X:.1%} |")
    print(f"| consecutive-step overlap | {got['step_overlap']:.2%} | ~60 % (GVR) |")
    if "layer_overlap" in got:
        print(f"| adjacent-layer overlap | {got['layer_overlap']:.2%} | 70-100 % (IndexCache) |")


if __name__ == "__main__":
    main()
