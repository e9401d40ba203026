"""The ws kernel's producer: its copies arriving on the stage's barrier when they land
(``ws._ASYNC_READY = True``: the next tile's copies go out at once) against the producer waiting
for them itself (False: one tile in flight), at B128 top_k 2048 with 128 and 16 heads and at
B8 H128, both KV formats (fp8 rows at 16 heads also at 3 stages), FlashMLA in the same process
(heads padded to 64 there). Every row checked against the float32 reference first; CUDA
events, L2 flushed, median of 30; two rounds.
Usage: python3 ws_ab5.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
for kv in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {(b, h): DecodeProblem.draw(pool, b, h, 2048, seed=50 + b + h)
             for b, h in ((128, 128), (128, 16), (8, 128))}
    for rnd in range(2):
        for (b, h), prob in probs.items():
            q = prob.q
            if padded_heads(h) != h:
                q = prob.q.new_zeros((b, padded_heads(h), 576))
                q[:, :h] = prob.q
            fns = [("flashmla", None, lambda q=q: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
            stage_opts = (2, 3) if (kv != "bf16" and h == 16) else (2,)
            for async_ready in (False, True):
                for st in stage_opts:
                    fns.append((f"{'async' if async_ready else 'wait'}_s{st}", async_ready,
                                lambda st=st: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices,
                                                                      SM_SCALE, 512, stages=st)))
            for name, async_ready, fn in fns:
                if async_ready is not None:
                    ws._ASYNC_READY = async_ready
                out = fn()
                torch.cuda.synchronize()
                err = ((out[0][:, :h].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, f"B{b}_H{h}", name, t.median_us, t.p10_us, t.p90_us, err))
            ws._ASYNC_READY = True
    del pool, probs
    torch.cuda.empty_cache()
print(f"{'kv':11} {'shape':10} {'variant':10} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:10} {r[2]:10} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[3] / fm[(r[0], r[1])]:6.3f}")
