#!/bin/bash
# Device call c1: the GPU tests of the two decode kernels and the end-to-end GPU tests (the
# _stage_tile refactor of b861cc8 and the two new switches, both on), then scripts/ws_ab11.py.
set -u
mkdir -p $OUT
SECONDS=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py tests/test_gpu_end_to_end.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04c/scripts/ws_ab11.py > $OUT/ws_ab11.txt 2>&1
echo "ws_ab11 rc=$? s=$((SECONDS-S))"
tail -60 $OUT/ws_ab11.txt
