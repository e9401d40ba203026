"""The split combine after the ws decode at small batch (fp8_ds_mla rows, H128, top_k 2048):
launched plainly or as a programmatic dependent of the decode (``ws._PDL_COMBINE``: the decode
triggers it first thing, the combine waits for its writes), and its program size
(``sparse_mla_decode._COMBINE_ELEMS`` float32 a program: 2048 / 4096 / 8192; ``_COMBINE_WARPS``
4 / 8). FlashMLA in the same process. Every row checked against the float32 reference (rel
1e-2, LSE_TOL) and against the default variant (``vs_def``: must be 0), re-run 5 times for a
race. CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab26.py [ROUNDS]"""
import itertools
import sys

import torch

from backends.kernels import sparse_mla_decode as smd
from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
kv = "fp8_ds_mla"
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128) for b in (1, 2, 4, 8)}
variants = [("flashmla", None)] + [(f"pdl{int(p)} e{e} w{w}", (p, e, w)) for p, e, w in
                                   itertools.product((False, True), (4096, 2048, 8192), (4, 8))]
rows = []
for r in range(ROUNDS):
    for b, prob in probs.items():
        ref = None
        for name, v in variants:
            if v is None:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                ws._PDL_COMBINE, smd._COMBINE_ELEMS, smd._COMBINE_WARPS = v
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = float("nan")
            if v is not None:
                if ref is None:
                    ref = out[0].clone()
                vs = (out[0].float() - ref.float()).abs().max().item()
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race))
ws._PDL_COMBINE, smd._COMBINE_ELEMS, smd._COMBINE_WARPS = False, 4096, 4
print(f"{'B':>3} {'variant':16} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'check':5} {'vs_def':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[2]
    print(f"{r[0]:>3} {r[1]:16} {r[2]:9.1f} {r[3]:7.1f} {r[4]:7.1f} {r[5]:8.2e} {r[6]:5} {r[7]:8.1e} {r[8]:8.1e} {r[2] / fm[r[0]]:6.3f}")
