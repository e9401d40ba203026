"""Scan / full top-k time vs chunk size and scan warps (B=64)."""
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
            CAP=plan.cap, BLOCK=min(L.scan_block_max, plan.chunk_size), FUSE_THRESHOLD=False,
            SAMPLE=plan.sample, RADIX_BITS=L.radix_bits, WINDOW=L.threshold_window,
            num_warps=L.scan_warps, num_stages=L.scan_stages)
    if upto >= 3:
        T.launch_topk(logits, lengths, k, plan, out, launch=L)

def tg(fn):
    fn(); torch.cuda.synchronize(); g, _ = capture_graph(fn)
    return time_fn(g.replay, "cuda", warmup=5, repeats=40).median_us
rows = []
for ctx in (32768, 131072):
    B, k = 64, 2048
    torch.manual_seed(ctx)
    logits = torch.randn(B, ctx, device="cuda")
    lengths = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    ref = torch.topk(logits, k, dim=1).indices.sort(dim=1).values.to(torch.int32)
    for chunk in (1024, 2048, 4096, 8192, 16384):
        plan = T.plan_topk(lengths, k, max_len=ctx, chunk_size=chunk)
        out = torch.empty(B, k, dtype=torch.int32, device="cuda")
        for w, blk in ((4, 2048), (8, 2048), (4, 1024), (8, 4096)):
            L = T.TopkLaunch(scan_warps=w, scan_block_max=blk)
            T.launch_topk(logits, lengths, k, plan, out, launch=L)
            ok = torch.equal(out, ref)
            t1 = tg(lambda: stages(logits, lengths, k, plan, out, L, 1))
            t2 = tg(lambda: stages(logits, lengths, k, plan, out, L, 2))
            t3 = tg(lambda: T.launch_topk(logits, lengths, k, plan, out, launch=L))
            rows.append((ctx, chunk, w, blk, t1, t2 - t1, t3 - t2, t3, ok))
            print(rows[-1], flush=True)
print("\nctx chunk warps block thr scan select full ok")
for r in rows:
    print("%6d %6d %2d %5d %6.1f %6.1f %6.1f %6.1f %s" % r)
