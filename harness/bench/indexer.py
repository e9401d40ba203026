"""Benchmark of the shared indexer and top-k kernels.

``python -m harness.bench.indexer`` (GPU) measures, in one run:

* the HBM copy ceiling (device-to-device copy, counting read + write);
* the lightning indexer (``indexer_logits_paged``, fp8 keys) at batch 64 and contexts
  8K / 32K / 128K, 64 heads x 128 dims, page 64, as GB/s of index keys read (132 B per token)
  and as a fraction of the copy ceiling;
* top-2048 (``topk_per_row`` with a reused plan) on the indexer's logits at 32K / 128K against
  ``torch.topk`` on the same rows (and the plan's own cost);
* fused vs unfused top-k + PAGED transform.

Every kernel is checked against the plain-torch reference before it is timed. Figures are
cold-L2 medians from ``harness.timing.time_fn``. A short table is printed last; the JSON goes to
``$OUT/indexer_bench.json`` when ``OUT`` is set. ``--quick`` is a tiny CPU smoke run (Triton
interpreter; its times are not performance figures). ``--tune`` also sweeps launch configs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backends.kernels import indexer as indexer_mod  # noqa: E402
from backends.kernels import topk as topk_mod  # noqa: E402
from backends.kernels.indexer import indexer_logits_paged  # noqa: E402
from backends.kernels.topk import plan_topk, topk_per_row  # noqa: E402
from backends.kernels.topk_transform import TopkTransformMethod, topk_transform  # noqa: E402
from backends.kernels.index_cache import IndexKeyCache  # noqa: E402
from harness.indexer_ref import indexer_logits_paged_ref, paged_transform_ref  # noqa: E402
from harness.timing import capture_graph, time_fn  # noqa: E402


def timed(fn, device: torch.device, args, repeats: int = 0) -> Dict[str, float]:
    """Cold-L2 medians (us) of a Python call (``call_us``: launch overhead included) and, on the
    GPU, of a CUDA-graph replay of it (``graph_us``: the kernels alone, back to back)."""
    repeats = repeats or args.repeats
    call = time_fn(fn, device, warmup=args.warmup, repeats=repeats)
    res = dict(call_us=call.median_us, call_p10_us=call.p10_us, call_p90_us=call.p90_us)
    if device.type == "cuda":
        graph, _ = capture_graph(fn)
        st = time_fn(graph.replay, device, warmup=2, repeats=repeats)
        res.update(graph_us=st.median_us, graph_p10_us=st.p10_us, graph_p90_us=st.p90_us)
        del graph
    res["us"] = res.get("graph_us", res["call_us"])
    return res


def kernel_breakdown(fn, device: torch.device, calls: int = 5) -> Dict[str, float]:
    """Average GPU time (us) per call of each kernel ``fn`` launches (torch profiler)."""
    if device.type != "cuda":
        return {}
    try:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        out = {}
        for ev in prof.key_averages():
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if t > 0:
                out[ev.key[:60]] = t / calls
        return out
    except Exception as e:  # the profiler is a diagnostic, never fatal
        return {"profiler_error": str(e)[:200]}


def measure_copy_ceiling(device: torch.device, nbytes: int, repeats: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    st = time_fn(lambda: dst.copy_(src), device, warmup=3, repeats=repeats)
    return 2 * nbytes / (st.median_us * 1e-6) / 1e9


def build_problem(B: int, ctx: int, H: int, D: int, page: int, device: torch.device,
                  seed: int = 0, fmt: str = "fp8"):
    """Random fp8 index-key cache (shuffled pages), queries, weights, lengths = ctx for all."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages_per_req = (ctx + page - 1) // page
    num_pages = B * pages_per_req
    cache = IndexKeyCache.allocate(num_pages, page, D, fmt, device)
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    block_table = perm.view(B, pages_per_req).to(device)
    # every slot of every page holds a key (whole pages written at once)
    keys = torch.randn(num_pages * page, D, device=device)
    cache.write_slots(torch.arange(num_pages * page, device=device), keys)
    del keys
    q = torch.randn(B, H, D, device=device).to(torch.bfloat16)
    w = torch.randn(B, H, device=device) * H ** -0.5
    seq_lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    return cache, block_table, q, w, seq_lens


def check_indexer(out, q, w, cache, bt, lens, rows: List[int]) -> float:
    """Max |error| / max |ref| over some rows (reference recomputed for those rows only)."""
    idx = torch.tensor(rows, device=q.device)
    ref = indexer_logits_paged_ref(q[idx], w[idx], cache.data, bt[idx], lens[idx],
                                   max_len=out.shape[1])
    got = out[idx]
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(got)):
        raise AssertionError("indexer: -inf pattern differs from the reference")
    err = (got[fin] - ref[fin]).abs().max().item() / max(ref[fin].abs().max().item(), 1e-30)
    if err > 1e-4:
        raise AssertionError(f"indexer: relative error {err:.3g} vs the reference")
    return err


def check_topk(pos: torch.Tensor, logits: torch.Tensor, lens: torch.Tensor, k: int) -> None:
    """Scores at the returned positions equal torch.topk's (as sorted sets); no duplicates."""
    for b in range(logits.shape[0]):
        n = int(lens[b])
        p = pos[b]
        valid = p[p >= 0].long()
        kk = min(k, n)
        if valid.numel() != kk or (p[kk:] != -1).any():
            raise AssertionError(f"top-k row {b}: {valid.numel()} positions, expected {kk}")
        if valid.unique().numel() != kk or (valid >= n).any():
            raise AssertionError(f"top-k row {b}: duplicate or out-of-range positions")
        got = logits[b, valid].sort().values
        ref = torch.topk(logits[b, :n], kk).values.sort().values
        if not torch.equal(got, ref):
            raise AssertionError(f"top-k row {b}: score set differs from torch.topk")


def bench_indexer(args, device, ceiling, results: Dict) -> Dict[int, tuple]:
    B, H, D, P = args.batch, args.heads, args.dim, args.page
    kept = {}
    for ctx in args.contexts:
        cache, bt, q, w, lens = build_problem(B, ctx, H, D, P, device)
        fn = lambda: indexer_logits_paged(q, w, cache.data, bt, lens, max_len=ctx)  # noqa: E731
        out = fn()
        err = check_indexer(out, q, w, cache, bt, lens, sorted({0, B // 2, B - 1}))
        t = timed(fn, device, args)
        key_bytes = B * ctx * cache.bytes_per_token
        gbs = key_bytes / (t["us"] * 1e-6) / 1e9
        results["indexer"].append(dict(batch=B, context=ctx, heads=H, dim=D, page=P,
                                       key_bytes=key_bytes, key_gb_s=gbs,
                                       call_key_gb_s=key_bytes / (t["call_us"] * 1e-6) / 1e9,
                                       frac_of_copy=gbs / ceiling if ceiling else None,
                                       rel_err=err, **t))
        print(f"indexer ctx={ctx}: {t['us']:.1f} us ({t['call_us']:.1f} us per call), "
              f"{gbs:.0f} GB/s of keys", flush=True)
        if args.tune in ("all", "indexer") and device.type == "cuda" and ctx >= 32768:
            print(f"  kernels: {kernel_breakdown(fn, device)}", flush=True)
            print(f"  compiled: {describe_compiled(indexer_mod._indexer_logits_kernel)}", flush=True)
            tune_indexer(args, fn, device, key_bytes, results, ctx)
            if ctx == 32768:
                c16, bt16, q16, w16, l16 = build_problem(B, ctx, H, D, P, device, fmt="bf16")
                f16 = lambda: indexer_logits_paged(q16, w16, c16.data, bt16, l16, max_len=ctx)  # noqa: E731
                check_indexer(f16(), q16, w16, c16, bt16, l16, [0, B - 1])
                t16 = timed(f16, device, args, repeats=10)
                b16 = B * ctx * c16.bytes_per_token
                results.setdefault("indexer_bf16", []).append(
                    dict(context=ctx, key_gb_s=b16 / (t16["us"] * 1e-6) / 1e9, **t16))
                print(f"  bf16 keys ctx={ctx}: {t16['us']:.1f} us, "
                      f"{b16 / (t16['us'] * 1e-6) / 1e9:.0f} GB/s", flush=True)
                del c16, q16, w16
        if ctx in args.topk_contexts:
            kept[ctx] = (out, bt, lens)
        del cache, q, w
        if ctx not in args.topk_contexts:
            del out
    return kept


_TUNE_KNOBS = ("BLOCK_N", "NUM_WARPS", "NUM_STAGES", "MAX_TOKENS_PER_PROGRAM",
               "TILE_IN_PAGE_FASTPATH", "MAXNREG")
_TUNE_CONFIGS = [(64, 4, 2, 2048, True, None), (64, 4, 3, 2048, True, None),
                 (64, 4, 4, 4096, True, None), (64, 4, 2, 2048, True, 128),
                 (64, 4, 3, 2048, True, 96), (128, 8, 3, 2048, False, None),
                 (128, 4, 3, 2048, False, None)]
_TOPK_KNOBS = ("RADIX_BITS", "SELECT_WARPS", "SELECT_STAGES", "SCAN_BLOCK_MAX", "SCAN_WARPS",
               "SCAN_STAGES")
_TOPK_CONFIGS = [(1, 8, 3, 2048, 4, 4), (1, 16, 3, 2048, 4, 4), (1, 8, 3, 4096, 8, 3),
                 (1, 8, 3, 1024, 4, 4), (1, 8, 3, 1024, 2, 4)]


def describe_compiled(jit_fn) -> List[Dict]:
    """Registers, spills, shared memory and a few op counts of each compiled variant."""
    rows = []
    try:
        for cache in jit_fn.device_caches.values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for kern in kernels.values():
                ttgir = kern.asm.get("ttgir", "")
                ptx = kern.asm.get("ptx", "")
                rows.append(dict(
                    n_regs=getattr(kern, "n_regs", None), n_spills=getattr(kern, "n_spills", None),
                    shared=getattr(kern.metadata, "shared", None),
                    num_warps=getattr(kern.metadata, "num_warps", None),
                    warp_group_dot=ttgir.count("warp_group_dot"), tt_dot=ttgir.count("tt.dot"),
                    local_alloc=ttgir.count("local_alloc"), convert_layout=ttgir.count("convert_layout"),
                    wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                    cvt_e4m3=ptx.count("e4m3x2")))
    except Exception as e:  # diagnostics only
        rows.append(dict(error=str(e)[:200]))
    return rows


def tune_indexer(args, fn, device, key_bytes, results, ctx) -> None:
    """Sweep the indexer's launch knobs (module globals) on one problem; restore them after."""
    base = tuple(getattr(indexer_mod, k) for k in _TUNE_KNOBS)
    for cfg in _TUNE_CONFIGS:
        for k, v in zip(_TUNE_KNOBS, cfg):
            setattr(indexer_mod, k, v)
        try:
            fn()
            t = timed(fn, device, args, repeats=10)
            gbs = key_bytes / (t["us"] * 1e-6) / 1e9
        except Exception as e:  # a config that does not compile is reported, not fatal
            gbs = float("nan")
            print(f"  tune {cfg}: {type(e).__name__}: {str(e)[:160]}")
        results.setdefault("indexer_tune", []).append(dict(context=ctx, config=cfg, key_gb_s=gbs))
        print(f"  tune ctx={ctx} {dict(zip(_TUNE_KNOBS, cfg))}: {gbs:.0f} GB/s", flush=True)
    for k, v in zip(_TUNE_KNOBS, base):
        setattr(indexer_mod, k, v)


def bench_topk(args, device, kept, results: Dict) -> None:
    k = args.top_k
    for ctx, (logits, bt, lens) in sorted(kept.items()):
        B = logits.shape[0]
        t0 = time.perf_counter()
        plan = plan_topk(lens, k, max_len=ctx)
        plan_host_us = (time.perf_counter() - t0) * 1e6
        plan_t = timed(lambda: plan_topk(lens, k, max_len=ctx), device, args,
                       repeats=max(3, args.repeats // 4))
        pos = topk_per_row(logits, lens, k, plan=plan)
        check_topk(pos, logits, lens, k)
        ours = timed(lambda: topk_per_row(logits, lens, k, plan=plan), device, args)
        ref = timed(lambda: torch.topk(logits, min(k, ctx), dim=1, sorted=False), device, args)
        kw = dict(block_table=bt, page_size=args.page, plan=plan)
        fused = topk_transform(logits, lens, k, TopkTransformMethod.PAGED, fuse=True, **kw)
        unfused = topk_transform(logits, lens, k, TopkTransformMethod.PAGED, fuse=False, **kw)
        if not torch.equal(fused, unfused) or not torch.equal(
                fused, paged_transform_ref(pos, bt, args.page)):
            raise AssertionError("fused and unfused top-k + transform differ")
        f_t = timed(lambda: topk_transform(logits, lens, k, TopkTransformMethod.PAGED,
                                           fuse=True, **kw), device, args)
        u_t = timed(lambda: topk_transform(logits, lens, k, TopkTransformMethod.PAGED,
                                           fuse=False, **kw), device, args)
        results["topk"].append(dict(batch=B, context=ctx, top_k=k, ours=ours, torch_topk=ref,
                                    speedup=ref["us"] / ours["us"], plan=plan_t,
                                    plan_host_us=plan_host_us, chunk_size=plan.chunk_size,
                                    chunks=plan.max_chunks))
        results["fused"].append(dict(batch=B, context=ctx, top_k=k, fused=f_t, unfused=u_t,
                                     saving_us=u_t["us"] - f_t["us"]))
        print(f"top-k ctx={ctx}: ours {ours['us']:.1f} us, torch.topk {ref['us']:.1f} us; "
              f"fused {f_t['us']:.1f} us, unfused {u_t['us']:.1f} us", flush=True)
        if args.tune in ("all", "topk") and device.type == "cuda":
            print(f"  kernels (ours): {kernel_breakdown(lambda: topk_per_row(logits, lens, k, plan=plan), device)}")
            print(f"  kernels (torch.topk): "
                  f"{kernel_breakdown(lambda: torch.topk(logits, k, dim=1, sorted=False), device)}")
            for cs in ():
                p2 = plan_topk(lens, k, max_len=ctx, chunk_size=cs)
                check_topk(topk_per_row(logits, lens, k, plan=p2), logits, lens, k)
                t = timed(lambda: topk_per_row(logits, lens, k, plan=p2), device, args, repeats=10)
                results.setdefault("topk_tune", []).append(dict(context=ctx, chunk_size=cs, **t))
                print(f"  tune top-k ctx={ctx} chunk={cs}: {t['us']:.1f} us", flush=True)
            base = tuple(getattr(topk_mod, kn) for kn in _TOPK_KNOBS)
            for cfg in _TOPK_CONFIGS:
                for kn, v in zip(_TOPK_KNOBS, cfg):
                    setattr(topk_mod, kn, v)
                try:
                    fn = lambda: topk_per_row(logits, lens, k, plan=plan)  # noqa: E731
                    check_topk(fn(), logits, lens, k)
                    t = timed(fn, device, args, repeats=10)
                    bd = kernel_breakdown(fn, device, calls=3)
                except Exception as e:
                    t, bd = dict(us=float("nan")), {"error": f"{type(e).__name__}: {str(e)[:160]}"}
                results.setdefault("topk_tune", []).append(dict(context=ctx, config=cfg,
                                                                breakdown=bd, **t))
                print(f"  tune top-k ctx={ctx} {dict(zip(_TOPK_KNOBS, cfg))}: {t['us']:.1f} us "
                      f"{ {n[:20]: round(v, 1) for n, v in bd.items()} }", flush=True)
            for kn, v in zip(_TOPK_KNOBS, base):
                setattr(topk_mod, kn, v)
            print(f"  compiled select: {describe_compiled(topk_mod._topk_select_kernel)}")
            print(f"  compiled scan: {describe_compiled(topk_mod._topk_scan_kernel)}")


def print_table(results: Dict) -> None:
    """us = CUDA-graph replay (kernels only; the per-call time, launch overhead included, in
    brackets). On the CPU both are interpreter wall-clock."""
    print("\n== indexer (fp8 keys, paged): GB/s of index keys read ==")
    print(f"copy ceiling: {results['copy_ceiling_gb_s']:.0f} GB/s (read + write)")
    print(f"{'B':>4} {'ctx':>7} {'us':>8} {'(call)':>8} {'GB/s':>6} {'of copy':>8}")
    for r in results["indexer"]:
        frac = f"{100 * r['frac_of_copy']:.0f}%" if r["frac_of_copy"] else "-"
        print(f"{r['batch']:>4} {r['context']:>7} {r['us']:>8.1f} {r['call_us']:>8.1f} "
              f"{r['key_gb_s']:>6.0f} {frac:>8}")
    print("\n== top-k per row (ours, plan reused) vs torch.topk; fused vs unfused + PAGED ==")
    print(f"{'B':>4} {'ctx':>7} {'k':>5} {'ours':>7} {'torch':>7} {'x':>5} {'plan':>7} "
          f"{'fused':>7} {'unfused':>8}   (us; per-call us in the JSON)")
    for r, f in zip(results["topk"], results["fused"]):
        print(f"{r['batch']:>4} {r['context']:>7} {r['top_k']:>5} {r['ours']['us']:>7.1f} "
              f"{r['torch_topk']['us']:>7.1f} {r['speedup']:>5.2f} {r['plan']['us']:>7.1f} "
              f"{f['fused']['us']:>7.1f} {f['unfused']['us']:>8.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny CPU smoke run")
    ap.add_argument("--tune", nargs="?", const="all", default="",
                    choices=["all", "indexer", "topk"],
                    help="also sweep launch configs on the GPU (all / indexer / topk)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--topk-contexts", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--top-k", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.quick:
        args.batch, args.contexts, args.topk_contexts = 2, [96, 700], [700]
        args.top_k, args.heads, args.dim, args.page = 64, 16, 32, 16
        args.repeats, args.warmup = 2, 1
    t_start = time.perf_counter()
    results: Dict = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda"
                         else "cpu (Triton interpreter; times are not performance figures)",
                         torch=torch.__version__, triton=__import__("triton").__version__,
                         indexer=[], topk=[], fused=[],
                         indexer_config=dict(block_n=indexer_mod.BLOCK_N,
                                             warps=indexer_mod.NUM_WARPS,
                                             stages=indexer_mod.NUM_STAGES,
                                             max_tokens_per_program=indexer_mod.MAX_TOKENS_PER_PROGRAM,
                                             tile_in_page=indexer_mod.TILE_IN_PAGE_FASTPATH),
                         topk_cap=topk_mod.candidate_capacity(args.top_k))
    ceiling_bytes = (1 << 30) if device.type == "cuda" else (1 << 20)
    results["copy_ceiling_gb_s"] = measure_copy_ceiling(device, ceiling_bytes, args.repeats)
    print(f"copy ceiling: {results['copy_ceiling_gb_s']:.0f} GB/s", flush=True)
    kept = bench_indexer(args, device, results["copy_ceiling_gb_s"], results)
    bench_topk(args, device, kept, results)
    results["wall_s"] = time.perf_counter() - t_start
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "indexer_bench.json"), "w") as f:
            json.dump(results, f, indent=1)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
