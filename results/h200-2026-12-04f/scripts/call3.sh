#!/bin/bash
# Device call f3: the staged store for the bf16 output only (split partials from the
# accumulator, as before f2): GPU tests of both decode kernels and end to end; the attention
# bench (--tune) at the seven shapes; split counts at B2-B8 fp8 (ws_splits25.py); one harness
# point per attention kernel. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 270 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py tests/test_gpu_end_to_end.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 150 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A16 "fastest correct variant" $OUT/bench.txt | head -17
S=$SECONDS
timeout 90 python3 results/h200-2026-12-04f/scripts/ws_splits25.py 2 > $OUT/ws_splits25.txt 2>&1
echo "splits rc=$? s=$((SECONDS-S))"; tail -43 $OUT/ws_splits25.txt
S=$SECONDS
timeout 60 python3 -m harness -m attention_kernel=triton_ws top_k=2048 steps=6 \
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
