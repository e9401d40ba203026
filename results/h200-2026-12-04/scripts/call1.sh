#!/bin/bash
# Device call 1: the GPU tests owed from the previous session (and of the producer's slot ids
# from shared memory), then scripts/ws_ab.py: the ws kernel against its 0565d72 form and the
# fp8 dequantization variants, FlashMLA in the same process.
set -u
mkdir -p $OUT
SECONDS=0
timeout 280 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_sparse_mla_decode.py tests/test_gpu_end_to_end.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 290 python3 results/h200-2026-12-04/scripts/ws_ab.py 2 > $OUT/ws_ab.txt 2>&1
echo "ws_ab rc=$? s=$((SECONDS-S))"
tail -60 $OUT/ws_ab.txt
echo "total s=$SECONDS"
