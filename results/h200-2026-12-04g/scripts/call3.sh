#!/bin/bash
# Device call g3: a CUDA timeline (torch.profiler) of ours and FlashMLA's small-batch split
# calls, kernel by kernel (kineto30.py). Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 results/h200-2026-12-04g/scripts/kineto30.py 20 > $OUT/kineto30.txt 2>&1
echo "kineto rc=$? s=$SECONDS"; grep -v Warning $OUT/kineto30.txt | tail -45
