#!/bin/bash
# Device call f6: the split combine's launch (plain / programmatic dependent) and program size
# after the ws decode at B1-B8 fp8 (ws_ab26.py), after the GPU tests of both decode kernels
# (the combine's new arguments). Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py \
  > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error" $OUT/gpu_tests.txt | tail -8
S=$SECONDS
timeout 300 python3 results/h200-2026-12-04f/scripts/ws_ab26.py 2 > $OUT/ws_ab26.txt 2>&1
echo "ab26 rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os, statistics as st
rows = [l.split() for l in open(os.path.join(os.environ["OUT"], "ws_ab26.txt")) if l[:3].strip().isdigit()]
agg = {}
for r in rows:
    name = r[1] if r[1] == "flashmla" else " ".join(r[1:4])
    med = float(r[2] if r[1] == "flashmla" else r[4])
    bad = "BAD" in r
    agg.setdefault((int(r[0]), name), []).append((med, bad))
for (b, name), v in sorted(agg.items()):
    print(b, f"{name:18}", " / ".join(f"{m:.1f}" for m, _ in v), "BAD" if any(x for _, x in v) else "")
PY
tail -3 $OUT/ws_ab26.txt
echo "total s=$SECONDS"
