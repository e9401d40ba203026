#!/bin/bash
# Device call 5: the GPU tests of the ws kernel (transposed consumers for 16 / 32 heads, fp8
# rows dequantized 32 rows at a time), then scripts/ws_ab4.py (few heads against FlashMLA).
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | tail -12
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04/scripts/ws_ab4.py > $OUT/ws_ab4.txt 2>&1
echo "ws_ab4 rc=$? s=$((SECONDS-S))"
tail -30 $OUT/ws_ab4.txt
