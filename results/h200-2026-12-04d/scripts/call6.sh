#!/bin/bash
# Device call d6: split partials stored as bf16 (_PART_BF16, on): the GPU tests of both decode
# kernels, then scripts/ws_ab23.py (bf16 / float32 partials at B1-B8, both row formats).
set -u
mkdir -p $OUT
SECONDS=0
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 150 python3 results/h200-2026-12-04d/scripts/ws_ab23.py > $OUT/ws_ab23.txt 2>&1
echo "ws_ab23 rc=$? s=$((SECONDS-S))"
tail -40 $OUT/ws_ab23.txt
echo "total s=$SECONDS"
