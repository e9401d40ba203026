#!/bin/bash
# Device call h5: vmm35.py, host memory through CUDA's virtual memory API against registered
# memory, warm and cold translations. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 results/h200-2026-12-04h/scripts/vmm35.py > $OUT/vmm35.txt 2>&1
echo "vmm35 rc=$? s=$SECONDS"
grep -i "granularity\|error" $OUT/vmm35.txt | head
sed -n '/^pool_GiB/,$p' $OUT/vmm35.txt
tail -4 $OUT/vmm35.txt
