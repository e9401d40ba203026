#!/bin/bash
# Device call h3: does a host translation flush make every pool size read cold (tlb33.py), and
# the flusher's GPU test. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_translation_flush.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 400 python3 results/h200-2026-12-04h/scripts/tlb33.py 2 > $OUT/tlb33.txt 2>&1
echo "tlb33 rc=$? s=$((SECONDS-S))"
grep flusher $OUT/tlb33.txt
sed -n '/^pool_GiB/,$p' $OUT/tlb33.txt
tail -3 $OUT/tlb33.txt | grep -i error
echo "total s=$SECONDS"
