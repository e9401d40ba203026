#!/bin/bash
# Device call i13: the combine program size (ws_ab46.py, two rounds). Run from
# the repository root after the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 results/h200-2026-12-04i/scripts/ws_ab46.py 2 > $OUT/ws_ab46.txt 2>&1
echo "ws_ab46 rc=$? s=$SECONDS"
grep -E "graph|eager" $OUT/ws_ab46.txt | grep fp8
tail -3 $OUT/ws_ab46.txt
