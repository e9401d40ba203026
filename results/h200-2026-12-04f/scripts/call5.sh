#!/bin/bash
# Device call f5: where the small-batch fp8 call's time goes after the decode. (1) Nsight Compute
# without cache flush or clock locking (the combine reads the partials the decode just wrote, at
# the run's clocks); (2) an Nsight Systems timeline of 20 calls each (gap between the decode's
# end and the combine's start, kernel durations). Run from the repository root after the prefix.
set -u
mkdir -p $OUT
SECONDS=0
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,launch__grid_size,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second
timeout 200 ncu --nvtx --nvtx-include "prof/" --cache-control none --clock-control none --metrics $M --csv \
  python3 results/h200-2026-12-04f/scripts/ncu_small.py > $OUT/ncu_hot.csv 2> $OUT/ncu_hot.err
echo "ncu rc=$? s=$SECONDS"; tail -2 $OUT/ncu_hot.err
python3 - <<'PY'
import csv, io, os
txt = open(os.path.join(os.environ["OUT"], "ncu_hot.csv")).read()
rows = list(csv.DictReader(io.StringIO("\n".join(l for l in txt.splitlines() if l.startswith('"')))))
by = {}
for r in rows:
    by.setdefault((int(r["ID"]), r["Kernel Name"][:38]), {})[r["Metric Name"]] = r["Metric Value"] + r["Metric Unit"]
for k in sorted(by):
    print(k[0], k[1], " ".join(f"{m.split('.')[0].split('__')[-1]}={v}" for m, v in by[k].items()))
PY
S=$SECONDS
if command -v nsys > /dev/null; then
  timeout 200 nsys profile -t cuda,nvtx -o $OUT/trace --force-overwrite true python3 results/h200-2026-12-04f/scripts/trace_small.py > $OUT/nsys.txt 2>&1
  echo "nsys rc=$? s=$((SECONDS-S))"
  nsys stats -q -r cuda_gpu_trace -f csv -o $OUT/gputrace $OUT/trace.nsys-rep > /dev/null 2>&1
  nsys stats -q -r nvtx_pushpop_trace -f csv -o $OUT/nvtx $OUT/trace.nsys-rep > /dev/null 2>&1
  ls $OUT
  python3 - <<'PY'
import csv, os, statistics as st
out = os.environ["OUT"]
g = list(csv.DictReader(open(os.path.join(out, "gputrace_cuda_gpu_trace.csv"))))
nv = list(csv.DictReader(open(os.path.join(out, "nvtx_nvtx_pushpop_trace.csv"))))
for r in nv:
    name = r.get("Name") or r.get("Range")
    t0, t1 = int(r["Start (ns)"]), int(r["End (ns)"])
    ks = [k for k in g if t0 <= int(k["Start (ns)"]) <= t1 and "elementwise" not in k["Name"] and "fill" not in k["Name"].lower()
          and "sleep" not in k["Name"].lower() and "spin" not in k["Name"].lower()]
    names = sorted(set(k["Name"][:40] for k in ks))
    # per call: first kernel start to last kernel end of the call (kernels between flushes)
    calls, cur = [], []
    allk = [k for k in g if t0 <= int(k["Start (ns)"]) <= t1]
    for k in allk:
        n = k["Name"].lower()
        if "fill" in n or "elementwise" in n or "sleep" in n or "spin" in n:
            if cur: calls.append(cur); cur = []
        else:
            cur.append(k)
    if cur: calls.append(cur)
    span = [ (int(c[-1]["Start (ns)"]) + int(c[-1]["Duration (ns)"]) - int(c[0]["Start (ns)"])) / 1e3 for c in calls]
    per = {}
    for c in calls:
        for i, k in enumerate(c):
            per.setdefault((i, k["Name"][:38]), []).append(int(k["Duration (ns)"]) / 1e3)
            if i:
                prev = c[i - 1]
                per.setdefault((i, "gap before"), []).append((int(k["Start (ns)"]) - int(prev["Start (ns)"]) - int(prev["Duration (ns)"])) / 1e3)
    print(name, f"calls={len(calls)} span_med={st.median(span):.1f}us",
          " | ".join(f"{k[0]}:{k[1]} {st.median(v):.2f}" for k, v in sorted(per.items())))
PY
else
  echo "no nsys"
fi
echo "total s=$SECONDS"
