#!/bin/bash
# Device call i6: the split combine alone on float32 and bf16 partials, cold and dirty in L2
# (comb41.py), and the combine's GPU tests. Run from the repository root after the device
# prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode.py -k combine > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04i/scripts/comb41.py > $OUT/comb41.txt 2>&1
echo "comb41 rc=$? s=$((SECONDS-S))"
cat $OUT/comb41.txt | tail -20
