"""j6: why the harness's attention stage (dsv32 defaults: B32 H128 top_k 2048, fp8_ds_mla,
sm_scale 192^-0.5) was ~3 us slower with fp16 partials than with float32 ones (j4, j5) while
the A/B (sm_scale 576^-0.5) had it 1.6 us faster: the same A/B at B32 and B4 with the bench's
sm_scale, with the harness's, and with the harness's and a 3x query (peakier softmax). Checked
against the float32 reference first; CUDA events, L2 flushed, median of 30; graph and eager.
Usage: python3 ws_ab50.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.reference import sparse_mla_decode_ref
from harness.timing import capture_graph, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
pool = Pool(128, 32768, 64, 576, 512, "fp8_ds_mla", dev, seed=7)
rows = []
for r in range(ROUNDS):
    for b in (32, 4):
        prob = DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128)
        for label, scale, qmul in (("bench", SM_SCALE, 1.0), ("harness", 192 ** -0.5, 1.0),
                                   ("harness_q3", 192 ** -0.5, 3.0)):
            q = (prob.q.float() * qmul).to(torch.bfloat16)
            ref, _ = sparse_mla_decode_ref(q, pool.cache, prob.indices, scale, 512)
            for part in ("float32", "bfloat16", "float16"):
                fn = lambda p=part: ws.sparse_mla_decode_ws(q, pool.cache, prob.indices, scale, 512,
                                                             split_partials=p)[:2]
                out = fn()
                torch.cuda.synchronize()
                err = ((out[0].float() - ref).norm() / ref.norm()).item()
                graph, gout = capture_graph(fn)
                for mode, call in (("eager", fn), ("graph", graph.replay)):
                    t = time_fn(call, dev, warmup=5, repeats=30)
                    rows.append((b, label, part, mode, t.median_us, err))
                del graph, gout
print(f"{'B':>3} {'problem':11} {'mode':6} " + " ".join(f"{p:>16}" for p in ("float32", "bfloat16", "float16")) + "  errors")
for b in (32, 4):
    for label in ("bench", "harness", "harness_q3"):
        for mode in ("graph", "eager"):
            cells, errs = [], []
            for part in ("float32", "bfloat16", "float16"):
                ts = [x[4] for x in rows if x[:4] == (b, label, part, mode)]
                errs.append(max(x[5] for x in rows if x[:4] == (b, label, part, mode)))
                cells.append("/".join(f"{t:.1f}" for t in ts))
            print(f"{b:>3} {label:11} {mode:6} " + " ".join(f"{c:>16}" for c in cells) + "  " + " ".join(f"{e:.2e}" for e in errs))
