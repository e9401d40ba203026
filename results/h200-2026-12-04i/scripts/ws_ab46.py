"""i13: the combine's program size (``_COMBINE_ELEMS`` 32-bit words: 4096, the default, and 8192:
one program a row at 16 splits) for float32 and bf16 partials, after i12's final code.
ws_ab45.py's doc: i11: float32 partials' combine at 4 warps and at as many as a row's columns fill
(``_F32_WARPS_BY_COLUMNS``), beside bf16 partials (the option, split_partials="bfloat16"). ws_ab43.py's doc: i9: as ws_ab40.py (i5), with the switch of the combine module really set: ``from
backends.kernels import sparse_mla_decode`` is the package's re-exported function, not the
module, so i3-i5's ``smd._COMBINE_ELEMS`` / ``_PAIRS_WARPS_BY_COLUMNS`` changed nothing (the
module is taken from ``sys.modules`` here). ws_ab40.py's doc: i5: as ws_ab39.py (i4), after the bf16 partials' combine stores its output as packed words
(no interleave through shared memory): 4 warps a program, or as many as a row's words fill
(``sparse_mla_decode._PAIRS_WARPS_BY_COLUMNS``: no barrier in the sm_90a PTX at 2-16 splits).
ws_ab39.py's doc: i4: as ws_ab38.py (i3), with the bf16 partials' combine at 4 warps a program and at as many
as a row's words fill. ws_ab38.py's doc:
The ws decode's split partials in bf16 after i1/i2 (``ws._PARTIALS``; stored through shared
memory as 16-byte vectors, as the bf16 output is; the combine now reads them as int32 pairs,
``PAIRS``, so its loads and sums have the float32 partials' layout), against float32 partials;
the combine's program size for the pairs (``sparse_mla_decode._COMBINE_ELEMS``: 4096 words,
twice the columns of a float32 program, or 2048, the same columns). H128 top_k 2048,
fp8_ds_mla B1-B32 and bf16 B1 / B4, the wave model's split count and, for the 16-bit partials,
the next power of two up (the model prices float32 partials). FlashMLA in the same process.
Every row checked against the float32 reference (rel 1e-2, LSE_TOL; ``rel_err`` the norm-wise
error) and against the float32-partials output of the same problem (``vs_f32``: max |diff|);
each timed as a Python call (launch shield) and as a replay of one captured call (the replay's
output equal to the eager one). CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab46.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import capture_graph, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
SHAPES = [("fp8_ds_mla", b) for b in (1, 2, 4, 8)]
import backends.kernels.sparse_mla_decode  # noqa: F401  (the module, for sys.modules)
smd = sys.modules["backends.kernels.sparse_mla_decode"]
assert not callable(smd), "the combine's module, not the package's function"
DT = {"f32": (torch.float32, 4096), "f32 e8k": (torch.float32, 8192), "bf16": (torch.bfloat16, 4096),
      "bf16 e8k": (torch.bfloat16, 8192)}
pools = {kv: Pool(128, 32768, 64, 576, 512, kv, dev, seed=7) for kv in ("fp8_ds_mla", "bf16")}
probs = {(kv, b): DecodeProblem.draw(pools[kv], b, 128, 2048, seed=8 + b + 128) for kv, b in SHAPES}
rows = []
for r in range(ROUNDS):
    for (kv, b), prob in probs.items():
        pool = pools[kv]
        base = ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
        model_splits = base[2].num_splits
        ref32 = base[0].float().clone()
        cases = [("flashmla", None, None)] + [(f"{d} s{model_splits}", DT[d], None) for d in DT]
        up = 2 * model_splits
        if model_splits > 1 and up <= 32:
            cases += []
        for name, dt, splits in cases:
            if dt is None:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                part, smd._COMBINE_ELEMS = dt
                fn = lambda s=splits, p=part: ws.sparse_mla_decode_ws(
                    prob.q, pool.cache, prob.indices, SM_SCALE, 512, num_splits=s,
                    split_partials=str(p)[6:])[:2]
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out, 1e-2, LSE_TOL[kv])
            vs = (out[0].float() - ref32).abs().max().item() if dt is not None else float("nan")
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(3))
            graph, gout = capture_graph(fn)
            graph.replay()
            torch.cuda.synchronize()
            gdiff = (gout[0].float() - out[0].float()).abs().max().item()
            ok = not chk.failure() and gdiff == 0 and race == 0
            for mode, call in (("eager", fn), ("graph", graph.replay)):
                t = time_fn(call, dev, warmup=5, repeats=30)
                rows.append((kv, b, name, mode, t.median_us, t.p10_us, t.p90_us,
                             chk.max_rel_err, vs, "ok" if ok else "BAD"))
            del graph, gout
        smd._COMBINE_ELEMS = 4096
fm = {}
for row in rows:
    if row[2] == "flashmla":
        fm.setdefault((row[0], row[1], row[3]), []).append(row[4])
print(f"{'kv':10} {'B':>3} {'variant':10} {'mode':6} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'vs_f32':>8} {'check':5} {'/fmla':>6}")
for row in sorted(rows, key=lambda x: (x[0], x[1], x[3], x[2])):
    ref = sorted(fm[(row[0], row[1], row[3])])[len(fm[(row[0], row[1], row[3])]) // 2]
    print(f"{row[0]:10} {row[1]:>3} {row[2]:10} {row[3]:6} {row[4]:9.1f} {row[5]:7.1f} "
          f"{row[6]:7.1f} {row[7]:8.2e} {row[8]:8.1e} {row[9]:5} {row[4] / ref:6.3f}")
