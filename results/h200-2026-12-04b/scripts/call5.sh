#!/bin/bash
# Device call 5: the GPU tests of the ws kernel with the fp8 stages swizzled (ws._RAW_SWIZZLE,
# the new default), then scripts/ws_ab8.py (swizzled against unswizzled, FlashMLA beside).
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04b/scripts/ws_ab8.py > $OUT/ws_ab8.txt 2>&1
echo "ws_ab8 rc=$? s=$((SECONDS-S))"
tail -20 $OUT/ws_ab8.txt
echo "total s=$SECONDS"
