#!/bin/bash
# Device call c6: scripts/ws_ab14.py (the producer's L2 prefetch, with and without the paired
# 16-head fp8 consumers).
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
SECONDS=0
timeout 400 python3 results/h200-2026-12-04c/scripts/ws_ab14.py > $OUT/ws_ab14.txt 2>&1
echo "ws_ab14 rc=$? s=$SECONDS"
tail -40 $OUT/ws_ab14.txt
