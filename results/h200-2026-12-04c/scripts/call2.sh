#!/bin/bash
# Device call c2: scripts/ws_ab11.py (call 1's run of it stopped at an import).
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
SECONDS=0
timeout 400 python3 results/h200-2026-12-04c/scripts/ws_ab11.py > $OUT/ws_ab11.txt 2>&1
echo "ws_ab11 rc=$? s=$SECONDS"
tail -60 $OUT/ws_ab11.txt
