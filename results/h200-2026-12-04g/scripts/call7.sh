#!/bin/bash
# Device call g7: `attention --tune` with its new CUDA-graph rows: the GPU test of the quick
# tune, then the small-batch shapes with the ws variant beside FlashMLA in both modes. Run from
# the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode.py -k tune > $OUT/tune_gpu_test.txt 2>&1
echo "tune GPU test rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/tune_gpu_test.txt | tail -3
S=$SECONDS
timeout 150 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048 --variants ws > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
grep -A12 "fastest correct variant" $OUT/bench.txt | head -20
