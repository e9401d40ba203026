#!/bin/bash
# Device call c12: transposed programs with two consumer partitions splitting the dims
# (ws._TK, on): the ws GPU tests, then scripts/ws_ab17.py.
set -u
mkdir -p $OUT
SECONDS=0
timeout 120 python3 -m pytest -q -p no:xdist -x -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
rc=$?
echo "ws gpu tests rc=$rc s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -6
if [ $rc -ne 0 ]; then tail -40 $OUT/gpu_tests.txt; exit 0; fi
S=$SECONDS
timeout 150 python3 results/h200-2026-12-04c/scripts/ws_ab17.py > $OUT/ws_ab17.txt 2>&1
echo "ws_ab17 rc=$? s=$((SECONDS-S))"
tail -32 $OUT/ws_ab17.txt
