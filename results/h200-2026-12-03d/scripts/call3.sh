#!/bin/bash
# Device call 3: the GPU tests of the ws kernel and of attention_kernel=triton_ws end to end
# (both backends, eager and CUDA graph), then the B128 H128 bf16 shape three times in three
# processes (the ws / FlashMLA ratio was 1.39 and 1.43 in calls 1 and 2).
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py \
  tests/test_gpu_end_to_end.py -k "ws or attention_switch" > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
for r in 1 2 3; do
  timeout 120 python3 -m harness.bench run attention --tune --formats bf16 --shapes B128_H128_k2048 \
    --variants default,ws --out $OUT/attn_b128_run$r > $OUT/attn_b128_run$r.txt 2>&1
  echo "run $r rc=$?"; grep -E "^(flashmla|sparse_mla)" $OUT/attn_b128_run$r.txt | cut -c1-190
done
echo "total s=$SECONDS"
