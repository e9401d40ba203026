"""One ws decode call per shape, for Nsight Compute to profile (run under ncu; see call8.sh):
B128 top_k 2048, fp8_ds_mla rows at 128 and 16 heads and bf16 rows at 128 heads. Each shape is
called twice (compile, then the profiled launch) and checked against the reference first.
Usage: python3 ncu_ws.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool

dev = torch.device("cuda")
for kv, h in (("fp8_ds_mla", 128), ("fp8_ds_mla", 16), ("bf16", 128)):
    pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
    prob = DecodeProblem.draw(pool, 128, h, 2048, seed=9)
    out = ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
    torch.cuda.synchronize()
    chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
    print(kv, h, "check", "BAD" if chk.failure() else "ok", f"rel {chk.max_rel_err:.2e}", flush=True)
    ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
    torch.cuda.synchronize()
    del pool, prob
    torch.cuda.empty_cache()
