"""Per-stage times of the sample-path top-k (threshold, + scan, whole) at B=64, 32K / 128K, for
several launches; every launch checked against torch.topk first. CUDA-graph replays, cold L2
(harness.timing.time_fn), median of 50.

python3 results/h200-2026-12-03b/scripts/topk_stages.py
"""
import torch
from backends.kernels import topk as T
from harness.timing import time_fn, capture_graph

LAUNCHES = {
    "default": T.TopkLaunch(),
    "uniform_t2 (old default)": T.TopkLaunch(target_factor=2.0, window_lo=0.75, window_hi=1.5,
                                             small_select=False, long_row=None),
    "short_everywhere": T.TopkLaunch(long_row=None),
    "threshold_w1": T.TopkLaunch(threshold_warps=1),
    "threshold_w2": T.TopkLaunch(threshold_warps=2),
}


def stages(logits, lengths, k, plan, out, L, upto):
    B, N = logits.shape
    cap, sample, thr = T._launch_params(L, k)
    T._topk_threshold_kernel[(B,)](logits, logits.stride(0), N, lengths, plan.thresholds,
                                   CAP=cap, SAMPLE=sample, RADIX_BITS=L.radix_bits, **thr,
                                   num_warps=L.threshold_warps)
    if upto >= 2:
        T._topk_scan_kernel[(B, plan.max_chunks)](
            logits, logits.stride(0), N, lengths, plan.row_chunks, plan.thresholds,
            plan.candidates, plan.counts, plan.chunk_size, plan.max_chunks,
            CAP=plan.cap, BLOCK=T._sample_scan_block(L, plan), FUSE_THRESHOLD=False,
            SAMPLE=sample, RADIX_BITS=L.radix_bits, **thr,
            num_warps=L.scan_warps, num_stages=L.scan_stages)


if __name__ == "__main__":
    rows = []
    for ctx in (32768, 131072):
        B, k = 64, 2048
        torch.manual_seed(ctx)
        logits = torch.randn(B, ctx, device="cuda")
        lengths = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        plan = T.plan_topk(lengths, k, max_len=ctx)
        out = torch.empty(B, k, dtype=torch.int32, device="cuda")
        ref = torch.topk(logits, k, dim=1).indices.sort(dim=1).values.to(torch.int32)
        g, _ = capture_graph(lambda: torch.topk(logits, k, dim=1))
        t_ref = time_fn(g.replay, "cuda", warmup=5, repeats=50).median_us
        rows.append((ctx, "torch.topk", "", t_ref))
        for name, L in LAUNCHES.items():
            T.launch_topk(logits, lengths, k, plan, out, launch=L)
            assert torch.equal(out, ref), name
            counts = plan.counts.sum(1)
            print(ctx, name, "chunks", plan.max_chunks, "chunk", plan.chunk_size, "block",
                  T._sample_scan_block(L, plan), "candidates min/max", int(counts.min()),
                  int(counts.max()), flush=True)
            for stage, fn in [("threshold", lambda: stages(logits, lengths, k, plan, out, L, 1)),
                              ("threshold+scan", lambda: stages(logits, lengths, k, plan, out, L, 2)),
                              ("whole", lambda: T.launch_topk(logits, lengths, k, plan, out, launch=L))]:
                g, _ = capture_graph(fn)
                t = time_fn(g.replay, "cuda", warmup=5, repeats=50)
                rows.append((ctx, name, stage, t.median_us))
    print("\nctx      launch               stage            us   torch.topk/whole")
    ref_us = {r[0]: r[3] for r in rows if r[1] == "torch.topk"}
    for ctx, name, stage, us in rows:
        sp = f"{ref_us[ctx] / us:5.2f}" if stage == "whole" else ""
        print(f"{ctx:7d}  {name:20s} {stage:15s} {us:7.1f}  {sp}")
