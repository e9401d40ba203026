#!/bin/bash
# Device call g4: (1) the small-batch timeline again (kineto30.py, flush kernels found by name,
# FlashMLA's bf16 call included); (2) the tiny model end to end on CUDA, every backend, decode
# and extend, both of our attention kernels, every launch blocking (tiny's 392-byte fp8 rows,
# which no GPU run used before g1); (3) the CPU suite (`-m "not gpu"`, what CI runs) on the GPU
# machine: with the conftest's two suites it hides the GPUs and interprets, as on CI. Run from
# the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 results/h200-2026-12-04g/scripts/kineto30.py 20 > $OUT/kineto30.txt 2>&1
echo "kineto rc=$? s=$SECONDS"; grep -v -i warn $OUT/kineto30.txt | tail -36
S=$SECONDS
CUDA_LAUNCH_BLOCKING=1 timeout 200 python3 -m harness -m model=tiny device=cuda backend=all \
  phase=decode,extend attention_kernel=triton,triton_ws steps=3 timing.warmup_steps=1 report=false \
  hydra.sweep.dir=$OUT/tiny > $OUT/tiny_cuda.txt 2>&1
echo "tiny on CUDA rc=$? s=$((SECONDS-S))"; grep -i -E "misaligned|error|Traceback" $OUT/tiny_cuda.txt | head -5
python3 - <<'PY'
import os
from harness import results
df = results.load(os.path.join(os.environ["OUT"], "tiny"))
print(df[["phase", "attention_kernel", "backend", "status", "latency_us_median", "error"]]
      .to_string(max_colwidth=80))
PY
S=$SECONDS
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
timeout 240 python3 -m pytest -q -m "not gpu" $N -p no:cacheprovider tests > $OUT/cpu_suite.txt 2>&1
echo "CPU suite on the GPU machine rc=$? s=$((SECONDS-S))"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/cpu_suite.txt | tail -12
echo "total s=$SECONDS"
