#!/bin/bash
# Device call j6: the harness's attention stage with the three ws partials (j4 / j5: fp16
# partials ~3 us slower than float32 ones there, 1.6 us faster in the A/B at B32), as CUDA-graph
# replays and with a 5 ms launch shield, to tell GPU time from host time.
set -u
mkdir -p $OUT
SECONDS=0
for v in "g timing.cuda_graph=true" "s timing.launch_shield_us=5000"; do
  set -- $v
  timeout 70 python3 -m harness -m attention_kernel=triton_ws,triton_ws_f32p,triton_ws_bf16p top_k=2048 steps=8 $2 \
    hydra.sweep.dir=$OUT/$1 > $OUT/$1.txt 2>&1
  echo "$1 rc=$? s=$SECONDS"
done
python3 - <<'PY'
import os
import pandas as pd
from harness import results
pd.set_option("display.width", 250)
for h in ("g", "s"):
    try:
        df = results.load(os.path.join(os.environ["OUT"], h))
        print(h); print(df[["backend", "attention_kernel", "cuda_graph", "launch_gap_us", "stage_attention_us", "latency_us_median"]].sort_values(["backend", "attention_kernel"]).to_string(index=False))
    except Exception as e:
        print(h, e)
PY
echo "total s=$SECONDS"
