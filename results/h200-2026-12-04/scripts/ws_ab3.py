"""Third A/B of the ws kernel, fp8_ds_mla rows (FlashMLA in the same process): the rows the
consumers dequantize at a time (``ws._DEQ_ROWS``), the rows of the next tile they dequantize
into registers while the PV MMA runs (``ws._DEQ_AHEAD``), and the producer's registers
(``ws._PRODUCER_REGS``: 40 gives the consumers 232 instead of 224), at B128 / B8 / B2 H128
top_k 2048 (raw scales). Every row checked against the float32 reference first; CUDA events,
L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab3.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

VARIANTS = [(16, 0, 48), (32, 0, 48), (64, 0, 48), (16, 16, 48), (16, 32, 48), (32, 32, 48),
            (16, 16, 40), (16, 32, 40), (32, 32, 40), (32, 0, 40)]
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
kv = "fp8_ds_mla"
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
probs = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=30 + b) for b in (128, 8, 2)}
for rnd in range(2):
    for b, prob in probs.items():
        fns = [("flashmla", lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
        for deq_rows, ahead, preg in VARIANTS:
            def fn(deq_rows=deq_rows, ahead=ahead, preg=preg):
                ws._DEQ_ROWS, ws._DEQ_AHEAD, ws._PRODUCER_REGS[kv] = deq_rows, ahead, preg
                return ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            fns.append((f"r{deq_rows}_a{ahead}_p{preg}", fn))
        for name, fn in fns:
            out = fn()
            torch.cuda.synchronize()
            err = ((out[0].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
            lse_err = (out[1] - prob.ref_lse).abs().max().item()
            t = time_fn(fn, dev, warmup=5, repeats=30)
            rows.append((b, name, t.median_us, t.p10_us, t.p90_us, err, lse_err))
print(f"{'B':>4} {'variant':14} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'lse_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[1] == "flashmla":
        fm[r[0]] = r[2]
    print(f"{r[0]:>4} {r[1]:14} {r[2]:9.1f} {r[3]:7.1f} {r[4]:7.1f} {r[5]:8.2e} {r[6]:8.2e} {r[2] / fm[r[0]]:6.3f}")
