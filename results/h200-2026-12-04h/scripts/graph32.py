"""Small-batch fp8 split counts as CUDA-graph replays: the ws decode and its split combine at
fp8_ds_mla H128 top_k 2048, B2 / B4 / B8, at the wave model's split count and the others that
give whole tiles a split, beside FlashMLA's call; each timed as a Python call (launch shield)
and as a replay of one captured call. Every call's output checked against the float32
reference first, the replay's against the eager one. CUDA events, L2 flushed, median of 30;
interleaved rounds. Usage: python3 graph32.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import capture_graph, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
SPLITS = {2: (None, 16, 32), 4: (None, 8, 11, 16, 32), 8: (None, 6, 8, 11)}
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
pool = Pool(128, 32768, 64, 576, 512, "fp8_ds_mla", dev, seed=7)
probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128) for b in SPLITS}
rows = []
for r in range(ROUNDS):
    for b, prob in probs.items():
        for who in ("flashmla",) + SPLITS[b]:
            if who == "flashmla":
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                fn = lambda s=who: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices,
                                                           SM_SCALE, 512, num_splits=s)[:2]
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out, 1e-2, LSE_TOL["fp8_ds_mla"])
            graph, gout = capture_graph(fn)
            graph.replay()
            torch.cuda.synchronize()
            gdiff = (gout[0].float() - out[0].float()).abs().max().item()
            for mode, call in (("eager", fn), ("graph", graph.replay)):
                t = time_fn(call, dev, warmup=5, repeats=30)
                rows.append((b, "flashmla" if who == "flashmla" else f"ws s={who or 'model'}",
                             mode, t.median_us, t.p10_us, t.p90_us,
                             "BAD" if chk.failure() or gdiff > 0 else "ok"))
            del graph, gout
fm = {(b, m): [] for b in SPLITS for m in ("eager", "graph")}
for row in rows:
    if row[1] == "flashmla":
        fm[(row[0], row[2])].append(row[3])
print(f"{'B':>3} {'who':14} {'mode':6} {'median_us':>9} {'p10':>7} {'p90':>7} {'check':5} {'/fmla':>6}")
for row in sorted(rows, key=lambda x: (x[0], x[2], x[1])):
    ref = sorted(fm[(row[0], row[2])])[len(fm[(row[0], row[2])]) // 2]
    print(f"{row[0]:>3} {row[1]:14} {row[2]:6} {row[3]:9.1f} {row[4]:7.1f} {row[5]:7.1f} "
          f"{row[6]:5} {row[3] / ref:6.3f}")
