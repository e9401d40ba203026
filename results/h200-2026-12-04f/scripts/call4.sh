#!/bin/bash
# Device call f4: Nsight Compute on the small-batch fp8 calls (ours: decode + combine; FlashMLA:
# its kernels) at B2 / B4 / B8 H128: duration, DRAM and L2 bytes, achieved throughput, a kernel
# each (ncu_small.py). Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum
timeout 300 ncu --nvtx --nvtx-include "prof/" --metrics $M --csv python3 results/h200-2026-12-04f/scripts/ncu_small.py > $OUT/ncu_small.csv 2> $OUT/ncu_small.err
echo "ncu rc=$? s=$SECONDS"; tail -3 $OUT/ncu_small.err
python3 - <<'PY'
import csv, io, os
txt = open(os.path.join(os.environ["OUT"], "ncu_small.csv")).read()
lines = [l for l in txt.splitlines() if l.startswith('"')]
print("\n".join(l for l in txt.splitlines() if l.startswith("B")))
rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
by = {}
for r in rows:
    k = (r["ID"], r["Kernel Name"][:40])
    by.setdefault(k, {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
short = {"gpu__time_duration.sum": "us", "dram__bytes_read.sum": "dramR", "dram__bytes_write.sum": "dramW",
         "lts__t_bytes.sum": "L2", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2%", "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%",
         "launch__grid_size": "grid", "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
         "lts__t_sectors_op_write.sum": "L2wr_sec", "lts__t_sectors_op_read.sum": "L2rd_sec"}
for (i, name), m in by.items():
    print(i, name, " ".join(f"{short[k]}={m[k][0]}{m[k][1]}" for k in short if k in m))
PY
echo "total s=$SECONDS"
