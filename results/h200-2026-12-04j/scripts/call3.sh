#!/bin/bash
# Device call j3: fp16 partials' combine summing a column range at a time (scalar weights):
# GPU tests of both decode kernels; the A/B of float32 / bf16 / fp16 partials at two combine
# program sizes (scripts/ws_ab48.py, two rounds). Run from the repository root after the
# device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed|^E  " $OUT/gpu_tests.txt | tail -12
S=$SECONDS
timeout 330 python3 results/h200-2026-12-04j/scripts/ws_ab48.py 2 > $OUT/ws_ab48.txt 2>&1
echo "ab rc=$? s=$((SECONDS-S))"; sed -n '/^summary/,$p' $OUT/ws_ab48.txt; grep -c BAD $OUT/ws_ab48.txt; tail -3 $OUT/ws_ab48.txt
echo "total s=$SECONDS"
