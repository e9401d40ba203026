"""Warps of a split-combine program of at most 8 splits (``sparse_mla_decode._COMBINE_WARPS_FEW``
4 against 8; more splits keep 4) after the ws decode, H128 top_k 2048, both row formats at
B8 / B16 / B32 (the wave model's 8 / 4 / 2 splits). FlashMLA in the same process. Every row
checked against the float32 reference (rel 1e-2, LSE_TOL) and against the 4-warp variant
(``vs_w4``: must be 0). CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab27.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode as smd
from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128) for b in (8, 16, 32)}
    for r in range(ROUNDS):
        for b, prob in probs.items():
            ref = None
            for name, w in [("flashmla", None), ("w4", 4), ("w8", 8)]:
                if w is None:
                    fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
                else:
                    smd._COMBINE_WARPS_FEW = w
                    fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                out = fn()
                torch.cuda.synchronize()
                chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
                vs = float("nan")
                if w is not None:
                    if ref is None:
                        ref = out[0].clone()
                    vs = (out[0].float() - ref.float()).abs().max().item()
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                             "BAD" if chk.failure() else "ok", vs,
                             "" if w is None else f"splits={out[2].num_splits}"))
    del pool, probs
    torch.cuda.empty_cache()
smd._COMBINE_WARPS_FEW = 8
print(f"{'kv':11} {'B':>3} {'variant':8} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'check':5} {'vs_w4':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:>3} {r[2]:8} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[7]:5} {r[8]:8.1e} {r[3] / fm[(r[0], r[1])]:6.3f} {r[9]}")
