#!/bin/bash
# Device call d1: the GPU tests of both decode kernels (with the bit-move fp8 dequantization on by
# default, and its exactness test on power-of-two scales); scripts/ws_ab18.py (the two fp8
# dequantizations x rows at a time, beside FlashMLA); the attention bench (--tune).
set -u
mkdir -p $OUT
SECONDS=0
timeout 170 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04d/scripts/ws_ab18.py > $OUT/ws_ab18.txt 2>&1
echo "ws_ab18 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 170 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A16 "fastest correct variant" $OUT/bench.txt | head -17
echo "total s=$SECONDS"
tail -75 $OUT/ws_ab18.txt
