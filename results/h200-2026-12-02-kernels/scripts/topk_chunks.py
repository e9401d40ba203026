"""Scan / full top-k time vs chunk size and scan warps (B=64)."""
import os, sys, torch
from backends.kernels import topk as T
from harness.timing import time_fn, capture_graph
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from topk_breakdown import problem, stages

def tg(fn):
    fn(); torch.cuda.synchronize(); g, _ = capture_graph(fn)
    return time_fn(g.replay, "cuda", warmup=5, repeats=40).median_us
rows = []
for ctx in (32768, 131072):
    B, k = 64, 2048
    logits, lengths, _, _ = problem(ctx)
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
