#!/bin/bash
# Device call f7 (the session's final kernels: staged bf16 output, no PDL switch, combine warps
# by split count): GPU tests of both decode kernels, end to end, the CUDA resolve and the SGLang
# peer; the combine's warps at B8-B32 (ws_ab27.py); the attention bench at the seven shapes.
# Run from the repository root after the device prefix (.whl, .peer_build, .kernel_build carried).
set -u
mkdir -p $OUT
SECONDS=0
timeout 100 python3 results/h200-2026-12-04f/scripts/ws_ab27.py 2 > $OUT/ws_ab27.txt 2>&1
echo "ab27 rc=$? s=$SECONDS"; tail -37 $OUT/ws_ab27.txt
S=$SECONDS
timeout 60 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A16 "fastest correct variant" $OUT/bench.txt | head -17
S=$SECONDS
timeout 330 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  tests/test_gpu_end_to_end.py tests/test_swap_in_cuda.py tests/test_sglang_peer.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
echo "total s=$SECONDS"
