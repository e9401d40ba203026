"""j4: the final code: the ws decode's split partials as float32, bf16 and scaled fp16 (the
default now: a power of two a head's stored column range; the combine's weights one a split
where its program lies in one range, else one a word), the combine's programs at 2048 words.
(ws_ab48.py's doc, j3: each with the combine's program size at 4096 and 2048 32-bit words.) H128 top_k 2048,
fp8_ds_mla B1-B32 and bf16 B4 / B32, the wave model's split count. FlashMLA in the same process.
Every row checked against the float32 reference (rel 1e-2, LSE_TOL; ``rel_err`` the norm-wise
error), against the float32-partials output (``vs_f32``: max |diff|) and a re-run (a race);
timed as a Python call (launch shield) and as a replay of one captured call (the replay's
output equal to the eager one). CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab49.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import capture_graph, time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
SHAPES = [("fp8_ds_mla", b) for b in (1, 2, 4, 8, 16, 32)] + [("bf16", b) for b in (4, 32)]
import backends.kernels.sparse_mla_decode  # noqa: F401  (the module, for sys.modules)
smd = sys.modules["backends.kernels.sparse_mla_decode"]
assert not callable(smd), "the combine's module, not the package's function"
ELEMS0 = smd._COMBINE_ELEMS
CASES = [(p, ELEMS0) for p in ("float32", "bfloat16", "float16")]
pools = {kv: Pool(128, 32768, 64, 576, 512, kv, dev, seed=7) for kv in ("fp8_ds_mla", "bf16")}
probs = {(kv, b): DecodeProblem.draw(pools[kv], b, 128, 2048, seed=8 + b + 128) for kv, b in SHAPES}
rows = []
for r in range(ROUNDS):
    for (kv, b), prob in probs.items():
        pool = pools[kv]
        smd._COMBINE_ELEMS = ELEMS0
        ref32 = ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512,
                                       split_partials="float32")[0].float().clone()
        for case in [None] + CASES:
            if case is None:
                name = "flashmla"
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                part, elems = case
                name = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[part]
                smd._COMBINE_ELEMS = elems
                fn = lambda p=part: ws.sparse_mla_decode_ws(
                    prob.q, pool.cache, prob.indices, SM_SCALE, 512, split_partials=p)[:2]
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out, 1e-2, LSE_TOL[kv])
            vs = (out[0].float() - ref32).abs().max().item() if case else float("nan")
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
        smd._COMBINE_ELEMS = ELEMS0
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
# summary: our time / FlashMLA's (its median over the rounds), each round, per mode
print("\nsummary: ratio per round (µs of round 1)")

names = ["f32", "bf16", "f16"]
print(f"{'kv':10} {'B':>3} {'mode':6} " + " ".join(f"{n:>16}" for n in names))
for kv, b in probs:
    for mode in ("graph", "eager"):
        fl = fm[(kv, b, mode)]
        ref = sorted(fl)[len(fl) // 2]
        cells = []
        for n in names:
            ts = [row[4] for row in rows if row[:4] == (kv, b, n, mode)]
            bad = any(row[9] != "ok" for row in rows if row[:4] == (kv, b, n, mode))
            cells.append(("BAD " if bad else "") + "/".join(f"{t / ref:.3f}" for t in ts) + f" {ts[0]:.1f}")
        print(f"{kv:10} {b:>3} {mode:6} " + " ".join(f"{c:>16}" for c in cells))
