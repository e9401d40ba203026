"""Launches for ncu: resolve all-hits B=64 (3rd launch), top-k at 32K (threshold, scan, select)."""
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resolve_exp as rx
from backends.kernels import topk as T
s = rx.state(64)
rx.real(s, 8); rx.real(s, 8); rx.real(s, 8)
torch.cuda.synchronize()
for ctx in (32768, 131072):
    logits = torch.randn(64, ctx, device="cuda")
    lengths = torch.full((64,), ctx, dtype=torch.int32, device="cuda")
    plan = T.plan_topk(lengths, 2048, max_len=ctx)
    out = torch.empty(64, 2048, dtype=torch.int32, device="cuda")
    T.launch_topk(logits, lengths, 2048, plan, out)
    T.launch_topk(logits, lengths, 2048, plan, out)
torch.cuda.synchronize()
print("done")
