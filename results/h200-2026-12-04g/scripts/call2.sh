#!/bin/bash
# Device call g2: the ragged gather's stated row alignment (the tiny-rows GPU test, every launch
# blocking) and the split combine waiting row by row: GPU tests of both decode kernels, the
# extend step and end to end, then ws_ab29.py (row waits against the plain launch, FlashMLA
# beside). Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_extend.py > $OUT/extend_gpu.txt 2>&1
echo "extend GPU tests rc=$? s=$SECONDS"; grep -E "passed|failed|misaligned" $OUT/extend_gpu.txt | tail -4
S=$SECONDS
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_sparse_mla_decode.py tests/test_gpu_end_to_end.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04g/scripts/ws_ab29.py 2 > $OUT/ws_ab29.txt 2>&1
echo "ab29 rc=$? s=$((SECONDS-S))"; tail -67 $OUT/ws_ab29.txt
echo "total s=$SECONDS"
