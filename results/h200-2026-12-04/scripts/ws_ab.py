"""A/B of the ws kernel against the module as it was at 0565d72 (``ws_head.py``, a copy of
that commit's ``backends/kernels/sparse_mla_decode_ws.py``), with FlashMLA in the same process:
the producer's slot ids from shared memory (new) vs global loads after the ``empty`` wait
(head), and the fp8 dequantization variants of ``ws._DEQ_ASM`` (``ws._DEQUANT`` switched at
run time). Shapes: B128 H128 top_k 2048 and B1/2/4/8 H128, both KV formats (raw scales).
Every row checked against the float32 reference first; CUDA events, L2 flushed, median of 30;
``ROUNDS`` interleaved rounds.
Usage: python3 ws_ab.py [ROUNDS]"""
import importlib.util
import os
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

spec = importlib.util.spec_from_file_location(
    "ws_head", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ws_head.py"))
head = importlib.util.module_from_spec(spec)
spec.loader.exec_module(head)

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []


def timed(kv, b, name, fn, prob):
    out = fn()
    torch.cuda.synchronize()
    err = ((out[0].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
    t = time_fn(fn, dev, warmup=5, repeats=30)
    rows.append((kv, b, name, t.median_us, t.p10_us, t.p90_us, err))


for kv in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b) for b in (128, 8, 4, 2, 1)}
    variants = ["head", "cvt"] + (["alu", "mixed", "bf16mul"] if kv != "bf16" else [])
    for r in range(ROUNDS):
        for b, prob in probs.items():
            timed(kv, b, "flashmla",
                  lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512), prob)
            for v in variants:
                mod = head if v == "head" else ws
                if v != "head":
                    ws._DEQUANT = v
                timed(kv, b, v, lambda: mod.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices,
                                                                 SM_SCALE, 512), prob)
    del pool, probs
    torch.cuda.empty_cache()
ws._DEQUANT = "cvt"
print(f"{'kv':11} {'B':>4} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:9} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[3] / fm[(r[0], r[1])]:6.3f}")
