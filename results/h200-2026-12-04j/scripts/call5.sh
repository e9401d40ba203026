#!/bin/bash
# Device call j5: the harness's attention stage with the three ws partials, in two orders and
# 12 steps (j4's first point, triton_ws with fp16 partials, was 3 us slower than the others,
# where the A/B had it faster than float32 partials at B32). Run from the repository root after
# the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 70 python3 -m harness -m attention_kernel=triton_ws_f32p,triton_ws,triton_ws_bf16p top_k=2048 steps=12 \
  hydra.sweep.dir=$OUT/h1 > $OUT/h1.txt 2>&1
echo "h1 rc=$? s=$SECONDS"
timeout 70 python3 -m harness -m attention_kernel=triton_ws_bf16p,triton_ws_f32p,triton_ws top_k=2048 steps=12 \
  hydra.sweep.dir=$OUT/h2 > $OUT/h2.txt 2>&1
echo "h2 rc=$? s=$SECONDS"
python3 - <<'PY'
import os
from harness import results
for h in ("h1", "h2"):
    try:
        df = results.load(os.path.join(os.environ["OUT"], h))
        cols = [c for c in ("backend", "attention_kernel", "kv_dtype", "batch", "status", "latency_us_median", "stage_attention_us") if c in df]
        print(h); print(df[cols].sort_values(["backend", "attention_kernel"]).to_string(index=False))
    except Exception as e:
        print(h, "table:", e)
PY
echo "total s=$SECONDS"
