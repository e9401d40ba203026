"""Per-kernel times of the sample-path top-k (threshold, scan, select) at B=64, 32K / 128K."""
import torch
from backends.kernels import topk as T
from harness.timing import time_fn, capture_graph

def stages(logits, lengths, k, plan, out, L, upto):
    B, N = logits.shape
    target = min(2 * k, (k + plan.cap) // 2)
    T._topk_threshold_kernel[(B,)](logits, logits.stride(0), N, lengths, plan.thresholds, target,
        CAP=plan.cap, SAMPLE=plan.sample, RADIX_BITS=L.radix_bits, WINDOW=L.threshold_window, num_warps=4)
    if upto >= 2:
        T._topk_scan_kernel[(B, plan.max_chunks)](logits, logits.stride(0), N, lengths, plan.row_chunks,
            plan.thresholds, plan.candidates, plan.counts, plan.chunk_size, plan.max_chunks, target,
            CAP=plan.cap, BLOCK=T._sample_scan_block(L, plan), FUSE_THRESHOLD=False,
            SAMPLE=plan.sample, RADIX_BITS=L.radix_bits, WINDOW=L.threshold_window,
            num_warps=L.scan_warps, num_stages=L.scan_stages)
    if upto >= 3:
        T.launch_topk(logits, lengths, k, plan, out, launch=L)


def problem(ctx, B=64, k=2048, chunk_size=None):
    """Fresh random logits [B, ctx], full lengths, a plan, an output (seeded by ctx)."""
    torch.manual_seed(ctx)
    logits = torch.randn(B, ctx, device="cuda")
    lengths = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    plan = T.plan_topk(lengths, k, max_len=ctx, chunk_size=chunk_size)
    return logits, lengths, plan, torch.empty(B, k, dtype=torch.int32, device="cuda")


if __name__ == "__main__":
    rows = []
    for ctx in (32768, 131072):
        B, k = 64, 2048
        logits, lengths, plan, out = problem(ctx)
        L = T.TopkLaunch()
        T.launch_topk(logits, lengths, k, plan, out, launch=L)
        ref = torch.topk(logits, k, dim=1).indices.sort(dim=1).values.to(torch.int32)
        assert torch.equal(out, ref)
        counts = plan.counts.sum(1)
        print(ctx, "chunks", plan.max_chunks, "chunk", plan.chunk_size, "cap", plan.cap,
              "candidates min/mean/max", int(counts.min()), float(counts.float().mean()), int(counts.max()))
        for name, fn in [("threshold", lambda: stages(logits, lengths, k, plan, out, L, 1)),
                         ("threshold+scan", lambda: stages(logits, lengths, k, plan, out, L, 2)),
                         ("full (launch_topk)", lambda: T.launch_topk(logits, lengths, k, plan, out, launch=L)),
                         ("torch.topk", lambda: torch.topk(logits, k, dim=1))]:
            g, _ = capture_graph(fn)
            t = time_fn(g.replay, "cuda", warmup=5, repeats=50)
            rows.append((ctx, name, t.median_us))
            print(ctx, name, f"{t.median_us:.1f}", flush=True)
    print("\nctx  stage  us")
    for r in rows:
        print(f"{r[0]:7d} {r[1]:22s} {r[2]:7.1f}")
