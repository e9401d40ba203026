#!/bin/bash
# Device call e4: the CUDA resolve after e3's phase times (inputs in one round trip, insert by
# CAS alone with a repeat fix-up, warp-level count reduction, hash load <= 1/4, unchanged LRU
# places not rewritten): its tests (model, bit-equal to Triton at the bench shape), its phases
# again (scripts/resolve_phases.py), the swap-in beside SGLang's kernel.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m pytest -q -p no:xdist tests/test_swap_in_cuda.py > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? s=$SECONDS"; grep -E "passed|failed|Error|assert" $OUT/gpu_tests.txt | head -12
S=$SECONDS
timeout 120 python3 results/h200-2026-12-04e/scripts/resolve_phases.py > $OUT/resolve_phases.txt 2>&1
echo "phases rc=$? s=$((SECONDS-S))"; head -9 $OUT/resolve_phases.txt; sed -n '/B64, cold/,/B64, warm/p' $OUT/resolve_phases.txt
S=$SECONDS
timeout 200 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
import pandas as pd
df = pd.read_parquet(os.path.join(os.environ["OUT"], "swap_in_peer", "result.parquet"))
df = df[df["variant"].astype(str).isin(["upstream", "upstream cuda", "upstream w16", "upstream cuda w16"]) | df["kernel"].astype(str).str.startswith("sglang")]
cols = [c for c in ("case", "batch", "kernel", "variant", "status", "latency_us_median", "latency_us_p10", "latency_us_p90", "misses") if c in df]
pd.set_option("display.width", 200)
print(df[cols].to_string(index=False))
PY
echo "total s=$SECONDS"
