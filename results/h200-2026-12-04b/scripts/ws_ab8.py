"""A/B of the ws kernel's fp8 stage layout (``ws._RAW_SWIZZLE``): the rows as stored in a
swizzled, group-major layout (16-byte vectors XORed by token) read by the consumers 8 tokens x
64 bytes a warp (so the bf16 tile's stores hit one 128-byte column block of 8 rows), against
the unswizzled rows read one token x 512 bytes a warp (whose stores hit the same offsets of 8
column blocks: predicted 2-way bank conflicts on the dequantization's stores). fp8_ds_mla rows,
B128 top_k 2048 at 128 and 16 heads, B8 and B2 at 128; FlashMLA in the same process. Every row
checked against the float32 reference (rel 1e-2, lse 2e-2) and against the unswizzled output
(max |diff|: 0 expected), re-run 5 times for a race; CUDA events, L2 flushed, median of 30;
two interleaved rounds.
Usage: python3 ws_ab8.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
kv = "fp8_ds_mla"
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
probs = {(b, h): DecodeProblem.draw(pool, b, h, 2048, seed=8 + b + h)
         for b, h in ((128, 128), (128, 16), (8, 128), (2, 128))}
for rnd in range(2):
    for (b, h), prob in probs.items():
        q = prob.q
        if padded_heads(h) != h:
            q = prob.q.new_zeros((b, padded_heads(h), 576))
            q[:, :h] = prob.q
        fns = [("flashmla", None, lambda q=q: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
        for sw in (False, True):
            fns.append((f"swizzle_{sw}", sw, lambda: ws.sparse_mla_decode_ws(
                prob.q, pool.cache, prob.indices, SM_SCALE, 512)))
        ref = None
        for name, sw, fn in fns:
            if sw is not None:
                ws._RAW_SWIZZLE = sw
            out = fn()
            torch.cuda.synchronize()
            o = out[0][:, :h]
            chk = prob.check_attention((o, out[1][:, :h]), 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or sw is None else (o.float() - ref.float()).abs().max().item()
            if sw is False:
                ref = o
            race = max((fn()[0][:, :h].float() - o.float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race))
ws._RAW_SWIZZLE = True
print(f"{'B':>4} {'H':>4} {'variant':14} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} "
      f"{'check':5} {'vs_off':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:>4} {r[1]:>4} {r[2]:14} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[7]:5} {r[8]:8.1e} {r[9]:8.1e} {r[3] / fm[(r[0], r[1])]:6.3f}")
