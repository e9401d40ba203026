"""Split counts of the ws decode at small batch, fp8_ds_mla rows, H128, top_k 2048: the wave
model's choice (auto) against 6, 8, 11, 16 and 32 splits (32 tiles: 11 splits are 3 tiles
each, 6 splits 6 tiles). FlashMLA in the same process. Every row checked against the float32
reference (rel 1e-2, LSE_TOL). CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_splits25.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
kv = "fp8_ds_mla"
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128) for b in (2, 4, 8)}
rows = []
for r in range(ROUNDS):
    for b, prob in probs.items():
        for ns in ("flashmla", None, 6, 8, 11, 16, 32):
            if ns == "flashmla":
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512,
                                                     num_splits=ns)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            t = time_fn(fn, dev, warmup=5, repeats=30)
            got = "" if ns == "flashmla" else out[2].num_splits
            rows.append((b, "flashmla" if ns == "flashmla" else f"ws {ns or 'auto'}", got,
                         t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok"))
print(f"{'B':>3} {'variant':10} {'splits':>6} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'check':5} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[3]
    print(f"{r[0]:>3} {r[1]:10} {str(r[2]):>6} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[7]:5} {r[3] / fm[r[0]]:6.3f}")
