#!/bin/bash
# Device call f1 (2026-12-04, sixth session on #13): (1) the SGLang-peer GPU tests with our
# coordinator resolving by the Triton and by the CUDA resolve (50-step free-running trace against
# SGLang's compiled kernel; lockstep at top_k 2048 / 4096 slots); (2) the swap-in at equal
# misses against context (16K -> 128K, batch 32) with both resolves. Run from the repository root
# after the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:xdist tests/test_sglang_peer.py tests/test_swap_in_cuda.py \
  > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 300 python3 -m harness.bench run swap_in --section context --host-alloc registered \
  --resolve-kernel triton,cuda --out $OUT/ctx > $OUT/ctx.txt 2>&1
echo "ctx rc=$? s=$((SECONDS-S))"
sed -n '/equal misses vs context/,/^$/p' $OUT/ctx.txt
tail -5 $OUT/ctx.txt
echo "total s=$SECONDS"
