"""The ws kernel at few heads (FlashMLA in the same process, heads padded to 64 there): B128
top_k 2048 with 16 heads (a TP8 shard of DeepSeek-V3.2's 128) and 32 (TP4), both KV formats:
the transposed consumers (16- / 32-head programs, the default) against the 64-head programs
with the heads padded (``ws._T_MAX_HEADS = 0``), and fp8 rows at 3 stages. Every row checked
against the float32 reference first; CUDA events, L2 flushed, median of 30; two rounds.
Usage: python3 ws_ab4.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention, padded_heads
from harness.bench.attention import SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
rows = []
T_MAX = ws._T_MAX_HEADS
for kv in ("bf16", "fp8_ds_mla"):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    probs = {h: DecodeProblem.draw(pool, 128, h, 2048, seed=40 + h) for h in (16, 32)}
    for rnd in range(2):
        for h, prob in probs.items():
            q = prob.q.new_zeros((128, padded_heads(h), 576))
            q[:, :h] = prob.q
            fns = [("flashmla", None, lambda q=q: fmla(q, pool.cache, prob.indices, SM_SCALE, d_v=512))]
            for name, t_max, stages in (("transposed", T_MAX, 2), ("padded64", 0, 2)) + \
                    ((("transposed_s3", T_MAX, 3),) if kv != "bf16" and h == 16 else ()):
                fns.append((name, t_max, lambda stages=stages: ws.sparse_mla_decode_ws(
                    prob.q, pool.cache, prob.indices, SM_SCALE, 512, stages=stages)))
            for name, t_max, fn in fns:
                if t_max is not None:
                    ws._T_MAX_HEADS = t_max
                out = fn()
                torch.cuda.synchronize()
                o = out[0][:, :h].float()
                err = ((o - prob.ref_out).norm() / prob.ref_out.norm()).item()
                t = time_fn(fn, dev, warmup=5, repeats=30)
                rows.append((kv, h, name, t.median_us, t.p10_us, t.p90_us, err))
            ws._T_MAX_HEADS = T_MAX
    del pool, probs
    torch.cuda.empty_cache()
print(f"{'kv':11} {'H':>3} {'variant':14} {'median_us':>9} {'p10':>7} {'p90':>7} {'rel_err':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[2] == "flashmla":
        fm[(r[0], r[1])] = r[3]
    print(f"{r[0]:11} {r[1]:>3} {r[2]:14} {r[3]:9.1f} {r[4]:7.1f} {r[5]:7.1f} {r[6]:8.2e} {r[3] / fm[(r[0], r[1])]:6.3f}")
