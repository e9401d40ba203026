#!/bin/bash
# Device call 3: scripts/ws_ab3.py (fp8 rows: dequantization chunk, the next tile's rows
# dequantized during the PV MMA, the producer's registers).
set -u
mkdir -p $OUT
SECONDS=0
timeout 500 python3 results/h200-2026-12-04/scripts/ws_ab3.py > $OUT/ws_ab3.txt 2>&1
echo "ws_ab3 rc=$? s=$SECONDS"
tail -75 $OUT/ws_ab3.txt
