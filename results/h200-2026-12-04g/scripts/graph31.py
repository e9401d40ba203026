"""Small-batch split calls as engines run decode: ours (the ws decode and its split combine)
and FlashMLA's call, each timed as a Python call (launch shield) and as a CUDA-graph replay
(``harness.timing.capture_graph``), H128 top_k 2048, fp8_ds_mla B1-B16 and bf16 B1 / B4. Every
call's output checked against the float32 reference first, the graph's output against the
eager one. CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 graph31.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import capture_graph, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
pools = {kv: Pool(128, 32768, 64, 576, 512, kv, dev, seed=7) for kv in ("fp8_ds_mla", "bf16")}
shapes = [("fp8_ds_mla", b) for b in (1, 2, 4, 8, 16)] + [("bf16", 1), ("bf16", 4)]
probs = {s: DecodeProblem.draw(pools[s[0]], s[1], 128, 2048, seed=8 + s[1] + 128) for s in shapes}
rows = []
for r in range(ROUNDS):
    for (kv, b), prob in probs.items():
        pool = pools[kv]
        for who in ("flashmla", "ours"):
            if who == "ours":
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)[:2]
            else:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out, 1e-2, LSE_TOL[kv])
            graph, gout = capture_graph(fn)
            graph.replay()
            torch.cuda.synchronize()
            gdiff = (gout[0].float() - out[0].float()).abs().max().item()
            for mode, call in (("eager", fn), ("graph", graph.replay)):
                t = time_fn(call, dev, warmup=5, repeats=30)
                rows.append((kv, b, who, mode, t.median_us, t.p10_us, t.p90_us,
                             "BAD" if chk.failure() or gdiff > 0 else "ok", gdiff))
            del graph, gout
print(f"{'kv':10} {'B':>3} {'who':9} {'mode':6} {'median_us':>9} {'p10':>7} {'p90':>7} {'check':5} {'graph_vs_eager':>14} {'/fmla':>6}")
fm = {}
for row in rows:
    kv, b, who, mode = row[:4]
    if who == "flashmla":
        fm[(kv, b, mode)] = row[4]
    print(f"{kv:10} {b:>3} {who:9} {mode:6} {row[4]:9.1f} {row[5]:7.1f} {row[6]:7.1f} {row[7]:5} "
          f"{row[8]:14.1e} {row[4] / fm[(kv, b, mode)]:6.3f}")
