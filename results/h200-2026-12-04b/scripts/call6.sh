#!/bin/bash
# Device call 6: scripts/ws_ab9.py (the dequantization step with the swizzled fp8 stages).
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 results/h200-2026-12-04b/scripts/ws_ab9.py > $OUT/ws_ab9.txt 2>&1
echo "ws_ab9 rc=$? s=$SECONDS"
tail -24 $OUT/ws_ab9.txt
