#!/bin/bash
# Device call c8: Nsight Compute on the ws decode (scripts/ncu_ws.py: B128 top_k 2048, fp8 at
# 128 and 16 heads, bf16 at 128 heads; the second launch of each shape is profiled).
set -u
mkdir -p $OUT
SECONDS=0
timeout 400 ncu --target-processes all --kernel-name regex:_sparse_mla_decode_ws_fwd \
  --launch-skip-before-match 0 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  --csv --page details python3 results/h200-2026-12-04c/scripts/ncu_ws.py > $OUT/ncu_ws.csv 2> $OUT/ncu_ws.err
echo "ncu rc=$? s=$SECONDS"
tail -3 $OUT/ncu_ws.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(open(os.path.join(os.environ["OUT"], "ncu_ws.csv"))))
hdr = None
for i, r in enumerate(rows):
    if r and r[0] == "ID":
        hdr = r; start = i + 1; break
if hdr is None:
    print("no ncu table"); print("\n".join(",".join(r) for r in rows[:20])); raise SystemExit
ci = {k: hdr.index(k) for k in ("ID", "Section Name", "Metric Name", "Metric Unit", "Metric Value")}
want = ("Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput",
        "L1/TEX Hit Rate", "L2 Hit Rate", "Shared Memory", "Warp Cycles Per Issued Instruction",
        "Issued Warp Per Scheduler", "No Eligible", "Achieved Occupancy", "Registers Per Thread",
        "Dynamic Shared Memory Per Block", "Mem Pipes Busy", "Max Bandwidth", "L1/TEX Cache Throughput",
        "SM Frequency", "Avg. Active Threads Per Warp")
by = collections.defaultdict(list)
for r in rows[start:]:
    if len(r) <= max(ci.values()):
        continue
    if any(w in r[ci["Metric Name"]] for w in want):
        by[r[ci["ID"]]].append(f'{r[ci["Metric Name"]]}={r[ci["Metric Value"]]} {r[ci["Metric Unit"]]}')
for k, v in by.items():
    print("launch", k, "; ".join(v))
PY
