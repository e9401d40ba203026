"""The ws kernel with the producer's copies arriving on the stage barriers (call 6's choice):
fp8_ds_mla rows with the producer's slot ids from shared memory or not (``ws._IDS_AHEAD``) at
B128 H128 and B128 H16 (3 stages), the transposed consumers' dequantization chunk
(``ws._DEQ_ROWS_T`` 32 / 64) at H16, and 32 heads (TP4) transposed against padded to 64
(``ws._T_MAX_HEADS``), both formats; FlashMLA in the same process (heads padded to 64 there).
Every row checked against the float32 reference first; CUDA events, L2 flushed, median of 30;
two rounds.
Usage: python3 ws_ab6.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
T_MAX = ws._T_MAX_HEADS
CASES = {  # (kv, H) -> [(name, settings, stages)]
    ("fp8_ds_mla", 128): [("ids_ldg", dict(ids=False), 2), ("ids_smem", dict(ids=True), 2)],
    ("fp8_ds_mla", 16): [(f"ids_{'smem' if ids else 'ldg'}_deq{r}", dict(ids=ids, deq_t=r), 3)
                         for ids in (False, True) for r in (32, 64)],
    ("fp8_ds_mla", 32): [("transposed", dict(t_max=T_MAX), 2), ("padded64", dict(t_max=0), 2)],
    ("bf16", 32): [("transposed", dict(t_max=T_MAX), 2), ("padded64", dict(t_max=0), 2)],
}


def apply(kv, ids=None, deq_t=32, t_max=T_MAX):
    ws._IDS_AHEAD[kv] = kv == "bf16" if ids is None else ids
    ws._DEQ_ROWS_T, ws._T_MAX_HEADS = deq_t, t_max


for kv in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {h: DecodeProblem.draw(pool, 128, h, 2048, seed=60 + h)
             for (k, h) in CASES if k == kv}
    for rnd in range(2):
        for h, prob in probs.items():
            q = prob.q
            if padded_heads(h) != h:
                q = prob.q.new_zeros((128, padded_heads(h), 576))
                q[:, :h] = prob.q
            fns = [("flashmla", None, lambda q=q: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
            for name, settings, st in CASES[(kv, h)]:
                fns.append((name, settings, lambda st=st: ws.sparse_mla_decode_ws(
                    prob.q, pool.cache, prob.indices, SM_SCALE, 512, stages=st)))
            for name, settings, fn in fns:
                if settings is not None:
                    apply(kv, **settings)
                out = fn()
                torch.cuda.synchronize()
                err = ((out[0][:, :h].float() - prob.ref_out).norm() / prob.ref_out.norm()).item()
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, f"B128_H{h}", name, t.median_us, t.p10_us, t.p90_us, err))
            apply(kv)
    del pool, probs
    torch.cuda.empty_cache()
print(f"{'kv':11} {'shape':10} {'variant':16} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:10} {r[2]:16} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[3] / fm[(r[0], r[1])]:6.3f}")
