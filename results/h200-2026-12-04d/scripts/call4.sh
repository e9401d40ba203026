#!/bin/bash
# Device call d4: the producer issuing the first tiles' copies before the query block has landed
# (_Q_EARLY, on): the GPU tests of both decode kernels, then scripts/ws_ab21.py (on / off, both
# row formats; a small batch's time split into decode and combine).
set -u
mkdir -p $OUT
SECONDS=0
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 240 python3 results/h200-2026-12-04d/scripts/ws_ab21.py > $OUT/ws_ab21.txt 2>&1
echo "ws_ab21 rc=$? s=$((SECONDS-S))"
tail -52 $OUT/ws_ab21.txt
echo "total s=$SECONDS"
