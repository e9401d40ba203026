#!/bin/bash
# Device call i8: Nsight Compute's memory tables and source counters on the split combine,
# float32 against bf16 partials (pairs at 4 warps and by columns) at B32, 2 splits (ncu42.py).
# Run from the repository root after the device prefix, with .whl, .peer_build and
# .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
for v in four wc; do
timeout 200 ncu -k regex:_sparse_mla_decode_combine --section SpeedOfLight \
  --section MemoryWorkloadAnalysis_Tables --section SourceCounters --section WarpStateStats \
  --section LaunchStats python3 results/h200-2026-12-04i/scripts/ncu42.py $v > $OUT/ncu42_$v.txt 2> $OUT/ncu42_$v.err
echo "ncu $v rc=$? s=$SECONDS"
grep -E "CC 9.0|Duration|L1/TEX Cache Throughput|Block Size|Registers|[Uu]ncoalesced|[Bb]ank|Shared Load|Shared Store|Global Load|Global Store|Est. Speedup|excessive|wavefronts|sectors" $OUT/ncu42_$v.txt | head -60
done
