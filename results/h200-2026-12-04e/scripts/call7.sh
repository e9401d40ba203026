#!/bin/bash
# Device call e7: the CUDA resolve after a refactor with no change of semantics (each walk lane's
# hit count and evictable rank computed once, used by the miss and the LRU steps): its tests and
# the coordinator's, and its phases / timing (scripts/resolve_phases.py).
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist tests/test_swap_in_cuda.py tests/test_hisparse_coordinator.py > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 90 python3 results/h200-2026-12-04e/scripts/resolve_phases.py > $OUT/resolve_phases.txt 2>&1
echo "phases rc=$? s=$((SECONDS-S))"; head -9 $OUT/resolve_phases.txt
echo "total s=$SECONDS"
