#!/bin/bash
# Device call 2: the ws kernel with fp8_ds_mla rows (dequantized by the producer warpgroup into
# the bf16 stage) checked on the GPU, then both formats timed beside the Triton default and
# FlashMLA at B128 and the small batches.
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 320 python3 -m harness.bench run attention --tune \
  --shapes B128_H128_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 --variants default,ws --out $OUT/attn > $OUT/attn.txt 2>&1
echo "attention rc=$? s=$((SECONDS-S))"
grep -E "^(kernel|flashmla|sparse_mla)" $OUT/attn.txt | cut -c1-190
echo "total s=$SECONDS"
