#!/bin/bash
# Device call i3: bf16 split partials with the combine reading int32 pairs: kernel by kernel
# (kineto38.py) and whole calls eager / graph against float32 partials and FlashMLA (ws_ab38.py,
# two rounds); the decode's and the combine's GPU tests. Run from the repository root after the
# device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 150 python3 results/h200-2026-12-04i/scripts/kineto38.py 20 > $OUT/kineto38.txt 2>&1
echo "kineto38 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04i/scripts/ws_ab38.py 2 > $OUT/ws_ab38.txt 2>&1
echo "ws_ab38 rc=$? s=$((SECONDS-S))"
grep -v Warn $OUT/kineto38.txt | grep -v _warn_once | tail -46
grep -E "graph" $OUT/ws_ab38.txt
echo "total s=$SECONDS"
