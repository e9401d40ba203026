"""The producer warpgroup's share of the fp8 dequantization (``ws._PRODUCER_DEQ_ROWS``: the last
0 / 16 / 32 rows of each tile, converted by the producer's four warps while the consumers' eight
convert the others; 64-head programs at 2 stages). fp8_ds_mla rows, top_k 2048, B128 / B8 / B2 /
B1 at 128 heads; FlashMLA in the same process. Every row checked against the float32 reference
(rel 1e-2, lse 2e-2) and against the 0-row variant's output (max |diff|: 0 expected), re-run 5
times for a race; CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab10.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
kv = "fp8_ds_mla"
DEFAULT = ws._PRODUCER_DEQ_ROWS
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b) for b in (128, 8, 2, 1)}
for rnd in range(2):
    for b, prob in probs.items():
        fns = [("flashmla", None, lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
        for pr in (0, 16, 32):
            fns.append((f"pdq{pr}", pr, lambda: ws.sparse_mla_decode_ws(
                prob.q, pool.cache, prob.indices, SM_SCALE, 512)))
        ref = None
        for name, pr, fn in fns:
            if pr is not None:
                ws._PRODUCER_DEQ_ROWS = pr
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or pr is None else (out[0].float() - ref.float()).abs().max().item()
            if pr == 0:
                ref = out[0]
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race))
ws._PRODUCER_DEQ_ROWS = DEFAULT
print(f"{'B':>4} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} "
      f"{'check':5} {'vs_0':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[2]
    print(f"{r[0]:>4} {r[1]:9} {r[2]:9.1f} {r[3]:7.1f} {r[4]:7.1f} {r[5]:8.2e} "
          f"{r[6]:5} {r[7]:8.1e} {r[8]:8.1e} {r[2] / fm[r[0]]:6.3f}")
