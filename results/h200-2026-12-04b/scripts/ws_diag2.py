"""Where the ws kernel's time goes (the module as committed, 66489ac's kernel) at B128 top_k
2048 with 128 heads (64-head programs) and 16 heads (TP8: transposed 16-head programs), built
from its source at run time (the product module is untouched):

* ``loads_only``: the consumers wait for each stage and hand it back (no dequantization, MMA or
  softmax): the producer's gather alone;
* ``loads_dequant`` (fp8 rows): the consumers dequantize each stage into the bf16 tile, then
  hand it back (no MMA): gather and dequantization;
* ``no_dequant`` (fp8 rows): the whole kernel without the dequantization (the MMAs read
  whatever the bf16 tile holds): what the conversion adds;
* ``compute_only``: the producer's copies are all masked (no global reads): the consumers alone;
* ``ws`` at its default stages, and at 2 stages where the default is 3.

Only ``ws`` computes the right numbers (its rel_err is checked); the ablations are timed only.
CUDA-event timing with the L2 flushed (harness.timing.time_fn), median of 30.
Usage: python3 ws_diag2.py"""
import importlib.util
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws

SRC = open(ws.__file__).read()
READY = "        fence_async_shared()        # the producer's copies, for the tensor cores\n"
AFTER_DEQ = "        else:\n            kn = kv_nope.index(s)\n"
END = "        acc = warpgroup_mma_wait(0, deps=[acc])\n"
DEQ_LOOP = "for c in gl.static_range(BLOCK_N // DEQ_ROWS):"
PROD_ARGS = "b, h0, H, t_begin, t_end, lim, num_slots,\n                     q_nope"


def cut(src, start, end, keep_start):
    """Both consumers' loop bodies from ``start`` (kept when ``keep_start``) to the PV wait,
    replaced by 'no MMA' (the running max unchanged)."""
    out, pos = [], 0
    for _ in range(2):
        a = src.index(start, pos)
        b = src.index(end, a) + len(end)
        out.append(src[pos:a] + (start if keep_start else "") + "        m_new = m_i\n")
        pos = b
    return "".join(out) + src[pos:]


def variant(name, src):
    spec = importlib.util.spec_from_loader(f"ws_{name}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = f"/tmp/ws_{name}.py"
    open(mod.__file__, "w").write(src)
    sys.modules[spec.name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


assert SRC.count(READY) == 2 and SRC.count(AFTER_DEQ) == 2 and SRC.count(DEQ_LOOP) == 2
assert SRC.count(PROD_ARGS) == 1
MODS = {"ws": ws,
        "loads_only": variant("loads_only", cut(SRC, READY, END, True)),
        "loads_dequant": variant("loads_dequant", cut(SRC, AFTER_DEQ, END, False)),
        "no_dequant": variant("no_dequant", SRC.replace(DEQ_LOOP, "for c in gl.static_range(0):")),
        "compute_only": variant("compute_only",
                                SRC.replace(PROD_ARGS, PROD_ARGS.replace("lim", "0")))}

if __name__ == "__main__":
    from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
    from harness.timing import time_fn
    dev = torch.device("cuda")
    rows = []
    for kv in ("fp8_ds_mla", "bf16"):
        pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
        for h in ((128, 16) if kv == "fp8_ds_mla" else (16,)):
            prob = DecodeProblem.draw(pool, 128, h, 2048, seed=8 + h)
            names = list(MODS) if kv == "fp8_ds_mla" else ["ws", "loads_only", "compute_only"]
            for name in names:
                for st in ((None, 2) if name == "ws" and kv == "fp8_ds_mla" and h == 16 else (None,)):
                    fn = lambda: MODS[name].sparse_mla_decode_ws(prob.q, pool.cache, prob.indices,
                                                                 SM_SCALE, 512, stages=st)
                    out = fn()
                    torch.cuda.synchronize()
                    err = ((out[0].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
                    t = time_fn(fn, dev, warmup=5, repeats=30)
                    rows.append((kv, h, name, out[2].num_stages, t.median_us, t.p10_us, t.p90_us, err))
                    print(rows[-1], flush=True)
            del prob
        del pool
        torch.cuda.empty_cache()
    print(f"{'kv':11} {'H':>4} {'variant':14} {'stages':>6} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8}")
    for r in rows:
        print(f"{r[0]:11} {r[1]:>4} {r[2]:14} {r[3]:>6} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} {r[7]:8.2e}")
