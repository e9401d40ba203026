#!/bin/bash
# Device call d5: the split combine merged inside the decode (_FUSED_COMBINE, on): a smoke test
# under a timeout (a program waiting for a split that never comes would hang), the GPU tests of
# both decode kernels, scripts/ws_ab22.py (fused / combine kernel at B1-B8), the attention
# bench (--tune) at all seven shapes, one harness point per attention kernel (three backends).
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
kv = (torch.randn(20000, 576, generator=g, device=dev) * 2).to(torch.bfloat16)
cache = make_kv_cache(kv, "fp8_ds_mla", d_nope=512)
for b, k, splits in ((4, 2048, 16), (2, 2048, None), (8, 2048, None), (1, 2048, None), (3, 700, 4)):
    q = torch.randn(b, 128, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, 20000, (b, k), generator=g, device=dev, dtype=torch.int32)
    for rep in range(3):
        out, lse, info = ws.sparse_mla_decode_ws(q, cache, idx, 576 ** -0.5, 512, num_splits=splits)
        torch.cuda.synchronize()
    ro, rl = sparse_mla_decode_ref(q, cache, idx, 576 ** -0.5, 512)
    print(b, k, info.num_splits, "rel", ((out.float() - ro).norm() / ro.norm()).item(),
          "lse", (lse - rl).abs().max().item(), flush=True)
PY
echo "smoke rc=$? s=$SECONDS"; cat $OUT/smoke.txt | tail -6
S=$SECONDS
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 150 python3 results/h200-2026-12-04d/scripts/ws_ab22.py > $OUT/ws_ab22.txt 2>&1
echo "ws_ab22 rc=$? s=$((SECONDS-S))"
tail -31 $OUT/ws_ab22.txt
S=$SECONDS
timeout 150 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A16 "fastest correct variant" $OUT/bench.txt | head -17
S=$SECONDS
timeout 110 python3 -m harness -m attention_kernel=triton,triton_ws top_k=2048 steps=6 \
  hydra.sweep.dir=$OUT/harness > $OUT/harness.txt 2>&1
echo "harness rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
from harness import results
df = results.load(os.path.join(os.environ["OUT"], "harness"))
cols = [c for c in ("backend", "attention_kernel", "status", "latency_us_median", "stage_attention_us") if c in df]
print(df[cols].sort_values(["backend", "attention_kernel"]).to_string(index=False))
PY
echo "total s=$SECONDS"
