"""``indexer``: the lightning indexer and the top-k kernels that share its logits.

Rows (default sizes: batch 64, 64 index heads x 128 dims, fp8 index keys (``kv_dtype`` fp8,
132 B per token), page 64; ``--quick``: batch 2, 16 x 32, page 16, contexts 96 / 700):

* ``indexer_logits_paged`` at contexts 8K / 32K / 128K: ``bytes_hbm_read`` = the index keys
  read, so ``hbm_gbps`` against ``ceiling_hbm_gbps`` (a 1 GiB device copy, ``harness.ceilings``).
  Checked against ``harness.indexer_ref.indexer_logits_paged_ref`` on batch rows 0, B/2, B-1:
  the -inf pattern identical and ``max_rel_err`` = max |err| / max |ref| <= 1e-4.
* at the top-k contexts (32K / 128K), on those logits, top-2048: ``plan_topk`` (built once per
  step from the lengths), ``topk_per_row`` with that plan (checked: per row the scores at the
  returned positions equal ``torch.topk``'s as sorted sets, no duplicates; its peer is
  ``torch.topk``, the reference), and ``topk_transform`` + PAGED fused into the top-k and not
  (both checked equal to ``paged_transform_ref`` of the checked positions; fused's peer is
  unfused).

Every row is timed as the Python call and, on the GPU, as a CUDA-graph replay (``cuda_graph``).
``--tune`` adds launch variants (``variant``, ``launch_config``): ``IndexerLaunch`` ones at the
contexts >= 32K (with ``--quick``: the largest) plus bf16 index keys at the first of them, and
``TopkLaunch`` ones at the top-k contexts.

``--variants`` (issue #13) is the comparison run instead: every ``INDEXER_VARIANTS`` entry and
every ``FP8_QUERY_VARIANTS`` entry (the same kernel with ``query_dtype="fp8"``: upstream's fp8
query, checked against the fp8-query reference within ``FP8_QUERY_TOL``; ``launch_config``
records ``query_dtype``) at every context and every ``TOPK_VARIANTS`` entry beside
``torch.topk`` at the top-k contexts, each checked as above before it is timed, as CUDA-graph
replays only (the Python call on the CPU), without the plan / transform / bf16 rows; it prints
a compact summary (context, what, variant, us, GB/s or speed-up over torch.topk, % of the copy
ceiling) before the full table.
Counting convention: an indexer row's GB/s counts only the index-key bytes read (132 B per
token); the copy ceiling counts read + write of a 1 GiB device copy, so "% of the ceiling"
compares a read-only stream with a read+write one (the logits written, 4 B per token, are not
counted).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Dict

import torch

from backends.kernels.index_cache import IndexKeyCache
from backends.kernels.indexer import IndexerLaunch, indexer_logits_paged
from backends.kernels.topk import TopkLaunch, plan_topk, topk_per_row
from backends.kernels.topk_transform import TopkTransformMethod, topk_transform
from harness.bench.measure import BenchRun, Check, exact
from harness.bench.registry import register
from harness.indexer_ref import FP8_QUERY_TOL, indexer_logits_paged_ref, paged_transform_ref

#: indexer launch variants timed with --tune and --variants (issue #13). Earlier runs (B=64, fp8,
#: page 64; % of the copy ceiling at 8K / 32K / 128K): num_stages 3 41 / 49 / 54, 5 45 / 56 / 64
#: (now the default), prefetch with 5 stages 46 / 55 / 62; programs_per_sm 2 / 8 and
#: 4096-token programs no better; 128-token tiles with per-token page reads 33-45; maxnreg=96
#: (3 stages) 57 at 128K. Compiled for sm_90 by Triton 3.6 (not timed): (num_stages - 1) // 2
#: key buffers per program (5: 2, 7: 3, 9: 4); the TMA loads fit maxnreg=96 without spilling
#: (5 programs per SM by registers; 41 KB shared each at 7 stages), the pointer loads spill.
INDEXER_VARIANTS: Dict[str, IndexerLaunch] = {
    "default": IndexerLaunch(),          # TMA where it works (tma=None), 5 stages
    "stages3": IndexerLaunch(num_stages=3, tma=False),
    "prefetch": IndexerLaunch(prefetch=True, tma=False),
    "stages7": IndexerLaunch(num_stages=7, tma=False),
    "stages9": IndexerLaunch(num_stages=9, tma=False),
    "n128_w8_pages2_stages7": IndexerLaunch(block_n=128, num_warps=8, num_stages=7,
                                             tma=False),
    "pointer_loads": IndexerLaunch(tma=False),
    "tma": IndexerLaunch(tma=True),
    "tma_stages7": IndexerLaunch(tma=True, num_stages=7),
    "tma_stages9": IndexerLaunch(tma=True, num_stages=9),
    "tma_prefetch_stages7": IndexerLaunch(tma=True, prefetch=True, num_stages=7),
    "tma_stages7_reg96_pps5": IndexerLaunch(tma=True, num_stages=7, maxnreg=96,
                                            programs_per_sm=5),
    "tma_prefetch_stages7_reg96_pps5": IndexerLaunch(tma=True, prefetch=True, num_stages=7,
                                                     maxnreg=96, programs_per_sm=5),
    # the program shape with TMA (2026-12-02, 32K: 2048-token programs 68 %, 4096 70 %, now the
    # default; 128-token tiles on 8 warps 16 %, dropped: they need pages of >= 32 tokens)
    "tma_tpp1024": IndexerLaunch(tma=True, tokens_per_program=1024),
    "tma_tpp2048": IndexerLaunch(tma=True, tokens_per_program=2048),
    "tma_stages4": IndexerLaunch(tma=True, num_stages=4),
    "tma_stages6": IndexerLaunch(tma=True, num_stages=6),
    "tma_prefetch": IndexerLaunch(tma=True, prefetch=True),
    "tma_tpp4096": IndexerLaunch(tma=True, tokens_per_program=4096),
    "tma_tpp8192": IndexerLaunch(tma=True, tokens_per_program=8192),
}
#: issue #13: the fp8 query (``indexer_logits_paged(query_dtype="fp8")``: no fp8 -> float16
#: conversion of the keys; an fp8 x fp8 MMA on the keys as loaded), timed by --variants only.
#: Compiled for sm_90a by Triton 3.6 (results/h200-2026-12-03c/scripts/compile_indexer.py; B=64,
#: page 64, TMA): the main loop per warp and tile 272 SASS instructions with the bf16 query (32
#: LDS.U16 + 32 F2FP.F16.E4M3 feeding 8 HGMMA.64x64x16 from registers) and 212 with the fp8
#: query (4 QGMMA.64x64x32.E4M3 with both operands in shared memory); 104 -> 64 registers, so
#: 8 programs fit an SM by registers (6 by shared memory at 4 / 5 stages: 24.8 / 33 KB, 8 at 4).
#: The stages4_pps8 launches put 8 programs on each SM (2048-token programs at 32K: all 1024 at
#: once), twice the key tiles in flight of the default's 4.
FP8_QUERY_VARIANTS: Dict[str, IndexerLaunch] = {
    "q_fp8": IndexerLaunch(),                   # prefetch on: the fp8 query's default
    "q_fp8_no_prefetch": IndexerLaunch(prefetch=False),
    "q_fp8_stages7": IndexerLaunch(num_stages=7),
    "q_fp8_tpp2048": IndexerLaunch(tokens_per_program=2048),
    "q_fp8_stages4_tpp2048": IndexerLaunch(num_stages=4, tokens_per_program=2048),
    "q_fp8_stages4_pps8": IndexerLaunch(num_stages=4, programs_per_sm=8),
    "q_fp8_pointer_loads": IndexerLaunch(tma=False),
}
#: top-k launch variants timed with --tune (the default: the windowed sample threshold)
TOPK_VARIANTS: Dict[str, TopkLaunch] = {
    "default": TopkLaunch(),
    "exact_threshold": TopkLaunch(threshold_window=False),
    "select_w16": TopkLaunch(select_warps=16),
    "scan_b4096_w8_s3": TopkLaunch(scan_block_max=4096, scan_warps=8, scan_stages=3),
    "scan_b1024": TopkLaunch(scan_block_max=1024),
    "scan_b1024_w2": TopkLaunch(scan_block_max=1024, scan_warps=2),
    # the k-th-key search as a radix select on digit histograms (2 or 4 bits a step)
    "bits2": TopkLaunch(radix_bits=2),
    "bits4": TopkLaunch(radix_bits=4),
    "bits4_select_w16": TopkLaunch(radix_bits=4, select_warps=16),
    "bits4_exact_threshold": TopkLaunch(radix_bits=4, threshold_window=False),
    # issue #13: the threshold inside the scan kernel (exact / windowed sample search)
    "fused": TopkLaunch(fuse_threshold=True, threshold_window=False),
    "fused_window": TopkLaunch(fuse_threshold=True),
    "fused_window_select_w16": TopkLaunch(fuse_threshold=True, select_warps=16),
    # issue #13: the multi-program window-histogram select (every chunk of a row in its own
    # program; module docstring of backends.kernels.topk)
    "radix": TopkLaunch(algorithm="radix"),
    "radix_b1024": TopkLaunch(algorithm="radix", scan_block_max=1024),
    "radix_b4096_w8": TopkLaunch(algorithm="radix", scan_block_max=4096, scan_warps=8),
    "radix_s2": TopkLaunch(algorithm="radix", scan_stages=2),
    # half the select's candidate capacity (CAP 4096 at k = 2048; its time scales with CAP), the
    # threshold aimed at 1.5k = 3072 in every row; the shared plan keeps its 8192-candidate
    # lists. A row outside [k, CAP] takes the slow exact fallback: ~0.05 % of rows at 32K but
    # ~2-4 % at 128K by a numpy replica of the search (a 4096 sample: ~0.1 % at 128K)
    "cap2_target1.5": TopkLaunch(cap_factor=2, target_factor=1.5, window_lo=0.875,
                                 window_hi=1.125, long_row=None),
    "cap2_target1.5_exact": TopkLaunch(cap_factor=2, target_factor=1.5, threshold_window=False,
                                       long_row=None),
    "cap2_target1.5_exact_s4096": TopkLaunch(cap_factor=2, target_factor=1.5,
                                             threshold_window=False, sample_max=4096,
                                             long_row=None),
    # the default before 2026-12-03 (second session): target 2k with a 3/4 .. 3/2 window in
    # every row, no half-block select
    "uniform_t2": TopkLaunch(target_factor=2.0, window_lo=0.75, window_hi=1.5,
                             small_select=False, long_row=None),
    # the half block and the short rows' 1.5k target at every length, with the 1 .. 9/8 window
    # (the default's short rows) or 7/8 .. 9/8 (0.33 % of 128K rows below k, simulated)
    "short_everywhere": TopkLaunch(long_row=None),
    "short_everywhere_w7/8": TopkLaunch(window_lo=0.875, long_row=None),
    # where the long rows begin
    "long_row_32k": TopkLaunch(long_row=32768),
    # the threshold kernel's warps (its sample search is a chain of block-wide counts)
    "threshold_w1": TopkLaunch(threshold_warps=1),
    "threshold_w2": TopkLaunch(threshold_warps=2),
    "threshold_w8": TopkLaunch(threshold_warps=8),
}
#: --tune sweeps the indexer variants at contexts from this length on
TUNE_MIN_CONTEXT = 32768
INDEXER_TOL = 1e-4


def _launch(name: str, launch, query_dtype: str = "bf16") -> Dict[str, str]:
    """The row's ``variant`` and ``launch_config`` (``query_dtype`` added when not bf16)."""
    config = dataclasses.asdict(launch)
    if query_dtype != "bf16":
        config["query_dtype"] = query_dtype
    return {"variant": name, "launch_config": json.dumps(config)}


def build_problem(B: int, ctx: int, H: int, D: int, page: int, device: torch.device,
                  seed: int = 0, fmt: str = "fp8"):
    """Random index-key cache of ``fmt`` (shuffled pages, every slot written), bf16 queries
    ``[B, H, D]``, float32 weights ``[B, H]``, int32 lengths ``[B]`` = ``ctx``."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_req = (ctx + page - 1) // page
    num_pages = B * pages_per_req
    cache = IndexKeyCache.allocate(num_pages, page, D, fmt, device)
    block_table = torch.randperm(num_pages, generator=g, device=device).to(torch.int32).view(
        B, pages_per_req)
    keys = torch.randn(num_pages * page, D, generator=g, device=device)
    cache.write_slots(torch.arange(num_pages * page, device=device), keys)
    del keys
    q = torch.randn(B, H, D, generator=g, device=device).to(torch.bfloat16)
    w = torch.randn(B, H, generator=g, device=device) * H ** -0.5
    seq_lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    return cache, block_table, q, w, seq_lens


def check_indexer(out, q, w, cache, bt, lens, query_dtype: str = "bf16") -> Check:
    """Rows 0, B/2, B-1 of ``out`` against the reference of the same ``query_dtype``:
    max |error| / max |ref| within INDEXER_TOL (bf16) or FP8_QUERY_TOL (fp8)."""
    tol = FP8_QUERY_TOL if query_dtype == "fp8" else INDEXER_TOL
    B = q.shape[0]
    idx = torch.tensor(sorted({0, B // 2, B - 1}), device=q.device)
    ref = indexer_logits_paged_ref(q[idx], w[idx], cache.data, bt[idx], lens[idx],
                                   max_len=out.shape[1], query_dtype=query_dtype)
    got = out[idx]
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(got)):
        return Check(float("nan"), tol, mismatch="-inf pattern differs from the reference")
    err = (got[fin] - ref[fin]).abs().max().item() / max(ref[fin].abs().max().item(), 1e-30)
    return Check(err, tol)


def topk_error(pos: torch.Tensor, logits: torch.Tensor, lens: torch.Tensor, k: int) -> str:
    """'' when every row's positions are its top-k (scores equal torch.topk's as sorted sets, no
    duplicates, -1 after min(k, length)); else the first failing row, in words."""
    for b in range(logits.shape[0]):
        n = int(lens[b])
        p = pos[b]
        valid = p[p >= 0].long()
        kk = min(k, n)
        if valid.numel() != kk or (p[kk:] != -1).any():
            return f"top-k row {b}: {valid.numel()} positions, expected {kk}"
        if valid.unique().numel() != kk or (valid >= n).any():
            return f"top-k row {b}: duplicate or out-of-range positions"
        got = logits[b, valid].sort().values
        ref = torch.topk(logits[b, :n], kk).values.sort().values
        if not torch.equal(got, ref):
            return f"top-k row {b}: score set differs from torch.topk"
    return ""


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tune", nargs="?", const="all", default="", choices=["all", "indexer", "topk"],
                   help="also time launch variants (all / indexer / topk)")
    p.add_argument("--variants", action="store_true",
                   help="instead: every indexer variant at every context and every top-k variant "
                        "beside torch.topk, graph replays only, a compact summary")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    p.add_argument("--topk-contexts", type=int, nargs="+", default=[32768, 131072],
                   help="contexts (among --contexts) whose logits the top-k rows take")
    p.add_argument("--top-k", type=int, default=2048)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--page", type=int, default=64)


def _sizes(run: BenchRun) -> argparse.Namespace:
    a = argparse.Namespace(**vars(run.args))
    if run.quick:
        a.batch, a.contexts, a.topk_contexts = 2, [96, 700], [700]
        a.top_k, a.heads, a.dim, a.page = 64, 16, 32, 16
    missing = sorted(set(a.topk_contexts) - set(a.contexts))
    if missing:
        raise ValueError(f"--topk-contexts {missing} are not among --contexts {a.contexts}")
    return a


@register("indexer", "lightning indexer (fp8 paged keys, GB/s vs the HBM ceiling) and top-k: "
          "plan, ours vs torch.topk, fused vs unfused PAGED transform", options=_options)
def indexer(run: BenchRun) -> None:
    a = _sizes(run)
    if a.variants:
        if a.tune:
            raise ValueError("--variants and --tune are separate runs: give one of them")
        variants_run(run, a)
        return
    B, H, D, P = a.batch, a.heads, a.dim, a.page
    tune_ctx = [c for c in a.contexts if c >= TUNE_MIN_CONTEXT] or (a.contexts[-1:] if run.quick else [])
    for ctx in a.contexts:
        fmts = ["fp8"] + (["bf16"] if a.tune in ("all", "indexer") and tune_ctx[:1] == [ctx] else [])
        for fmt in fmts:
            cache, bt, q, w, lens = build_problem(B, ctx, H, D, P, run.device, fmt=fmt)
            cols = {"kernel": "indexer_logits_paged", "kv_dtype": fmt, "batch_size": B,
                    "context_len": ctx, "num_heads": H, "head_dim": D, "page_size": P,
                    "bytes_hbm_read": B * ctx * cache.bytes_per_token}
            variants = (INDEXER_VARIANTS if fmt == "fp8" and a.tune in ("all", "indexer")
                        and ctx in tune_ctx else {"default": IndexerLaunch()})
            for name, launch in variants.items():
                for graph in run.graph_modes():
                    run.measure(lambda: indexer_logits_paged(q, w, cache.data, bt, lens,
                                                             max_len=ctx, launch=launch),
                                check=lambda out: check_indexer(out, q, w, cache, bt, lens),
                                graph=graph, **cols, **_launch(name, launch))
            if ctx in a.topk_contexts and fmt == "fp8":
                logits = indexer_logits_paged(q, w, cache.data, bt, lens, max_len=ctx)
                del cache, q, w
                topk_rows(run, a, logits, bt, lens, ctx)
            if run.cuda:
                torch.cuda.empty_cache()


def topk_rows(run: BenchRun, a: argparse.Namespace, logits: torch.Tensor, bt: torch.Tensor,
              lens: torch.Tensor, ctx: int) -> None:
    """The top-k rows at one context, on the indexer's logits ``[B, ctx]``."""
    k = a.top_k
    cols = {"batch_size": logits.shape[0], "context_len": ctx, "top_k": k}
    plan = plan_topk(lens, k, max_len=ctx)
    pos = topk_per_row(logits, lens, k, plan=plan)
    pos_error = topk_error(pos, logits, lens, k)
    paged = paged_transform_ref(pos, bt, a.page)
    variants = TOPK_VARIANTS if a.tune in ("all", "topk") else {"default": TopkLaunch()}
    kw = dict(block_table=bt, page_size=a.page, plan=plan)
    for graph in run.graph_modes():
        run.measure(lambda: plan_topk(lens, k, max_len=ctx), check=None, graph=graph,
                    kernel="plan_topk", **cols)
        reference = run.measure(lambda: torch.topk(logits, min(k, ctx), dim=1, sorted=False),
                                check=None, graph=graph, kernel="torch.topk", **cols)
        for name, launch in variants.items():
            ours = run.measure(lambda: topk_per_row(logits, lens, k, plan=plan, launch=launch),
                               check=lambda out: exact(0.0, topk_error(out, logits, lens, k)),
                               graph=graph, kernel="topk_per_row", **cols, **_launch(name, launch))
            run.compare(ours, reference)
        transform = {}
        for fuse in (True, False):
            transform[fuse] = run.measure(
                lambda: topk_transform(logits, lens, k, TopkTransformMethod.PAGED, fuse=fuse, **kw),
                check=lambda out: exact((out != paged).float().mean().item(), pos_error),
                graph=graph, kernel="topk_transform", variant="fused" if fuse else "unfused",
                page_size=a.page, **cols)
        run.compare(transform[True], transform[False])


def variants_run(run: BenchRun, a: argparse.Namespace) -> None:
    """``--variants``: every indexer and top-k variant, checked, then timed (module doc)."""
    B, H, D, P, k = a.batch, a.heads, a.dim, a.page, a.top_k
    graph = run.cuda
    first = len(run.rows)
    for ctx in a.contexts:
        cache, bt, q, w, lens = build_problem(B, ctx, H, D, P, run.device)
        cols = {"kernel": "indexer_logits_paged", "kv_dtype": "fp8", "batch_size": B,
                "context_len": ctx, "num_heads": H, "head_dim": D, "page_size": P,
                "bytes_hbm_read": B * ctx * cache.bytes_per_token}
        variants = [(n, v, "bf16") for n, v in INDEXER_VARIANTS.items()]
        variants += [(n, v, "fp8") for n, v in FP8_QUERY_VARIANTS.items()]
        for name, launch, qd in variants:
            run.measure(lambda: indexer_logits_paged(q, w, cache.data, bt, lens, max_len=ctx,
                                                     query_dtype=qd, launch=launch),
                        check=lambda out: check_indexer(out, q, w, cache, bt, lens, qd),
                        graph=graph, **cols, **_launch(name, launch, qd))
        if ctx in a.topk_contexts:
            logits = indexer_logits_paged(q, w, cache.data, bt, lens, max_len=ctx)
            del cache, q, w
            tcols = {"batch_size": B, "context_len": ctx, "top_k": k}
            plan = plan_topk(lens, k, max_len=ctx)
            reference = run.measure(lambda: torch.topk(logits, min(k, ctx), dim=1, sorted=False),
                                    check=None, graph=graph, kernel="torch.topk", **tcols)
            for name, launch in TOPK_VARIANTS.items():
                ours = run.measure(lambda: topk_per_row(logits, lens, k, plan=plan, launch=launch),
                                   check=lambda out: exact(0.0, topk_error(out, logits, lens, k)),
                                   graph=graph, kernel="topk_per_row", **tcols,
                                   **_launch(name, launch))
                run.compare(ours, reference)
            del logits
        else:
            del cache, q, w
        if run.cuda:
            torch.cuda.empty_cache()
    print(summary(run.rows[first:]), flush=True)


def summary(rows) -> str:
    """The compact table of a ``--variants`` run: per context, the indexer variants (GB/s of
    index keys read, % of the read+write copy ceiling) and the top-k variants (speed-up over
    torch.topk), fastest first within each group."""
    def key(r):
        return (r["context_len"], r["kernel"] != "indexer_logits_paged",
                r.get("latency_us_median") or float("inf"))
    lines = ["indexer GB/s = index-key bytes read / time; ceiling = 1 GiB device copy, read + "
             "write counted",
             f"{'ctx':>7} {'what':<8} {'variant':<26} {'us':>8} {'GB/s|x':>8} {'%ceil':>6} status"]
    for r in sorted(rows, key=key):
        lat = r.get("latency_us_median")
        us = f"{lat:8.1f}" if lat is not None else f"{'':8}"
        if r["kernel"] == "indexer_logits_paged":
            gbps, ceil = r.get("hbm_gbps"), r.get("ceiling_hbm_gbps")
            rate = f"{gbps:8.0f}" if gbps is not None else f"{'':8}"
            pct = (f"{100 * gbps / ceil:5.0f}%" if gbps is not None and ceil == ceil
                   else f"{'':6}")
            what = "indexer"
        else:
            ratio = r.get("ratio_to_peer")
            rate = f"{1 / ratio:7.2f}x" if ratio and ratio == ratio else f"{'':8}"
            pct, what = f"{'':6}", "topk" if r["kernel"] == "topk_per_row" else "torch"
        lines.append(f"{r['context_len']:>7} {what:<8} {str(r.get('variant') or ''):<26} {us} "
                     f"{rate} {pct} {r['status']}")
    return "\n".join(lines)


if __name__ == "__main__":   # the older spelling: python -m harness.bench.indexer
    from harness.bench.__main__ import main
    raise SystemExit(main(["run", "indexer", *__import__("sys").argv[1:]]))
