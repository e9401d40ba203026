#!/bin/bash
# Device call 2: the GPU tests of the ws kernel (the producer's slot ids from shared memory for
# bf16 rows only, heads padded to 64-head programs), then scripts/ws_ab2.py.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 330 python3 results/h200-2026-12-04/scripts/ws_ab2.py > $OUT/ws_ab2.txt 2>&1
echo "ws_ab2 rc=$? s=$((SECONDS-S))"
tail -50 $OUT/ws_ab2.txt
echo "total s=$SECONDS"
