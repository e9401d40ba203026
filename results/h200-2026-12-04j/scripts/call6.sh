#!/bin/bash
# Device call j6: scripts/ws_ab50.py (the partials at the bench's and the harness's sm_scale),
# and the harness's three ws names again with each row's launch configuration printed.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 results/h200-2026-12-04j/scripts/ws_ab50.py 2 > $OUT/ws_ab50.txt 2>&1
echo "ab rc=$? s=$SECONDS"; tail -20 $OUT/ws_ab50.txt
timeout 60 python3 -m harness -m attention_kernel=triton_ws,triton_ws_f32p,triton_ws_bf16p top_k=2048 steps=8 \
  hydra.sweep.dir=$OUT/h > $OUT/h.txt 2>&1
echo "h rc=$? s=$SECONDS"
python3 - <<'PY'
import os
import pandas as pd
from harness import results
df = results.load(os.path.join(os.environ["OUT"], "h"))
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 200)
print(df[["backend", "attention_kernel", "stage_attention_us"]].sort_values(["backend", "attention_kernel"]).to_string(index=False))
for c in [c for c in df.columns if "launch" in c or "split" in c]:
    print(c, df[c].unique()[:6])
PY
echo "total s=$SECONDS"
