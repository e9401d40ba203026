"""The dequantization step of the ws kernel with the swizzled fp8 stages (call 5's layout):
``ws._DEQ_ROWS`` 16 / 32 / 64 rows at a time (64-head programs; B128 and B8 at 128 heads) and
``ws._DEQ_ROWS_T`` 32 / 64 (16-head programs; B128 at 16 heads). fp8_ds_mla rows, top_k 2048,
FlashMLA in the same process. Every row checked against the float32 reference (rel 1e-2, lse
2e-2) and against the current default's output (max |diff|: 0 expected), re-run 5 times for a
race; CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab9.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
kv = "fp8_ds_mla"
D64, DT = ws._DEQ_ROWS, ws._DEQ_ROWS_T
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
CASES = {(128, 128): [("deq32", (32, DT)), ("deq16", (16, DT)), ("deq64", (64, DT))],
         (8, 128): [("deq32", (32, DT)), ("deq16", (16, DT)), ("deq64", (64, DT))],
         (128, 16): [("deqT64", (D64, 64)), ("deqT32", (D64, 32))]}
probs = {bh: DecodeProblem.draw(pool, bh[0], bh[1], 2048, seed=8 + sum(bh)) for bh in CASES}
for rnd in range(2):
    for (b, h), prob in probs.items():
        q = prob.q
        if padded_heads(h) != h:
            q = prob.q.new_zeros((b, padded_heads(h), 576))
            q[:, :h] = prob.q
        fns = [("flashmla", None, lambda q=q: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
        for name, setting in CASES[(b, h)]:
            fns.append((name, setting, lambda: ws.sparse_mla_decode_ws(
                prob.q, pool.cache, prob.indices, SM_SCALE, 512)))
        ref = None
        for name, setting, fn in fns:
            if setting is not None:
                ws._DEQ_ROWS, ws._DEQ_ROWS_T = setting
            out = fn()
            torch.cuda.synchronize()
            o = out[0][:, :h]
            chk = prob.check_attention((o, out[1][:, :h]), 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or setting is None else (o.float() - ref.float()).abs().max().item()
            if setting is not None and ref is None:
                ref = o
            race = max((fn()[0][:, :h].float() - o.float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race,
                         out[2].n_spills if len(out) > 2 else None))
ws._DEQ_ROWS, ws._DEQ_ROWS_T = D64, DT
print(f"{'B':>4} {'H':>4} {'variant':9} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} "
      f"{'check':5} {'vs_def':>8} {'race':>8} {'spills':>6} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:>4} {r[1]:>4} {r[2]:9} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[7]:5} {r[8]:8.1e} {r[9]:8.1e} {str(r[10]):>6} {r[3] / fm[(r[0], r[1])]:6.3f}")
