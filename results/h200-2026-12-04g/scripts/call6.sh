#!/bin/bash
# Device call g6: the small-batch split calls as a Python call and as a CUDA-graph replay,
# ours and FlashMLA (graph31.py); the gather's GPU test after its refactor. Run from the
# repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 results/h200-2026-12-04g/scripts/graph31.py 2 > $OUT/graph31.txt 2>&1
echo "graph31 rc=$? s=$SECONDS"; grep -v -i warn $OUT/graph31.txt | tail -57
S=$SECONDS
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_extend.py > $OUT/extend_gpu.txt 2>&1
echo "extend GPU tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed" $OUT/extend_gpu.txt | tail -2
