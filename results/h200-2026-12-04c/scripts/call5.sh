#!/bin/bash
# Device call c5: the paired 16-head fp8 consumers (ws._PAIRED_FP8_16): the new GPU test first
# (stops the call if it fails), then all ws GPU tests, then scripts/ws_ab13.py.
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
SECONDS=0
timeout 120 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py -k paired > $OUT/gpu_tests_paired.txt 2>&1
rc=$?
echo "paired test rc=$rc s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests_paired.txt | tail -12
if [ $rc -ne 0 ]; then tail -60 $OUT/gpu_tests_paired.txt; exit 0; fi
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04c/scripts/ws_ab13.py > $OUT/ws_ab13.txt 2>&1
echo "ws_ab13 rc=$? s=$((SECONDS-S))"
tail -24 $OUT/ws_ab13.txt
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "ws gpu tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -6
