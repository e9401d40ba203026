"""fp8_ds_mla rows in 16-head programs: two one-warpgroup consumers on alternate tiles,
dequantizing in place (``ws._PAIRED_FP8_16``, new) against the two-warpgroup transposed
consumers (off). FlashMLA in the same process (64-head padded). B128 / B64 / B8 / B1 at 16
heads and B128 at 8 heads, top_k 2048. Every row checked against the float32 reference
(rel 1e-2, LSE_TOL) and against the unpaired output (rel), re-run 5 times for a race; CUDA
events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab13.py [ROUNDS]"""
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
shapes = [(128, 16), (64, 16), (8, 16), (1, 16), (128, 8)]
probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
rows = []
for r in range(ROUNDS):
    for (b, h), prob in probs.items():
        fns = [("flashmla", None, lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
        for v in (False, True):
            fns.append(("paired" if v else "unpaired", v, lambda: ws.sparse_mla_decode_ws(
                prob.q, pool.cache, prob.indices, SM_SCALE, 512)))
        ref = None
        for name, v, fn in fns:
            if v is not None:
                ws._PAIRED_FP8_16 = v
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or v is None else \
                ((out[0].float() - ref.float()).norm() / ref.float().norm()).item()
            if v is False:
                ref = out[0]
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            extra = "" if v is None else f"regs={out[2].n_regs} spills={out[2].n_spills} smem={out[2].smem_bytes} splits={out[2].num_splits}"
            rows.append((b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race, extra))
ws._PAIRED_FP8_16 = True
print(f"{'B':>4} {'H':>3} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} "
      f"{'check':5} {'vs_unp':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:>4} {r[1]:>3} {r[2]:9} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[7]:5} {r[8]:8.1e} {r[9]:8.1e} {r[3] / fm[(r[0], r[1])]:6.3f} {r[10]}")
