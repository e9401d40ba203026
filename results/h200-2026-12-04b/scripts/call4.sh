#!/bin/bash
# Device call 4: scripts/ws_diag2.py (where the ws kernel's time goes at 128 and 16 heads:
# gather alone, gather and dequantization, no dequantization, compute alone).
set -u
mkdir -p $OUT
SECONDS=0
timeout 500 python3 results/h200-2026-12-04b/scripts/ws_diag2.py > $OUT/ws_diag2.txt 2>&1
echo "ws_diag2 rc=$? s=$SECONDS"
tail -16 $OUT/ws_diag2.txt
