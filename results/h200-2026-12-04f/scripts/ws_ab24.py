"""The output / split partials stored through shared memory, 16-byte vectors a thread along a
row (``ws._STAGED_STORE = True``) against stores from the accumulator's layout (``False``):
both row formats at B128 H128, B128 H16 (transposed programs) and B1-B8 H128 (split calls).
FlashMLA in the same process; top_k 2048. Every row checked against the float32 reference
(rel 1e-2, LSE_TOL; ``rel_err`` printed) and the staged variant against the unstaged one
(``vs_off``: must be 0, the same values stored another way), re-run 5 times for a race
(``race``: max abs difference). CUDA events, L2 flushed, median of 30; interleaved rounds.
Usage: python3 ws_ab24.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
for kv in ("fp8_ds_mla", "bf16"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    shapes = [(128, 128), (128, 16), (8, 128), (4, 128), (2, 128), (1, 128)]
    probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
    for r in range(ROUNDS):
        for (b, h), prob in probs.items():
            ref = None
            for name, v in [("flashmla", None), ("direct", False), ("staged", True)]:
                if v is None:
                    fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
                else:
                    ws._STAGED_STORE = v
                    fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
                out = fn()
                torch.cuda.synchronize()
                chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
                vs = float("nan") if ref is None or v is None else \
                    (out[0].float() - ref.float()).abs().max().item()
                if v is not None and ref is None:
                    ref = out[0]
                race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
                t = time_fn(fn, dev, warmup=5, repeats=30)
                extra = "" if v is None else f"splits={out[2].num_splits}"
                rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                             "BAD" if chk.failure() else "ok", vs, race, extra))
    del pool, probs
    torch.cuda.empty_cache()
ws._STAGED_STORE = True

print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':10} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_off':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:10} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f} {r[11]}")
