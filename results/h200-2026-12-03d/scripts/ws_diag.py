"""Where the ws kernel's time goes at B128 H128 top_k 2048 (both KV formats): the kernel as
built, and two ablations made from its source at run time (the product module is untouched):
``loads_only`` (the consumers wait for each stage and hand it back without any MMA or softmax:
the producer's gather alone) and ``compute_only`` (the producer's copies are all masked: no
global reads, the consumers compute on whatever the stages hold). Also the 1-stage launch.
Call 8 ran this script at commit 74177ef (the module then dequantized fp8 rows in the producer)
with one more variant, ``consumer_dequant``: a copy of the module of commit de8e4e3 (the
consumers dequantize; the module's design again since 43cc602).
CUDA-event timing with the L2 flushed (harness.timing.time_fn), median of 30."""
import importlib.util
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

SRC = open(ws.__file__).read()
LOOP_START = "        kn = kv_nope.index(s)\n"
LOOP_END = "        acc = warpgroup_mma_wait(0, deps=[acc])\n"
PROD_ARGS = "b, h0, H, t_begin, t_end, lim, num_slots,\n                     q_nope"


def variant(name, src):
    spec = importlib.util.spec_from_loader(f"ws_{name}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = f"/tmp/ws_{name}.py"
    open(mod.__file__, "w").write(src)
    code = compile(src, mod.__file__, "exec")
    sys.modules[spec.name] = mod
    exec(code, mod.__dict__)
    return mod


a, b = SRC.index(LOOP_START), SRC.index(LOOP_END) + len(LOOP_END)
assert SRC.count(LOOP_START) == 1 and SRC.count(PROD_ARGS) == 1
mods = {"ws": ws,
        "loads_only": variant("loads_only", SRC[:a] + "        m_new = m_i\n" + SRC[b:]),
        "compute_only": variant("compute_only", SRC.replace(PROD_ARGS, PROD_ARGS.replace("lim", "0")))}
dev = torch.device("cuda")
rows = []
for kv_dtype in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv_dtype, dev, seed=7)
    prob = DecodeProblem.draw(pool, 128, 128, 2048, seed=8)
    for name, mod in mods.items():
        for stages in ((1, 2) if name == "ws" else (2,)):
            fn = lambda: mod.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512,
                                                  stages=stages)
            out = fn()
            err = ((out[0].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((kv_dtype, name, stages, t.median_us, t.p10_us, t.p90_us, err))
    del pool, prob
    torch.cuda.empty_cache()
print(f"{'kv':11} {'variant':13} {'stages':>6} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8}")
for r in rows:
    print(f"{r[0]:11} {r[1]:13} {r[2]:>6} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e}")
