#!/bin/bash
# Device call i1: the ws decode's split partials in 16 bits against float32 (ws_ab36.py, two
# rounds), and the ws decode's GPU tests at the default. Run from the repository root after the
# device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 380 python3 results/h200-2026-12-04i/scripts/ws_ab36.py 2 > $OUT/ws_ab36.txt 2>&1
echo "ws_ab36 rc=$? s=$((SECONDS-S))"
tail -80 $OUT/ws_ab36.txt
echo "total s=$SECONDS"
