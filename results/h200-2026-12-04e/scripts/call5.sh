#!/bin/bash
# Device call e5: the CUDA resolve as the hisparse backend's default (hisparse.resolve_kernel=auto):
# the GPU tests (CUDA resolve, coordinator, end to end), the harness's hisparse point at the dsv32
# defaults with each resolve, eager and CUDA-graph replay (a ctypes launch captured in a graph), and
# the swap-in beside SGLang's kernel.
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist tests/test_swap_in_cuda.py tests/test_hisparse_coordinator.py tests/test_gpu_end_to_end.py \
  > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 150 python3 -m harness -m backend=hisparse hisparse.resolve_kernel=triton,cuda timing.cuda_graph=false,true top_k=2048 steps=6 \
  hydra.sweep.dir=$OUT/harness > $OUT/harness.txt 2>&1
echo "harness rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
import pandas as pd
from harness import results
df = results.load(os.path.join(os.environ["OUT"], "harness"))
cols = [c for c in ("resolve_kernel", "cuda_graph", "status", "latency_us_median", "stage_swap_in_us", "stage_attention_us", "misses", "error") if c in df]
pd.set_option("display.width", 200)
print(df[cols].to_string(index=False))
PY
S=$SECONDS
timeout 150 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
import pandas as pd
df = pd.read_parquet(os.path.join(os.environ["OUT"], "swap_in_peer", "result.parquet"))
df = df[df["variant"].astype(str).isin(["upstream", "upstream cuda", "upstream cuda w16"]) | df["kernel"].astype(str).str.startswith("sglang")]
cols = [c for c in ("case", "batch", "kernel", "variant", "status", "latency_us_median", "latency_us_p10", "latency_us_p90", "misses") if c in df]
pd.set_option("display.width", 200)
print(df[cols].to_string(index=False))
PY
echo "total s=$SECONDS"
