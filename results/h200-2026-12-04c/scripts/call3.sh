#!/bin/bash
# Device call c3: the GPU tests of both decode kernels (the rewritten split combine, the
# transposed consumers' new order), then scripts/ws_ab12.py.
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 330 python3 results/h200-2026-12-04c/scripts/ws_ab12.py > $OUT/ws_ab12.txt 2>&1
echo "ws_ab12 rc=$? s=$((SECONDS-S))"
grep -v "^bf16.*\(loop\|pdl\)" $OUT/ws_ab12.txt | tail -75
