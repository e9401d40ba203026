#!/bin/bash
# Device call g1: where the "misaligned address" of f9 comes from. (1) The GPU test of the
# extend step at the tiny model's 8-byte-aligned fp8 rows, every launch blocking. (2) Each test
# file's non-GPU tests in a process of its own with CUDA visible and every launch blocking (the
# conftest's hiding of the GPUs removed in this copy of the tree only), as f9 ran them: which
# file's which test raises it, and in which kernel. Run from the repository root after the
# device prefix.
set -u
mkdir -p $OUT/files
SECONDS=0
CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_extend.py -k tiny_rows > $OUT/tiny_rows_gpu.txt 2>&1
echo "tiny-rows GPU test rc=$? s=$SECONDS"; grep -E "passed|failed|misaligned|Error" $OUT/tiny_rows_gpu.txt | tail -6
sed -i 's/os.environ\["CUDA_VISIBLE_DEVICES"\] = ""/pass/; s/os.environ\["TRITON_INTERPRET"\] = "1"/pass/' tests/conftest.py
grep -c "^        pass" tests/conftest.py
S=$SECONDS
ls tests/test_*.py | grep -v test_notebook | xargs -P 12 -I{} bash -c \
  'f={}; n=$(basename $f .py); CUDA_LAUNCH_BLOCKING=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:xdist -m "not gpu" $f > $OUT/files/$n.txt 2>&1; echo "$n rc=$?" >> $OUT/files/rc.txt'
echo "per-file runs s=$((SECONDS-S))"
for f in $OUT/files/test_*.txt; do
  if grep -q "misaligned" $f; then
    echo "== $(basename $f): $(grep -c misaligned $f) lines with misaligned"
    grep -n -m3 -E "^(FAILED|ERROR|_____)" $f | head -3
    grep -n -m1 -B30 "misaligned address" $f | grep -E "\.py:[0-9]+|^[0-9]+-E " | head -14
  fi
done
grep -h -E "passed|failed" $OUT/files/test_*.txt | tail -50 | awk '{print}' | head -45
echo "total s=$SECONDS"
