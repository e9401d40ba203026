"""fp8_ds_mla dequantization in the ws kernel: through float32 (``ws._DEQ_BF16 = False``: cvt
e4m3x2 -> f16x2, f16 -> f32, fmul, pack to bf16) or by bit moves and one bf16x2 multiply a pair
(``True``), each with the rows dequantized at a time (``ws._DEQ_ROWS`` for 64-head programs,
``ws._DEQ_ROWS_T`` for 16- / 32-head ones). FlashMLA in the same process. B128 top_k 2048 at
128, 16 and 32 heads and B1-B8 at 128 heads, raw scales (vLLM's cache writer). Every row
checked against the float32 reference (rel 1e-2, LSE_TOL) and against the variant ``cvt32``
(rel), re-run 5 times for a race; CUDA events, L2 flushed, median of 30; two interleaved
rounds. Then, on power-of-two scales (FlashMLA's quantizer), the two dequantizations must give
bit-identical outputs (max |diff| printed).
Usage: python3 ws_ab18.py [ROUNDS]"""
import sys

import torch

from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.flashmla_peer import flashmla_attention
from backends.kernels.kv_format import make_kv_cache
from harness.bench.attention import LSE_TOL, SM_SCALE, DecodeProblem, Pool
from harness.timing import time_fn

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
dev = torch.device("cuda")
fmla = flashmla_attention(dev)
kv = "fp8_ds_mla"
pool = Pool(128, 32768, 64, 576, 512, kv, dev, seed=7)
shapes = [(128, 128), (128, 16), (128, 32), (8, 128), (4, 128), (2, 128), (1, 128)]
probs = {s: DecodeProblem.draw(pool, s[0], s[1], 2048, seed=8 + s[0] + s[1]) for s in shapes}
rows = []
for r in range(ROUNDS):
    for (b, h), prob in probs.items():
        variants = [("flashmla", None)]
        for deq in ("cvt", "bf16"):
            for n in ((32, 64) if h == 128 else (32, 64)):
                variants.append((f"{deq}{n}", (deq == "bf16", n)))
        ref = None
        for name, v in variants:
            if v is None:
                fn = lambda: fmla(prob.q, pool.cache, prob.indices, SM_SCALE, d_v=512)
            else:
                ws._DEQ_BF16 = v[0]
                if h == 128:
                    ws._DEQ_ROWS = v[1]
                else:
                    ws._DEQ_ROWS_T = v[1]
                fn = lambda: ws.sparse_mla_decode_ws(prob.q, pool.cache, prob.indices, SM_SCALE, 512)
            out = fn()
            torch.cuda.synchronize()
            chk = prob.check_attention(out[:2], 1e-2, LSE_TOL[kv])
            vs = float("nan") if ref is None or v is None else \
                ((out[0].float() - ref.float()).norm() / ref.float().norm()).item()
            if name == "cvt32":
                ref = out[0]
            race = max((fn()[0].float() - out[0].float()).abs().max().item() for _ in range(5))
            t = time_fn(fn, dev, warmup=5, repeats=30)
            extra = "" if v is None else f"spills={out[2].n_spills}"
            rows.append((kv, b, h, name, t.median_us, t.p10_us, t.p90_us, chk.max_rel_err,
                         "BAD" if chk.failure() else "ok", vs, race, extra))
ws._DEQ_BF16, ws._DEQ_ROWS, ws._DEQ_ROWS_T = True, 32, 64

# power-of-two scales: both dequantizations give the same bits
g = torch.Generator(device=dev).manual_seed(11)
x = (torch.randn(8192, 576, generator=g, device=dev) *
     torch.logspace(-3, 1, 8192, device=dev)[:, None]).to(torch.bfloat16)
cache = make_kv_cache(x, kv, d_nope=512, scale_format="pow2")
for h in (128, 16):
    q = torch.randn(4, h, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, 8192, (4, 2048), generator=g, device=dev, dtype=torch.int32)
    outs = []
    for flag in (False, True):
        ws._DEQ_BF16 = flag
        outs.append(ws.sparse_mla_decode_ws(q, cache, idx, SM_SCALE, 512))
    print(f"pow2 scales H{h}: max |out diff| {(outs[0][0].float() - outs[1][0].float()).abs().max().item():.3e}"
          f"  max |lse diff| {(outs[0][1] - outs[1][1]).abs().max().item():.3e}")
ws._DEQ_BF16 = True

print(f"{'kv':11} {'B':>4} {'H':>4} {'variant':12} {'median_us':>9} {'p10':>7} {'p90':>7} "
      f"{'rel_err':>8} {'check':5} {'vs_cvt32':>8} {'race':>8} {'/fmla':>6}")
fm = {}
for r in rows:
    if r[3] == "flashmla":
        fm[(r[0], r[1], r[2])] = r[4]
    print(f"{r[0]:11} {r[1]:>4} {r[2]:>4} {r[3]:12} {r[4]:9.1f} {r[5]:7.1f} {r[6]:7.1f} "
          f"{r[7]:8.2e} {r[8]:5} {r[9]:8.1e} {r[10]:8.1e} {r[4] / fm[(r[0], r[1], r[2])]:6.3f} {r[11]}")
