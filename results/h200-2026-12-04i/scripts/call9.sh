#!/bin/bash
# Device call i9: the bf16 partials' combine by columns, with the module switch really set: the
# combine alone (comb44.py) and whole calls eager / graph (ws_ab43.py, two rounds). Run from the
# repository root after the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 120 python3 results/h200-2026-12-04i/scripts/comb44.py > $OUT/comb44.txt 2>&1
echo "comb44 rc=$? s=$SECONDS"
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04i/scripts/ws_ab43.py 2 > $OUT/ws_ab43.txt 2>&1
echo "ws_ab43 rc=$? s=$((SECONDS-S))"
cat $OUT/comb44.txt | tail -14
grep -E "graph" $OUT/ws_ab43.txt | grep -v "s32 \|s16 graph.*fp8_ds_mla   8"
