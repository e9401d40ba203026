#!/bin/bash
# Device call e6: e5's GPU tests timed out inside test_gpu_end_to_end (240 s limit for three
# files); the end-to-end GPU tests (hisparse now resolving with the CUDA kernel by default) and
# the CUDA resolve's tests alone; one hisparse point with the default resolve (auto) and the
# warp-specialised attention.
set -u
mkdir -p $OUT
SECONDS=0
timeout 330 python3 -m pytest -q -p no:xdist tests/test_gpu_end_to_end.py tests/test_swap_in_cuda.py \
  > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 60 python3 -m harness backend=hisparse attention_kernel=triton_ws top_k=2048 steps=6 \
  hydra.run.dir=$OUT/harness > $OUT/harness.txt 2>&1
echo "harness rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
from harness import results
df = results.load(os.path.join(os.environ["OUT"], "harness"))
cols = [c for c in ("resolve_kernel", "attention_kernel", "status", "latency_us_median", "stage_swap_in_us", "stage_attention_us") if c in df]
print(df[cols].to_string(index=False))
PY
echo "total s=$SECONDS"
