"""Benchmark of the HiSparse swap-in (coordinator + copy engines) on one GPU.

    python -m harness.bench.swap_in            # H200 run (~3 min)
    python -m harness.bench.swap_in --quick    # CPU smoke run (Triton interpreter, tiny sizes)

Scenarios (fp8_ds_mla rows of 656 B, top_k 2048, device_buffer_size 4096, 64-token pages):
  (a) one request, 2048 missed rows scattered over a 1 M-row host pool: the whole swap-in call
      and the copy alone, per copy engine, as GB/s; against the same engine copying the same
      bytes from contiguous rows, and the pinned host->device ceiling (one 256 MiB copy).
  (b) batch 64, every selected token already resident (all hits): the resolve cost alone, in us.
  (c) batch 64, steady state with 85 % of each step's selection repeated from the previous step.
Each scenario is checked (device bytes behind the returned slots equal the host rows; counts;
(c) also the final LRU state against the pure-Python model) before it is timed. Figures are
medians of CUDA-event timings with a cold L2 (harness/timing.py). A table is printed last; JSON
goes to ``$OUT/swap_in_bench.json`` when ``$OUT`` is set.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List

import numpy as np
import torch

if not torch.cuda.is_available():                 # before any Triton kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backends.copy_engines import COPY_ENGINES
from backends.hisparse_coordinator import HiSparseCoordinator
from harness.lru_model import CoordinatorModel
from harness.timing import time_fn


@dataclass(frozen=True)
class BenchSizes:
    row_bytes: int = 656
    top_k: int = 2048
    device_buffer_size: int = 4096
    page_size: int = 64
    host_rows_a: int = 1 << 20         # (a) host pool rows (one request's positions)
    batch: int = 64                    # (b), (c)
    seq_len_b: int = 6000
    seq_len_c: int = 16384
    overlap_c: float = 0.85
    burn_in_c: int = 4
    ceiling_bytes: int = 256 << 20
    warmup: int = 3
    repeats: int = 20
    uva_rows_sweep: tuple = (1, 2, 4, 8, 16)    # uva_kernel rows per program (default 4)


QUICK = BenchSizes(row_bytes=656, top_k=32, device_buffer_size=64, page_size=8,
                   host_rows_a=4096, batch=3, seq_len_b=100, seq_len_c=400, burn_in_c=2,
                   ceiling_bytes=1 << 20, warmup=1, repeats=3, uva_rows_sweep=(4, 16))


def _random_rows(n: int, row_bytes: int, device: torch.device, gen_seed: int) -> torch.Tensor:
    """Fresh random uint8 rows [n, row_bytes] on the CPU (generated on the device when CUDA)."""
    g = torch.Generator(device=device).manual_seed(gen_seed)
    return torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, device=device,
                         generator=g).cpu()


def row_error(c: HiSparseCoordinator, reqs, sel: np.ndarray, out: torch.Tensor) -> float:
    """Fraction of valid selected entries whose device row (behind ``out``) differs from the
    host row of that position (layer 0)."""
    pool = c.device_pool(0).cpu()
    bad = total = 0
    for b, r in enumerate(reqs):
        live = sel[b] >= 0
        got = pool[out[b].cpu()[torch.from_numpy(live)].long()]
        want = c.host_kv[0][torch.from_numpy(c.host_rows_of(r, sel[b][live]))].cpu()
        bad += int((got != want).any(dim=1).sum())
        total += int(live.sum())
    return bad / max(total, 1)


def _check_rows(c: HiSparseCoordinator, reqs, sel: np.ndarray, out: torch.Tensor) -> None:
    """Device rows behind ``out`` equal the host rows of the selected positions."""
    err = row_error(c, reqs, sel, out)
    if err:
        raise AssertionError(f"swap-in check failed: {err:.1%} of the selected device rows differ "
                             "from the host rows")


def _gbps(nbytes: float, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9 if us == us and us > 0 else float("nan")


def _coordinator(sz: BenchSizes, device, max_requests: int, max_seq_len: int,
                 engine: str = "uva_kernel") -> HiSparseCoordinator:
    return HiSparseCoordinator(
        num_layers=1, max_requests=max_requests, max_seq_len=max_seq_len,
        row_bytes=sz.row_bytes, top_k=sz.top_k, device_buffer_size=sz.device_buffer_size,
        page_size=sz.page_size, copy_engine=engine, device=device, seed=1)


def bench_scattered_misses(sz: BenchSizes, device) -> Dict:
    """(a) 2048 (top_k) missed rows scattered over the host pool, per engine."""
    n = sz.host_rows_a
    c = _coordinator(sz, device, 1, n)
    c.load_host_kv(0, 0, _random_rows(n, sz.row_bytes, device, 11))
    c.prefill([0], [n - 1])
    c.begin_step([0], [n])
    K, D = sz.top_k, sz.device_buffer_size
    rng = np.random.default_rng(3)
    # Disjoint chunks of positions never resident before: every call is all misses.
    fresh = rng.permutation(np.arange(D, n - 1))
    chunks = iter(fresh[i * K:(i + 1) * K] for i in range(len(fresh) // K))
    req = torch.tensor([0], dtype=torch.int32, device=device)
    seq = torch.tensor([n], dtype=torch.int32, device=device)
    topk = torch.empty((1, K), dtype=torch.int32, device=device)
    nbytes = K * sz.row_bytes
    res: Dict = {"rows": K, "bytes": nbytes, "host_rows": n, "engines": {}}

    def next_selection():
        topk.copy_(torch.from_numpy(next(chunks)[None].astype(np.int32)))

    host, dev = c.host_kv[0], c.device_kv[0]
    contiguous = torch.zeros_like(c.plan[:1])
    contiguous[0, 0] = K
    contiguous[0, 1:1 + K] = torch.arange(K, dtype=torch.int32)
    contiguous[0, 1 + c.max_misses:1 + c.max_misses + K] = torch.arange(K, dtype=torch.int32)
    for engine in COPY_ENGINES:
        c.set_copy_engine(engine)
        next_selection()
        out = c.swap_in_selected_pages(req, seq, topk, 0)
        misses = int(c.last_counts["misses"][0])
        if misses != K:
            raise AssertionError(f"(a) expected {K} misses, got {misses}")
        _check_rows(c, [0], topk.cpu().numpy(), out)
        call = time_fn(lambda: c.swap_in_selected_pages(req, seq, topk, 0), device,
                       warmup=sz.warmup, repeats=sz.repeats, setup=next_selection)
        # The copy alone: replay the last call's plan (2048 scattered rows) into the same slots.
        plan = c.plan.clone()
        copy = time_fn(lambda: c.engine.copy(host, dev, plan, 1, 1), device,
                       warmup=sz.warmup, repeats=sz.repeats)
        contig = time_fn(lambda: c.engine.copy(host, dev, contiguous, 1, 1), device,
                         warmup=sz.warmup, repeats=sz.repeats)
        res["engines"][engine] = {
            "swap_in_us": call.median_us, "swap_in_GBps": _gbps(nbytes, call.median_us),
            "copy_us": copy.median_us, "copy_GBps": _gbps(nbytes, copy.median_us),
            "contiguous_us": contig.median_us, "contiguous_GBps": _gbps(nbytes, contig.median_us)}
    # Tile height of the zero-copy kernel (rows in flight per program).
    sweep = {}
    for rows in sz.uva_rows_sweep:
        c.set_copy_engine("uva_kernel", rows_per_program=rows)
        t = time_fn(lambda: c.engine.copy(host, dev, plan, 1, 1), device,
                    warmup=sz.warmup, repeats=sz.repeats)
        sweep[rows] = {"copy_us": t.median_us, "copy_GBps": _gbps(nbytes, t.median_us)}
    res["uva_rows_per_program"] = sweep
    # Pinned host -> device ceiling: one big copy-engine transfer.
    pin = torch.device(device).type == "cuda"
    h = torch.empty(sz.ceiling_bytes, dtype=torch.uint8, pin_memory=pin)
    d = torch.empty(sz.ceiling_bytes, dtype=torch.uint8, device=device)
    t = time_fn(lambda: d.copy_(h, non_blocking=True), device, warmup=2, repeats=5)
    res["pinned_h2d_ceiling"] = {"bytes": sz.ceiling_bytes, "us": t.median_us,
                                 "GBps": _gbps(sz.ceiling_bytes, t.median_us)}
    del c, h, d
    return res


def _batch_coordinator(sz: BenchSizes, device, seq_len: int, seed: int):
    B = sz.batch
    c = _coordinator(sz, device, B, seq_len)
    for r in range(B):
        c.load_host_kv(0, r, _random_rows(seq_len, sz.row_bytes, device, seed + r))
    reqs = list(range(B))
    return c, reqs


def bench_all_hits(sz: BenchSizes, device) -> Dict:
    """(b) batch of long requests selecting only resident tokens (and the newest): no loads."""
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_b
    c, reqs = _batch_coordinator(sz, device, S, 100)
    c.prefill(reqs, [S - 1] * B)
    c.begin_step(reqs, [S] * B)
    rng = np.random.default_rng(5)
    sel = np.stack([np.concatenate([rng.permutation(D)[:K - 1], [S - 1]]) for _ in reqs])
    req_t = torch.tensor(reqs, dtype=torch.int32, device=device)
    seq_t = torch.full((B,), S, dtype=torch.int32, device=device)
    topk = torch.from_numpy(sel.astype(np.int32)).to(device)
    res: Dict = {"batch": B, "top_k": K, "device_buffer_size": D, "engines": {}}
    for engine in COPY_ENGINES:
        c.set_copy_engine(engine)
        out = c.swap_in_selected_pages(req_t, seq_t, topk, 0)
        counts = {k: v.cpu().numpy() for k, v in c.last_counts.items()}
        if counts["misses"].any() or (counts["hits"] != K).any():
            raise AssertionError("(b) expected all hits")
        _check_rows(c, reqs, sel, out)
        t = time_fn(lambda: c.swap_in_selected_pages(req_t, seq_t, topk, 0), device,
                    warmup=sz.warmup, repeats=sz.repeats)
        res["engines"][engine] = {"us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us}
    # The resolve kernel alone (no copy launch), at this batch and at batch 1.
    for name, n in (("resolve_only", B), ("resolve_only_batch1", 1)):
        t = time_fn(lambda: c.resolve_selection(req_t[:n], seq_t[:n], topk[:n], 0), device,
                    warmup=sz.warmup, repeats=sz.repeats)
        res["engines"][name] = {"us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us}
    return res


def _overlap_selections(rng, steps: int, batch: int, top_k: int, seq_len: int,
                        overlap: float) -> List[np.ndarray]:
    """Per step [batch, top_k] selections; each keeps ``overlap`` of the previous one."""
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


def bench_steady_state(sz: BenchSizes, device) -> Dict:
    """(c) batch of long requests, each step repeating ``overlap_c`` of the previous selection."""
    B, K, D, S = sz.batch, sz.top_k, sz.device_buffer_size, sz.seq_len_c
    c, reqs = _batch_coordinator(sz, device, S, 1000)
    steps = sz.burn_in_c + sz.warmup + sz.repeats
    sels = _overlap_selections(np.random.default_rng(9), steps, B, K, S, sz.overlap_c)
    sel_t = [torch.from_numpy(s.astype(np.int32)).to(device) for s in sels]
    req_t = torch.tensor(reqs, dtype=torch.int32, device=device)
    seq_t = torch.full((B,), S, dtype=torch.int32, device=device)
    topk = torch.empty((B, K), dtype=torch.int32, device=device)
    res: Dict = {"batch": B, "top_k": K, "device_buffer_size": D, "seq_len": S,
                 "overlap": sz.overlap_c, "engines": {}}
    # The reference: the pure-Python model over the same steps (misses per step, final LRU).
    model = CoordinatorModel(1, D, sz.page_size, "token")
    model.prefill(reqs, [S - 1] * B)
    model.begin_step(reqs, [S] * B)
    want_misses = [[x.misses for x in model.swap_in(reqs, [S] * B, sels[i].tolist(), 0)]
                   for i in range(steps)]
    want_lru = [model.buffer(0, r).lru for r in reqs]
    res["model_misses_per_request"] = [float(np.mean(m)) for m in want_misses]
    variants = [(e, None) for e in COPY_ENGINES] + [("uva_kernel", r) for r in sz.uva_rows_sweep
                                                     if r != 4]
    for engine, rows_per_program in variants:
        name = engine if rows_per_program is None else f"uva_kernel_rows{rows_per_program}"
        c.set_copy_engine(engine, rows_per_program=rows_per_program)
        c.prefill(reqs, [S - 1] * B)
        c.begin_step(reqs, [S] * B)
        misses = []
        for i in range(sz.burn_in_c):                  # checked steps, reaching steady state
            topk.copy_(sel_t[i])
            out = c.swap_in_selected_pages(req_t, seq_t, topk, 0)
            got = c.last_counts["misses"].cpu().numpy()
            if want_misses[i] != got.tolist():
                raise AssertionError(f"(c) {name} step {i}: misses differ from the model")
            _check_rows(c, reqs, sels[i], out)
            misses.append(float(got.mean()))
        it = iter(range(sz.burn_in_c, steps))

        def next_step():
            topk.copy_(sel_t[next(it)])

        t = time_fn(lambda: c.swap_in_selected_pages(req_t, seq_t, topk, 0), device,
                    warmup=sz.warmup, repeats=sz.repeats, setup=next_step)
        lru = c.lru[0].cpu().numpy()
        for r in reqs:
            if lru[r].tolist() != want_lru[r]:
                raise AssertionError(f"(c) {name}: LRU of request {r} differs from the model")
        last_misses = c.last_counts["misses"].cpu().numpy()
        if last_misses.tolist() != want_misses[-1]:
            raise AssertionError(f"(c) {name}: last step's misses differ from the model")
        rows = float(last_misses.sum())
        res["engines"][name] = {
            "us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us,
            "misses_per_request_last": float(last_misses.mean()),
            "misses_per_request_burn_in": misses,
            "GBps_last_step": _gbps(rows * sz.row_bytes, t.median_us)}
    return res


def _table(results: Dict) -> str:
    lines = ["scenario                          engine       median_us   GB/s"]
    a = results["a_scattered_misses"]
    for e, r in a["engines"].items():
        lines.append(f"(a) swap-in {a['rows']} missed rows      {e:<12} {r['swap_in_us']:9.1f} "
                     f"{r['swap_in_GBps']:6.2f}")
        lines.append(f"(a)   copy only                   {e:<12} {r['copy_us']:9.1f} "
                     f"{r['copy_GBps']:6.2f}")
        lines.append(f"(a)   contiguous, same bytes      {e:<12} {r['contiguous_us']:9.1f} "
                     f"{r['contiguous_GBps']:6.2f}")
    for rows, r in a["uva_rows_per_program"].items():
        lines.append(f"(a)   uva copy, {rows:>2} rows/program   uva_kernel   {r['copy_us']:9.1f} "
                     f"{r['copy_GBps']:6.2f}")
    ce = a["pinned_h2d_ceiling"]
    lines.append(f"(a) pinned H2D ceiling ({ce['bytes'] >> 20} MiB)    copy_        "
                 f"{ce['us']:9.1f} {ce['GBps']:6.2f}")
    b = results["b_all_hits"]
    for e, r in b["engines"].items():
        lines.append(f"(b) all hits, batch {b['batch']:<3}            {e:<12.20} "
                     f"{r['us']:9.1f}      -")
    cc = results["c_steady_state"]
    for e, r in cc["engines"].items():
        lines.append(f"(c) {int(cc['overlap'] * 100)}% overlap, batch {cc['batch']:<3}         "
                     f"{e:<12.18} {r['us']:9.1f} {r['GBps_last_step']:6.2f}  "
                     f"(misses/req {r['misses_per_request_last']:.0f})")
    return "\n".join(lines)


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sz = QUICK if (args.quick or not cuda) else BenchSizes()
    t0 = time.time()
    results = {"device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
               "quick": sz is QUICK, "sizes": asdict(sz)}
    results["a_scattered_misses"] = bench_scattered_misses(sz, device)
    print(f"[swap_in bench] (a) done {time.time() - t0:.0f}s", flush=True)
    results["b_all_hits"] = bench_all_hits(sz, device)
    print(f"[swap_in bench] (b) done {time.time() - t0:.0f}s", flush=True)
    results["c_steady_state"] = bench_steady_state(sz, device)
    results["wall_s"] = time.time() - t0
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "swap_in_bench.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    print(_table(results))
    return results


if __name__ == "__main__":
    main()
