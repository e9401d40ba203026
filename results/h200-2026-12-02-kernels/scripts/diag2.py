"""Floors and ablations: empty kernel, resolve phase 1 without stamps / warm L2, top-k select parts."""
import os, sys, torch, triton, triton.language as tl
from harness.timing import time_fn, capture_graph
from backends.kernels import topk as T

@triton.jit
def empty_kernel(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1)

def t_graph(fn, cold=True):
    fn(); torch.cuda.synchronize()
    g, _ = capture_graph(fn)
    return time_fn(g.replay, "cuda", warmup=5, repeats=50, cold_l2=cold).median_us

rows = []
x = torch.zeros(1024, dtype=torch.int32, device="cuda")
for B in (1, 64):
    rows.append(("empty kernel", B, t_graph(lambda: empty_kernel[(B,)](x))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resolve_exp
from topk_breakdown import problem
ns = vars(resolve_exp)
for B in (1, 64):
    s = ns["state"](B)
    ns["real"](s, 8); ns["real"](s, 8)
    for cold in (True, False):
        for name, fn in [("resolve real", lambda: ns["real"](s, 8)),
                         ("resolve stop1", lambda: ns["exp"](s, 8, 1, 0, 0)),
                         ("resolve stop2", lambda: ns["exp"](s, 8, 2, 0, 0))]:
            rows.append((name + (" coldL2" if cold else " warmL2"), B, t_graph(fn, cold)))

@triton.jit
def sel_exp(logits_ptr, stride_l, n_cols, len_ptr, chunks_ptr, cand_ptr, cnt_ptr, max_chunks,
            out_ptr, stride_o, top_k, CAP: tl.constexpr, MODE: tl.constexpr):
    row = tl.program_id(0)
    out_row = out_ptr + row.to(tl.int64) * stride_o
    base = logits_ptr + row.to(tl.int64) * stride_l
    idx = tl.arange(0, CAP)
    n_chunks = tl.load(chunks_ptr + row)
    total = 0
    src = tl.zeros([CAP], dtype=tl.int32) - 1
    for c in range(0, n_chunks):
        cnt_c = tl.load(cnt_ptr + row * max_chunks + c)
        in_c = (idx >= total) & (idx < total + cnt_c)
        src = tl.where(in_c, (row * max_chunks + c) * CAP + idx - total, src)
        total += cnt_c
    valid = idx < total
    pos = tl.load(cand_ptr + src.to(tl.int64), mask=valid, other=0)
    key = tl.where(valid, T._order_key(tl.load(base + pos, mask=valid, other=0.0)), 0)
    if MODE == 0:
        Tk = T._kth_largest_key(key, top_k, 1)
    else:
        Tk = tl.min(tl.where(valid, key, 0xFFFFFFFF), axis=0).to(tl.uint32)
    if MODE == 2:
        tl.store(out_row + idx, pos, mask=idx < top_k)
    else:
        gt = key > Tk
        eq = key == Tk
        need = top_k - tl.sum(gt.to(tl.int32), axis=0)
        sel = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
        slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(out_row + slot, pos, mask=sel & (slot < top_k))

for ctx in (32768, 131072):
    B, k = 64, 2048
    logits, lengths, plan, out = problem(ctx)
    T.launch_topk(logits, lengths, k, plan, out)
    ref = out.clone()
    for mode in (0, 1, 2):
        for w in (8, 16):
            fn = lambda: sel_exp[(B,)](logits, ctx, ctx, lengths, plan.row_chunks, plan.candidates, plan.counts,
                                      plan.max_chunks, out, k, k, CAP=plan.cap, MODE=mode, num_warps=w)
            t = t_graph(fn)
            if mode == 0:
                assert torch.equal(out, ref), "sel_exp mode 0 differs"
            rows.append((f"topk select mode{mode} w{w} ctx{ctx}", B, t))
    for S in (512, 1024, 2048):
        for w in (1, 2, 4, 8):
            target = 4096
            fn = lambda: T._topk_threshold_kernel[(B,)](logits, ctx, ctx, lengths, plan.thresholds, target,
                        CAP=plan.cap, SAMPLE=S, RADIX_BITS=1, WINDOW=True, num_warps=w)
            rows.append((f"topk threshold S{S} w{w} ctx{ctx}", B, t_graph(fn)))
print("\nwhat B us")
for r in rows:
    print(f"{r[0]:40s} {r[1]:3d} {r[2]:7.1f}")
