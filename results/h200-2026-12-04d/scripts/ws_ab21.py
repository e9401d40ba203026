"""(1) The producer issuing the first tiles' copies before the query block has landed
(``ws._Q_EARLY = True``: the query block arrives on its own mbarrier) against waiting for it
first (``False``), both row formats, B128 at 128 and 16 heads and B1-B8 at 128 heads; fp8 at 16
heads also with 32 rows a dequantization chunk (``ws._DEQ_ROWS_A``, one chunk a warpgroup). (2) Where
a small batch's fp8 time goes: the whole call, the decode kernel alone (the split combine
skipped: its output is then wrong and not checked), and the combine alone on the partials the
decode left (cold and warm L2). FlashMLA in the same process; top_k 2048. Checked rows against
the float32 reference (rel 1e-2, LSE_TOL) and the first variant (rel), re-run 5 times for a
race. CUDA events, median of 30; two interleaved rounds.
Usage: python3 ws_ab21.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
combine = ws.combine_splits
rows, parts = [], []
for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    shapes = [(128, 128), (128, 16), (8, 128), (4, 128), (2, 128), (1, 128)]
    if kv == "bf16":
        shapes = [(128, 128), (128, 16), (4, 128)]
    probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
    for r in range(ROUNDS):
        for (b, h), prob in probs.items():
            ref = None
            variants = [("flashmla", None), ("q_wait", (False, 16)), ("q_early", (True, 16))]
            if h == 16 and kv == "fp8_ds_mla":
                variants.append(("q_early_r32", (True, 32)))
            for name, v in variants:
                if v is None:
                    fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
                else:
                    ws._Q_EARLY, ws._DEQ_ROWS_A = v
                    fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                out = fn()
                torch.cuda.synchronize()
                chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
                vs = float("nan") if ref is None or v is None else \
                    ((out[0].float() - ref.float()).norm() / ref.float().norm()).item()
                if v is not None and ref is None:
                    ref = out[0]
                race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                             "BAD" if chk.failure() else "ok", vs, race))
            if kv == "fp8_ds_mla" and b <= 8 and r == ROUNDS - 1:
                call = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                seen = []
                ws.combine_splits = lambda *a: seen.append(a)
                call()
                t_dec = time_fn(call, dev, warmup=5, repeats=30)
                ws.combine_splits = combine
                args = seen[-1]
                t_cold = time_fn(lambda: combine(*args), dev, warmup=5, repeats=30)
                t_warm = time_fn(lambda: combine(*args), dev, warmup=5, repeats=30, cold_l2=False)
                t_all = time_fn(call, dev, warmup=5, repeats=30)
                parts.append((b, h, args[0].shape[2], t_all.median_us, t_dec.median_us,
                              t_cold.median_us, t_warm.median_us))
    del pool, probs
    torch.cuda.empty_cache()
ws._Q_EARLY, ws._DEQ_ROWS_A = True, 16

print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':10} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_first':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:10} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f}")
print("\nfp8 small batch, q_early: whole call / decode kernel alone / combine alone (cold, warm L2), us")
print(f"{'B':>4} {'H':>4} {'splits':>6} {'whole':>7} {'decode':>7} {'comb_cold':>9} {'comb_warm':>9}")
for p in parts:
    print(f"{p[0]:>4} {p[1]:>4} {p[2]:>6} {p[3]:7.1f} {p[4]:7.1f} {p[5]:9.1f} {p[6]:9.1f}")
