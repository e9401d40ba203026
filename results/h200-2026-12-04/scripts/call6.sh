#!/bin/bash
# Device call 6: the GPU tests of the ws kernel with the producer's copies arriving on the
# stage barriers, then scripts/ws_ab5.py (that against the producer waiting for them).
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | tail -12
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04/scripts/ws_ab5.py > $OUT/ws_ab5.txt 2>&1
echo "ws_ab5 rc=$? s=$((SECONDS-S))"
tail -40 $OUT/ws_ab5.txt
