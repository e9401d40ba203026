#!/bin/bash
# Device call 4: the ws kernel with the next tile's score MMAs issued before this tile's softmax
# (commit after 3cd...): GPU tests, then B128 H128 twice and the small batches, both formats.
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_gpu_end_to_end.py -k "ws or attention_switch" > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
for r in 1 2; do
  timeout 120 python3 -m harness.bench run attention --tune --formats bf16 --shapes B128_H128_k2048 \
    --variants default,ws --out $OUT/attn_b128_run$r > $OUT/attn_b128_run$r.txt 2>&1
  echo "run $r rc=$?"; grep -E "^(flashmla|sparse_mla)" $OUT/attn_b128_run$r.txt | cut -c1-190
done
timeout 200 python3 -m harness.bench run attention --tune \
  --shapes B128_H128_k2048,B8_H128_k2048,B1_H128_k2048 --variants default,ws --out $OUT/attn > $OUT/attn.txt 2>&1
echo "attention rc=$?"; grep -E "^(flashmla|sparse_mla)" $OUT/attn.txt | cut -c1-190
echo "total s=$SECONDS"
