"""A/B of the ws kernel's fp8 path, 64-head programs: the next tile's rows dequantized while this
tile's PV MMA runs, in ``ws._PV_CHUNKS`` token chunks (each warpgroup into the columns its own
MMA reads), ``ws._DEQ_ROWS`` rows a step, against the module at 66489ac (``ws_base.py``: the
whole tile dequantized before its score MMA). FlashMLA in the same process. Shapes B128 H128
top_k 2048 and B1/2/4/8 H128 (fp8_ds_mla rows), B128 H128 bf16 (path unchanged). Every row is
checked against the float32 reference (``check_attention``: rel 1e-2, lse 2e-2 / 1e-3) and
against the base kernel's output (max |diff|: the same products in the same order, so 0
expected), and re-run 5 times for a race (max |diff| to its first output); then CUDA events, L2
flushed, median of 30; ``ROUNDS`` interleaved rounds.
Usage: python3 ws_ab7.py [ROUNDS]"""
import importlib.util
import os
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

spec = importlib.util.spec_from_file_location(
    "ws_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ws_base.py"))
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
VARIANTS = {"base": None, "pv1_d32": (1, 32), "pv2_d32": (2, 32), "pv2_d16": (2, 16),
            "pv4_d16": (4, 16)}
SMALL = ("base", "pv2_d32", "pv4_d16")


def timed(kv, b, name, fn, prob, ref_out=None):
    out = fn()
    torch.cuda.synchronize()
    chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
    vs_base = float("nan") if ref_out is None else (out[0].float() - ref_out.float()).abs().max().item()
    race = 0.0
    for _ in range(5):
        again = fn()
        race = max(race, (again[0].float() - out[0].float()).abs().max().item())
    t = time_fn(fn, dev, warmup=5, repeats=30)
    rows.append((kv, b, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                 "BAD" if chk.failure() else "ok", vs_base, race))
    return out[0]


for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    bs = (128, 8, 4, 2, 1) if kv == "fp8_ds_mla" else (128,)
    probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b) for b in bs}
    for r in range(ROUNDS):
        for b, prob in probs.items():
            timed(kv, b, "flashmla",
                  lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512), prob)
            names = list(VARIANTS) if b == 128 and kv == "fp8_ds_mla" else \
                (SMALL if kv == "fp8_ds_mla" else ("base", "pv4_d16"))
            ref = None
            for v in names:
                if v == "base":
                    fn = lambda: base.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                else:
                    ws._PV_CHUNKS, ws._DEQ_ROWS = VARIANTS[v]
                    fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                o = timed(kv, b, v, fn, prob, ref)
                if v == "base":
                    ref = o
    del pool, probs
    torch.cuda.empty_cache()
print(f"{'kv':11} {'B':>4} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} "
      f"{'check':5} {'vs_base':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:9} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[7]:5} {r[8]:8.1e} {r[9]:8.1e} {r[3] / fm[(r[0], r[1])]:6.3f}")
