#!/bin/bash
# Device call 1: the GPU tests of the ws kernel with the fp8 rows of the next tile dequantized
# while the PV MMA runs (64-head programs), then scripts/ws_ab7.py (PV chunks x dequantization
# step against the module at 66489ac, FlashMLA in the same process).
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04b/scripts/ws_ab7.py 2 > $OUT/ws_ab7.txt 2>&1
echo "ws_ab7 rc=$? s=$((SECONDS-S))"
tail -45 $OUT/ws_ab7.txt
echo "total s=$SECONDS"
