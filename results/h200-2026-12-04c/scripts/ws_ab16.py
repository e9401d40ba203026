"""fp8_ds_mla rows at 32 heads (TP4): one transposed 32-head program a row (``_T_MAX_HEADS``
raised to 32 at run time) against the 64-head program padded with masked rows (the default),
now that the transposed PV MMA reads half of V a warpgroup. FlashMLA in the same process.
B128 / B8 H32, top_k 2048. Checked against the float32 reference and each other, re-run 5
times for a race; CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab16.py [ROUNDS]"""
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
probs = {b: DecodeProblem.draw(pool, b, 32, 2048, seed=40 + b) for b in (128, 8)}
default = ws._T_MAX_HEADS[kv]
rows = []
for r in range(ROUNDS):
    for b, prob in probs.items():
        ref = None
        for name, tmax in (("flashmla", None), ("padded64", default), ("transposed32", 32)):
            if tmax is None:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                ws._T_MAX_HEADS[kv] = tmax
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or tmax is None else \
                ((out[0].float() - ref.float()).norm() / ref.float().norm()).item()
            if name == "padded64":
                ref = out[0]
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            extra = "" if tmax is None else f"block_h={out[2].block_h} stages={out[2].num_stages} spills={out[2].n_spills}"
            rows.append((b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race, extra))
ws._T_MAX_HEADS[kv] = default
print(f"{'B':>4} {'variant':13} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'check':5} "
      f"{'vs_pad':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[2]
    print(f"{r[0]:>4} {r[1]:13} {r[2]:9.1f} {r[3]:7.1f} {r[4]:7.1f} {r[5]:8.2e} {r[6]:5} "
          f"{r[7]:8.1e} {r[8]:8.1e} {r[2] / fm[r[0]]:6.3f} {r[9]}")
