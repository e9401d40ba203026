#!/bin/bash
# Device call d3: the asymmetric consumers for fp8 rows in the transposed 16- / 32-head
# programs too (_consumer_ta0 / _consumer_ta1, on), the epilogue helpers shared: a smoke test
# under a timeout (16, 32 and 128 heads), the GPU tests of both decode kernels,
# scripts/ws_ab20.py (transposed symmetric / asymmetric; split counts at B2-B8), then the
# attention bench (--tune).
set -u
mkdir -p $OUT
SECONDS=0
timeout 90 python3 - > $OUT/smoke.txt 2>&1 <<'PY'
import torch
from backends.kernels import sparse_mla_decode_ws as ws
from backends.kernels.kv_format import make_kv_cache
from harness.reference import sparse_mla_decode_ref
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(3)
kv = (torch.randn(5000, 576, generator=g, device=dev) * 2).to(torch.bfloat16)
cache = make_kv_cache(kv, "fp8_ds_mla", d_nope=512)
for h, b, k, splits in ((16, 2, 256, 1), (32, 3, 700, 2), (16, 4, 64, 1), (128, 3, 700, 2)):
    q = torch.randn(b, h, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, 5000, (b, k), generator=g, device=dev, dtype=torch.int32)
    out, lse, info = ws.sparse_mla_decode_ws(q, cache, idx, 576 ** -0.5, 512, num_splits=splits)
    torch.cuda.synchronize()
    ro, rl = sparse_mla_decode_ref(q, cache, idx, 576 ** -0.5, 512)
    print(h, b, k, splits, "rel", ((out.float() - ro).norm() / ro.norm()).item(),
          "lse", (lse - rl).abs().max().item(), "spills", info.n_spills, flush=True)
PY
echo "smoke rc=$? s=$SECONDS"; cat $OUT/smoke.txt | tail -5
S=$SECONDS
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04d/scripts/ws_ab20.py > $OUT/ws_ab20.txt 2>&1
echo "ws_ab20 rc=$? s=$((SECONDS-S))"
tail -60 $OUT/ws_ab20.txt
S=$SECONDS
timeout 120 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A14 "fastest correct variant" $OUT/bench.txt | head -15
echo "total s=$SECONDS"
