#!/bin/bash
# Device call g5: the whole GPU suite (`-m gpu`, what `make test-gpu` runs) at this commit, with
# the slowest tests listed. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=12 tests > $OUT/gpu_suite.txt 2>&1
echo "GPU suite rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed|s call|s setup" $OUT/gpu_suite.txt | tail -30
