#!/bin/bash
# Device call 9 (final code): the GPU tests of everything this session touched (the Triton
# decode's shared check/plan/combine, the ws kernel, the attention switch end to end, the host
# pools), then one harness point per attention kernel (ours, ours warp-specialised) for the
# three backends at the default dsv32 sizes, fp8 rows.
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode.py \
  tests/test_sparse_mla_decode_ws.py tests/test_gpu_end_to_end.py tests/test_host_memory.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 200 python3 -m harness -m attention_kernel=triton,triton_ws top_k=2048 steps=6 \
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
