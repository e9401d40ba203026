#!/bin/bash
# Device call f2: the ws decode kernel storing its output / split partials through shared memory
# (16-byte vectors a thread along a row): its GPU tests, then scripts/ws_ab24.py (staged against
# direct stores, FlashMLA in the same process). Run from the repository root after the device
# prefix (.whl carried).
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04f/scripts/ws_ab24.py 2 > $OUT/ws_ab24.txt 2>&1
echo "ws_ab24 rc=$? s=$((SECONDS-S))"
tail -75 $OUT/ws_ab24.txt
echo "total s=$SECONDS"
