#!/bin/bash
# Device call 8: the GPU tests of the ws kernel with the producer converting the last 16 rows of
# each fp8 tile (64-head programs, 2 stages), then scripts/ws_ab10.py (0 / 16 / 32 rows).
set -u
mkdir -p $OUT
SECONDS=0
timeout 85 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 75 python3 results/h200-2026-12-04b/scripts/ws_ab10.py > $OUT/ws_ab10.txt 2>&1
echo "ws_ab10 rc=$? s=$((SECONDS-S))"
tail -14 $OUT/ws_ab10.txt
