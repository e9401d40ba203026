#!/bin/bash
# Device call i7: Nsight Compute on the split combine, float32 against bf16 partials at B32, 2
# splits (ncu42.py). Run from the repository root after the device prefix, with .whl,
# .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 240 ncu -k regex:_sparse_mla_decode_combine --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section SchedulerStats python3 results/h200-2026-12-04i/scripts/ncu42.py > $OUT/ncu42.txt 2> $OUT/ncu42.err
echo "ncu rc=$? s=$SECONDS"; tail -3 $OUT/ncu42.err
grep -E "max_err|_sparse_mla_decode_combine|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|L2 Hit|Warp Cycles Per Issued|Stall|Issued Warp|No Eligible|Grid Size|Block Size|Shared Memory Config|Dynamic Shared|Static Shared|Mem Busy|Max Bandwidth|L1/TEX Hit|Waves" $OUT/ncu42.txt | head -90
