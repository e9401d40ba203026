"""The split combine rewritten (every split's columns of a (row, head) loaded at once, grid
(B x H, d_v / BLOCK_D)) against the previous one (a loop over the splits, one program per (row,
head): ``_combine_loop`` below, its source at commit 011a619), the programmatic dependent launch
of the combine (``ws._PDL_COMBINE``) and the split count (auto, x2, /2) at small batches; and
the TP8 / TP4 shapes with the transposed consumers' new order (rope part first). FlashMLA in the
same process. Every decode row is checked against the float32 reference (rel 1e-2, LSE_TOL) and
re-run 5 times for a race, ``vs_new`` against the new combine's output at the same split count;
CUDA events, L2 flushed, median of 30; two interleaved rounds. ``combine_*`` rows: the combine
alone on the decode's partials (cold L2).
Usage: python3 ws_ab12.py [ROUNDS]"""
import sys

import torch
import triton
import triton.language as tl

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn


@triton.jit
def _combine_loop(part_o_ptr, part_lse_ptr, out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,
                  H, num_splits, D_V: tl.constexpr, D_V_PAD: tl.constexpr, S_PAD: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    base = pid.to(tl.int64) * num_splits
    offs_s = tl.arange(0, S_PAD)
    lse_s = tl.load(part_lse_ptr + base + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp(lse_s - m_use), 0)
    offs_v = tl.arange(0, D_V_PAD)
    acc = tl.zeros([D_V_PAD], dtype=tl.float32)
    for s in range(num_splits):
        w = tl.exp(tl.load(part_lse_ptr + base + s) - m_use)
        o = tl.load(part_o_ptr + (base + s) * D_V + offs_v, mask=offs_v < D_V, other=0.0)
        acc += w * o
    has = total > 0.0
    out = acc / tl.where(has, total, 1.0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_v,
             out.to(out_ptr.dtype.element_ty), mask=offs_v < D_V)
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h,
             tl.where(has, m_use + tl.log(tl.where(has, total, 1.0)), float("inf")))


def combine_loop(part_o, part_lse, out, lse, pdl=False):
    bsz, num_heads, num_splits, d_v = part_o.shape
    _combine_loop[(bsz * num_heads,)](part_o, part_lse, out, out.stride(0), out.stride(1), lse,
                                      lse.stride(0), num_heads, num_splits, D_V=d_v,
                                      D_V_PAD=triton.next_power_of_2(d_v),
                                      S_PAD=triton.next_power_of_2(num_splits), num_warps=4)


ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
new_combine = ws.combine_splits
rows = []


def timed(kv, b, h, name, fn, prob, ref_out=None, check=True):
    out = fn()
    torch.cuda.synchronize()
    if check:
        chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
        rel, ok = chk.max_rel_err, ("BAD" if chk.failure() else "ok")
        vs = float("nan") if ref_out is None else (out[0].float() - ref_out.float()).abs().max().item()
        race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
    else:
        rel, ok, vs, race = float("nan"), "diag", float("nan"), float("nan")
    t = time_fn(fn, dev, warmup=5, repeats=30)
    rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, rel, ok, vs, race))
    return out[0]


def decode(prob, pool, splits=None):
    return lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512,
                                           num_splits=splits)


for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    shapes = [(128, 16), (128, 32), (8, 128), (4, 128), (2, 128), (1, 128)]
    probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
    for r in range(ROUNDS):
        for (b, h), prob in probs.items():
            timed(kv, b, h, "flashmla",
                  lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512), prob)
            if b == 128:
                timed(kv, b, h, "ws", decode(prob, pool), prob)
                continue
            auto = ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)[2].num_splits
            ws._PDL_COMBINE = False
            ref = timed(kv, b, h, f"new_s{auto}", decode(prob, pool), prob)
            ws.combine_splits = combine_loop
            try:
                timed(kv, b, h, f"loop_s{auto}", decode(prob, pool), prob, ref)
            finally:
                ws.combine_splits = new_combine
            ws._PDL_COMBINE = True
            timed(kv, b, h, f"new_pdl_s{auto}", decode(prob, pool), prob, ref)
            for sp in (auto * 2, max(1, auto // 2)):
                if sp <= 32 and sp != auto:
                    ws._PDL_COMBINE = False
                    timed(kv, b, h, f"new_s{sp}", decode(prob, pool, sp), prob)
                    ws._PDL_COMBINE = True
                    timed(kv, b, h, f"new_pdl_s{sp}", decode(prob, pool, sp), prob)
            if r == 0:
                kept = {}
                ws.combine_splits = lambda *a, **k: kept.update(args=a) or new_combine(*a[:4])
                try:
                    decode(prob, pool)()
                finally:
                    ws.combine_splits = new_combine
                a = kept["args"][:4]
                timed(kv, b, h, f"combine_new_s{auto}", lambda: (new_combine(*a), a[2:])[1],
                      prob, check=False)
                timed(kv, b, h, f"combine_loop_s{auto}", lambda: (combine_loop(*a), a[2:])[1],
                      prob, check=False)
    del pool, probs
    torch.cuda.empty_cache()
ws._PDL_COMBINE = True
print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':16} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_new':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:16} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f}")
