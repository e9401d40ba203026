"""The split combine with the splits in an unrolled loop, a row a program
(``sparse_mla_decode._COMBINE_UNROLLED = True``: the sum over the splits inside a thread, no
barrier) against every split's columns as one [S, BLOCK_D] tile (``False``: at 16 and 32 splits
the compiler sums across warps through shared memory, 5 barriers), after the ws decode, H128
top_k 2048: fp8 at B1-B32, bf16 at B2 / B4. FlashMLA in the same process. Every row checked
against the float32 reference (rel 1e-2, LSE_TOL); ``vs_tile``: max abs difference from the
tile variant (summation order only). CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab28.py [ROUNDS]"""
import importlib
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

smd = importlib.import_module("backends.kernels.sparse_mla_decode")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
for kv, batches in (("fp8_ds_mla", (1, 2, 4, 8, 16, 32)), ("bf16", (2, 4))):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128) for b in batches}
    for r in range(ROUNDS):
        for b, prob in probs.items():
            ref = None
            for name, u in [("flashmla", None), ("tile", False), ("unrolled", True)]:
                if u is None:
                    fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
                else:
                    smd._COMBINE_UNROLLED = u
                    fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                out = fn()
                torch.cuda.synchronize()
                chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
                vs = float("nan")
                if u is not None:
                    if ref is None:
                        ref = out[0].clone()
                    vs = (out[0].float() - ref.float()).abs().max().item()
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                             "BAD" if chk.failure() else "ok", vs,
                             "" if u is None else f"splits={out[2].num_splits}"))
    del pool, probs
    torch.cuda.empty_cache()
smd._COMBINE_UNROLLED = False
print(f"{'kv':11} {'B':>3} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'check':5} {'vs_tile':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:>3} {r[2]:9} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[7]:5} {r[8]:8.1e} {r[3] / fm[(r[0], r[1])]:6.3f} {r[9]}")
