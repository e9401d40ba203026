"""Two switches of the ws kernel, A/B beside FlashMLA in the same process:
``ws._ROPE_FIRST`` (the score MMA's rope part issued as soon as the stage has landed, before the
fp8 tile is dequantized, so it runs under the dequantization; bf16 rows: the same two MMAs in the
other order) and ``ws._PDL_COMBINE`` (the split combine launched as a programmatic dependent of
the decode, which triggers it first thing). Variants: base (neither), rope, pdl, both.
Shapes (top_k 2048): fp8_ds_mla B128 H128 / B128 H16 / B1, 2, 4, 8 H128; bf16 B128 H128 / B1, 2,
4, 8 H128. Every row is checked against the float32 reference (rel 1e-2, lse LSE_TOL), against
the base variant's output (rope: the K sum in another order, so not bit-identical; pdl: 0
expected) and re-run 5 times for a race; CUDA events, L2 flushed, median of 30; two interleaved
rounds. Diagnostic rows ``main_only`` (small batches: the decode without its combine, output not
checked) and ``combine`` (the combine alone on the decode's partials) say where the time goes.
Usage: python3 ws_ab11.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
VARIANTS = {"base": (False, False), "rope": (True, False), "pdl": (False, True),
            "both": (True, True)}
rows = []
real_combine = ws.combine_splits


def timed(kv, b, h, name, fn, prob, ref_out=None, check=True):
    out = fn()
    torch.cuda.synchronize()
    if check:
        chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
        rel, ok = chk.max_rel_err, ("BAD" if chk.failure() else "ok")
        vs = float("nan") if ref_out is None else (out[0].float() - ref_out.float()).abs().max().item()
        race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
    else:
        rel, ok, vs, race = float("nan"), "diag", float("nan"), float("nan")
    t = time_fn(fn, dev, warmup=5, repeats=30)
    rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, rel, ok, vs, race))
    return out[0]


for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    shapes = [(128, 128), (8, 128), (4, 128), (2, 128), (1, 128)]
    if kv == "fp8_ds_mla":
        shapes.insert(1, (128, 16))
    probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
    for r in range(ROUNDS):
        for (b, h), prob in probs.items():
            timed(kv, b, h, "flashmla",
                  lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512), prob)
            names = ("base", "rope") if b == 128 else tuple(VARIANTS)
            ref = None
            for v in names:
                ws._ROPE_FIRST, ws._PDL_COMBINE = VARIANTS[v]
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                o = timed(kv, b, h, v, fn, prob, ref)
                if v == "base":
                    ref = o
            if b < 128 and r == 0:
                # where the time goes: the decode alone (no combine) and the combine alone
                ws._ROPE_FIRST, ws._PDL_COMBINE = VARIANTS["base"]
                ws.combine_splits = lambda *a, **k: None
                try:
                    timed(kv, b, h, "main_only", lambda: ws.sparse_mla_decode_ws(
                        prob.q, pool.cache, prob.indices, SM_SCALE, 512), prob, check=False)
                finally:
                    ws.combine_splits = real_combine
                kept = {}

                def grab(part_o, part_lse, out, lse, pdl=False):
                    kept.update(args=(part_o, part_lse, out, lse))
                    real_combine(part_o, part_lse, out, lse)
                ws.combine_splits = grab
                try:
                    ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                finally:
                    ws.combine_splits = real_combine
                if kept:
                    a = kept["args"]
                    timed(kv, b, h, f"combine_s{a[0].shape[2]}",
                          lambda: (real_combine(*a), a[2:])[1], prob, check=False)
    del pool, probs
    torch.cuda.empty_cache()
ws._ROPE_FIRST, ws._PDL_COMBINE = True, True
print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':11} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_base':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:11} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f}")
