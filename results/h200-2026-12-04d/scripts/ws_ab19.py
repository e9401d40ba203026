"""fp8_ds_mla rows in 64-head programs: the symmetric consumers (both warpgroups split every
MMA: ``ws._ASYM_FP8_64 = False``) against the asymmetric ones (warpgroup 0 computes all of the
scores and the softmax, each dequantizes half of the tile and accumulates half of the V
columns: ``True``), each with the float32 (``cvt``) and the bit-move (``bf16``)
dequantization (``ws._DEQ_BF16``); the asymmetric ones also at 32 rows a dequantization chunk
(``ws._DEQ_ROWS_A``). FlashMLA in the same process. B128 and B1-B8 at 128 heads, top_k 2048,
raw scales. Every row checked against the float32 reference (rel 1e-2, LSE_TOL) and against
the variant ``sym_cvt`` (rel), re-run 5 times for a race; ``vs_fmla``: relative difference
from FlashMLA's output. CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab19.py [ROUNDS]"""
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
shapes = [(128, 128), (8, 128), (4, 128), (2, 128), (1, 128)]
probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
VARIANTS = [("flashmla", None), ("sym_cvt", (False, False, 16)), ("sym_bf16", (False, True, 16)),
            ("asym_cvt", (True, False, 16)), ("asym_bf16", (True, True, 16)),
            ("asym_bf16_r32", (True, True, 32))]
rows = []
for r in range(ROUNDS):
    for (b, h), prob in probs.items():
        ref = fm_out = None
        for name, v in VARIANTS:
            if v is None:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                ws._ASYM_FP8_64, ws._DEQ_BF16, ws._DEQ_ROWS_A = v
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            rel = lambda a, c: ((a.float() - c.float()).norm() / c.float().norm()).item()
            vs = float("nan") if ref is None or v is None else rel(out[0], ref)
            if v is None:
                fm_out = out[0].reshape(b, h, 512)
            vs_fm = rel(out[0].reshape(b, h, 512), fm_out)
            if name == "sym_cvt":
                ref = out[0]
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            extra = "" if v is None else f"spills={out[2].n_spills}"
            rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, vs_fm, race, extra))
ws._ASYM_FP8_64, ws._DEQ_BF16, ws._DEQ_ROWS_A = True, True, 16

print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':14} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_sym':>8} {'vs_fmla':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:14} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[11]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f} {r[12]}")
