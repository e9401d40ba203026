#!/bin/bash
# Device call 3 (the kernel as at 66489ac, the bench grid with ws at 16 and 32 heads): the GPU
# tests of the ws kernel and end to end; the attention bench against FlashMLA (--tune, default,
# h64 and ws variants) at B128 with 128, 16 (TP8) and 32 (TP4) heads and at B1-B8.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_gpu_end_to_end.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 300 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B128_H128_k2048,B128_H16_k2048,B128_H32_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 \
  --variants default,h64,ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -B2 -A20 "fastest correct variant" $OUT/bench.txt | head -24
grep -E "B128_H(16|32)_k2048" $OUT/bench.txt | grep -v "^\[" | head -20
echo "total s=$SECONDS"
