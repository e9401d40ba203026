#!/bin/bash
# Device call 1 (2026-12-03, fourth session): the warp-specialised Gluon sparse MLA decode
# (kernel="ws") checked on the GPU, then timed beside the Triton default and FlashMLA (bf16
# rows); the two host_memory GPU tests not yet run on a GPU. Run from the repository root after
# the device prefix, with .whl/ and .peer_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_host_memory.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|error" $OUT/gpu_tests.txt | tail -15
S=$SECONDS
timeout 300 python3 -m harness.bench run attention --tune --formats bf16 \
  --shapes B128_H128_k2048,B8_H128_k2048,B1_H128_k2048 --variants default,ws --out $OUT/attn > $OUT/attn.txt 2>&1
echo "attention rc=$? s=$((SECONDS-S))"
tail -12 $OUT/attn.txt | cut -c1-200
echo "total s=$SECONDS"
