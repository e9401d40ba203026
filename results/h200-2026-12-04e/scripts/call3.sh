#!/bin/bash
# Device call e3: the CUDA resolve's bit-equality test vs the Triton resolve (fixed set-up: host
# rows loaded before prefill), and where its all-hit time goes (scripts/resolve_phases.py).
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m pytest -q -p no:xdist tests/test_swap_in_cuda.py > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04e/scripts/resolve_phases.py > $OUT/resolve_phases.txt 2>&1
echo "phases rc=$? s=$((SECONDS-S))"; cat $OUT/resolve_phases.txt | tail -45
echo "total s=$SECONDS"
