"""One call each of the ws decode (the wave model's splits) and FlashMLA at B2 / B4 / B8, H128,
top_k 2048, fp8_ds_mla rows, inside an NVTX range ``prof`` (for Nsight Compute's
``--nvtx-include prof/``): every kernel of both calls (decode, combine; FlashMLA's scheduler
metadata too) is profiled, each replayed with its caches flushed. The outputs are checked
against the float32 reference outside the range.
Usage: ncu --nvtx --nvtx-include prof/ ... python3 ncu_small.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
pool = Pool(128, 32768, 64, 576, 512, "fp8_ds_mla", dev, seed=7)
for b in (2, 4, 8):
    prob = DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128)
    calls = {"ws": lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512),
             "flashmla": lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)}
    for name, fn in calls.items():
        fn()                                  # compile / plan outside the range
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
        out = fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        chk = prob.check_attention(out[:2], 1e-2, LSE_TOL["fp8_ds_mla"])
        print(f"B{b} {name}: {'BAD' if chk.failure() else 'ok'} rel {chk.max_rel_err:.2e}", flush=True)
