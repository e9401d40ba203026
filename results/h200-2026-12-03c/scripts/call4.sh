#!/bin/bash
# Device call 4 (2026-12-03, third session): where between 64K and 128K the swap-in's first-read
# cost appears (registered pool, sequential host pages, batch 32: pool 1.28 -> 2.56 GiB), and
# whether it follows the pool's size or the context (batch 16 at 128K: a 1.28 GiB pool; batch 64
# at 64K: 2.56 GiB). Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m harness.bench run swap_in --section context --host-alloc registered \
  --host-page-order sequential --contexts 16384,65536,81920,98304,114688,131072 \
  --out $OUT/ctx_b32 > $OUT/ctx_b32.txt 2>&1
echo "b32 rc=$? s=$SECONDS"
S=$SECONDS
timeout 100 python3 -m harness.bench run swap_in --section context --host-alloc registered \
  --host-page-order sequential --contexts 16384,131072 --context-batch 16 \
  --out $OUT/ctx_b16 > $OUT/ctx_b16.txt 2>&1
echo "b16 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 100 python3 -m harness.bench run swap_in --section context --host-alloc registered \
  --host-page-order sequential --contexts 16384,65536 --context-batch 64 \
  --out $OUT/ctx_b64 > $OUT/ctx_b64.txt 2>&1
echo "b64 rc=$? s=$((SECONDS-S))"
for f in ctx_b32 ctx_b16 ctx_b64; do sed -n '/equal misses vs context/,/^$/p' $OUT/$f.txt | grep -v capacity_rows4; done
echo "total s=$SECONDS"
