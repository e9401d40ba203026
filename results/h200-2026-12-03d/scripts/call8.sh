#!/bin/bash
# Device call 8: fp8_ds_mla rows dequantized by the producer warpgroup again, now with two
# 16-row chunks' loads in flight (the call-2 design loaded, converted and stored 8 rows at a
# time: 8 memory round trips a tile); GPU tests, then scripts/ws_diag.py with the call-5/6
# design (consumers dequantize) as a variant beside it.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
timeout 300 python3 results/h200-2026-12-03d/scripts/ws_diag.py > $OUT/ws_diag.txt 2>&1
echo "ws_diag rc=$? s=$SECONDS"; tail -14 $OUT/ws_diag.txt
