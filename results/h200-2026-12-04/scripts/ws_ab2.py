"""Second A/B of the ws kernel (FlashMLA in the same process): (1) fp8_ds_mla rows at B128
H128 top_k 2048: the producer's slot ids from shared memory or global loads
(``ws._IDS_AHEAD``) and the rows the consumers dequantize at a time (``ws._DEQ_ROWS`` 8 / 16 /
32); bf16 rows with the ids from shared memory again; (2) the TP8 shape B128 H16 top_k 2048,
both formats: heads padded to one 64-head program; (3) fp8 rows at B2 / B4 / B8 H128: the split
count (the wave model's, half and twice). Every row checked against the float32 reference
first; CUDA events, L2 flushed, median of 30; two interleaved rounds.
Usage: python3 ws_ab2.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from backends.kernels.sparse_mla_decode import choose_num_splits
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []


def timed(kv, shape, name, fn, prob):
    out = fn()
    torch.cuda.synchronize()
    h = prob.q.shape[1]
    err = ((out[0][:, :h].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
    t = time_fn(fn, dev, warmup=5, repeats=30)
    rows.append((kv, shape, name, t.median_us, t.p10_us, t.p90_us, err))


def flashmla(prob, pool):
    b, h, d = prob.q.shape
    q = prob.q
    if padded_heads(h) != h:
        q = prob.q.new_zeros((b, padded_heads(h), d))
        q[:, :h] = prob.q
    return lambda: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512)


def ours(prob, pool, **kw):
    return lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512, **kw)


for kv in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    p128 = DecodeProblem.draw(pool, 128, 128, 2048, seed=9)
    p16 = DecodeProblem.draw(pool, 128, 16, 2048, seed=10)
    small = {b: DecodeProblem.draw(pool, b, 128, 2048, seed=20 + b) for b in (2, 4, 8)} \
        if kv == "fp8_ds_mla" else {}
    for rnd in range(2):
        timed(kv, "B128_H128", "flashmla", flashmla(p128, pool), p128)
        if kv == "bf16":
            timed(kv, "B128_H128", "ws", ours(p128, pool), p128)
        else:
            for ahead in (False, True):
                for deq_rows in (8, 16, 32):
                    if ahead and deq_rows != 16:
                        continue
                    ws._IDS_AHEAD[kv], ws._DEQ_ROWS = ahead, deq_rows
                    timed(kv, "B128_H128", f"ids{'smem' if ahead else 'ldg'}_deq{deq_rows}",
                          ours(p128, pool), p128)
            ws._IDS_AHEAD[kv], ws._DEQ_ROWS = False, 16
        timed(kv, "B128_H16", "flashmla", flashmla(p16, pool), p16)
        timed(kv, "B128_H16", "ws", ours(p16, pool), p16)
        for b, prob in small.items():
            timed(kv, f"B{b}_H128", "flashmla", flashmla(prob, pool), prob)
            auto = choose_num_splits(b, 128, 2048)
            for s in (auto // 2, auto, auto * 2):
                timed(kv, f"B{b}_H128", f"ws_split{s}", ours(prob, pool, num_splits=s), prob)
    del pool, p128, p16, small
    torch.cuda.empty_cache()
print(f"{'kv':11} {'shape':10} {'variant':16} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:10} {r[2]:16} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} "
          f"{r[3] / fm[(r[0], r[1])]:6.3f}")
