"""The ws decode (wave-model splits) and FlashMLA at B2 / B4 / B8, H128, top_k 2048, fp8_ds_mla
rows, each called 20 times back to back after an L2 flush (a 256 MB write) per call, inside NVTX
ranges named ``{name}_B{b}`` for a timeline (Nsight Systems: the gap between a decode and its
combine, each kernel's duration at the clocks the run had). Outputs checked first.
Usage: nsys profile ... python3 trace_small.py"""
import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool

dev = torch.device("cuda")
fmla = flashmla_attention(dev)
pool = Pool(128, 32768, 64, 576, 512, "fp8_ds_mla", dev, seed=7)
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
for b in (2, 4, 8):
    prob = DecodeProblem.draw(pool, b, 128, 2048, seed=8 + b + 128)
    calls = {"ws": lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512),
             "flashmla": lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)}
    for name, fn in calls.items():
        out = fn()
        torch.cuda.synchronize()
        chk = prob.check_attention(out[:2], 1e-2, LSE_TOL["fp8_ds_mla"])
        print(f"B{b} {name}: {'BAD' if chk.failure() else 'ok'} rel {chk.max_rel_err:.2e}", flush=True)
        torch.cuda.nvtx.range_push(f"{name}_B{b}")
        for _ in range(20):
            flush.fill_(1)
            torch.cuda._sleep(20000)           # the launches queue behind a spin, as the bench's shield
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
