#!/bin/bash
# Device call f9: the suite's non-GPU tests on the GPU machine (CUDA present, so no Triton
# interpreter): which of them assume a machine without CUDA. Run from the repository root after
# the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"; echo "xdist: ${N:-none}"
timeout 170 python3 -m pytest -q -m "not gpu" $N -p no:cacheprovider tests > $OUT/cpu_tests_on_gpu.txt 2>&1
echo "rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/cpu_tests_on_gpu.txt | tail -25
