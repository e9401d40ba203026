#!/bin/bash
# Device call 7: where the ws kernel's time goes (scripts/ws_diag.py: the kernel, its gather
# alone, its compute alone, and 1 stage; B128 H128 top_k 2048, both KV formats).
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 results/h200-2026-12-03d/scripts/ws_diag.py > $OUT/ws_diag.txt 2>&1
echo "ws_diag rc=$? s=$SECONDS"; tail -12 $OUT/ws_diag.txt
