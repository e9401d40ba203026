#!/bin/bash
# Device call c9: the transposed consumers' PV MMA split by V dims (ws._PV_BY_DIMS, on): the ws
# GPU tests, then scripts/ws_ab15.py.
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
SECONDS=0
timeout 120 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
rc=$?
echo "ws gpu tests rc=$rc s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -6
if [ $rc -ne 0 ]; then tail -40 $OUT/gpu_tests.txt; exit 0; fi
S=$SECONDS
timeout 250 python3 results/h200-2026-12-04c/scripts/ws_ab15.py > $OUT/ws_ab15.txt 2>&1
echo "ws_ab15 rc=$? s=$((SECONDS-S))"
tail -32 $OUT/ws_ab15.txt
