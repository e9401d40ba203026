#!/bin/bash
# Device call c10 (final code of this session, after c9: the transposed PV by V dims; the split combine loading every split at once, the transposed consumers issuing the rope part first): the GPU tests of both decode
# kernels; the attention bench against FlashMLA (--tune: default, h64, ws) at B128 with 128,
# 16 and 32 heads and at B1-B8; one harness point per attention kernel (three backends, dsv32
# defaults: batch 32, 32K context, fp8 rows);
# then scripts/ws_ab16.py (fp8 rows at 32 heads: transposed or padded).
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 150 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A16 "fastest correct variant" $OUT/bench.txt | head -17
S=$SECONDS
timeout 100 python3 -m harness -m attention_kernel=triton,triton_ws top_k=2048 steps=6 \
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
S=$SECONDS
timeout 100 python3 results/h200-2026-12-04c/scripts/ws_ab16.py > $OUT/ws_ab16.txt 2>&1
echo "ws_ab16 rc=$? s=$((SECONDS-S))"
tail -7 $OUT/ws_ab16.txt
