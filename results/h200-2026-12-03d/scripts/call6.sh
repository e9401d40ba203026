#!/bin/bash
# Device call 6: P handed to the PV MMA through the stage's rope tile in shared memory (one barrier
# instead of four, no register copy of P); same checks and timings as call 5:
# GPU tests, then both formats at B128 and the small batches beside the Triton default and
# FlashMLA.
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_gpu_end_to_end.py -k "ws or attention_switch" > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
timeout 240 python3 -m harness.bench run attention --tune \
  --shapes B128_H128_k2048,B8_H128_k2048,B4_H128_k2048,B2_H128_k2048,B1_H128_k2048 --variants default,ws --out $OUT/attn > $OUT/attn.txt 2>&1
echo "attention rc=$?"; grep -E "^(flashmla|sparse_mla)" $OUT/attn.txt | cut -c1-190
echo "total s=$SECONDS"
