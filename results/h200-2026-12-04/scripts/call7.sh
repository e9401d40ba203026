#!/bin/bash
# Device call 7: scripts/ws_ab6.py (fp8 rows' slot ids and dequantization chunk with the
# producer's copies arriving on the stage barriers; 32 heads transposed or padded).
set -u
mkdir -p $OUT
SECONDS=0
timeout 400 python3 results/h200-2026-12-04/scripts/ws_ab6.py > $OUT/ws_ab6.txt 2>&1
echo "ws_ab6 rc=$? s=$SECONDS"
tail -40 $OUT/ws_ab6.txt
