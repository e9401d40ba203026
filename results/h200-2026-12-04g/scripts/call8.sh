#!/bin/bash
# Device call g8: after one row_alignment came to serve the Triton decode's rope vector width
# and the row copies' vector width: the GPU tests of the Triton decode, the row copies and the
# extend step. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode.py \
  tests/test_copy_engines.py tests/test_extend.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -6
