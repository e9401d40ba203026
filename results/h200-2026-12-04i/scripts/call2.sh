#!/bin/bash
# Device call i2: the 16-bit split partials kernel by kernel (kineto37.py). Run from the
# repository root after the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 300 python3 results/h200-2026-12-04i/scripts/kineto37.py 20 > $OUT/kineto37.txt 2>&1
echo "kineto37 rc=$? s=$SECONDS"
grep -v Warning $OUT/kineto37.txt | tail -40
