#!/bin/bash
# Device call i5: the bf16 partials' combine warps (ws_ab40.py, two rounds) and the combine's
# GPU tests. Run from the repository root after the device prefix, with .whl, .peer_build and
# .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode.py -k combine > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 120 python3 results/h200-2026-12-04i/scripts/kineto40.py 20 > $OUT/kineto40.txt 2>&1
echo "kineto40 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04i/scripts/ws_ab40.py 2 > $OUT/ws_ab40.txt 2>&1
echo "ws_ab40 rc=$? s=$((SECONDS-S))"
grep -E "combine|fwd" $OUT/kineto40.txt
grep -E "graph" $OUT/ws_ab40.txt | grep -v "s32 \|s16 graph.*fp8_ds_mla   8"
echo "total s=$SECONDS"
