#!/bin/bash
# Device call e2: the CUDA resolve (backends/kernels/swap_in_cuda.py, swap_in_resolve.cu: the
# upstream-order resolve with the selection in a shared-memory hash table): its GPU tests (against
# the model, and bit-equal to the Triton resolve at top_k 2048 / 4096 slots / B64), the Triton
# coordinator's tests on the GPU (regression), then the swap-in beside SGLang's kernel with the
# CUDA rows. Run after the device prefix with .whl/, .peer_build/ and .kernel_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist tests/test_swap_in_cuda.py tests/test_hisparse_coordinator.py \
  > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 200 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
import pandas as pd
df = pd.read_parquet(os.path.join(os.environ["OUT"], "swap_in_peer", "result.parquet"))
df = df[~df["variant"].astype(str).str.startswith("position")]
cols = [c for c in ("case", "batch", "kernel", "variant", "status", "latency_us_median", "latency_us_p10", "latency_us_p90", "misses") if c in df]
pd.set_option("display.width", 200)
print(df[cols].to_string(index=False))
PY
echo "total s=$SECONDS"
