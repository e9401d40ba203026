#!/bin/bash
# Device call f8: the split combine with the splits unrolled (a row a program, no cross-warp
# sum) against the [S, BLOCK_D] tile: the combine tests on the GPU, then ws_ab28.py. Run from
# the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 100 python3 results/h200-2026-12-04f/scripts/ws_ab28.py 2 > $OUT/ws_ab28.txt 2>&1
echo "ab28 rc=$? s=$SECONDS"; tail -33 $OUT/ws_ab28.txt
S=$SECONDS
timeout 60 python3 -m pytest -q -p no:xdist tests/test_sparse_mla_decode.py -k combine > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -4
echo "total s=$SECONDS"
