#!/bin/bash
# Device call c11: fp8_ds_mla rows at 32 heads in transposed 32-head programs by default
# (_T_MAX_HEADS): the ws GPU tests, then the attention bench at B128 H32 / H16 (both formats).
set -u
mkdir -p $OUT
SECONDS=0
timeout 120 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "ws gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -6
S=$SECONDS
timeout 120 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H32_k2048,B128_H16_k2048 --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A6 "fastest correct variant" $OUT/bench.txt | head -7
