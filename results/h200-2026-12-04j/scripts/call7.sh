#!/bin/bash
# Device call j7: the harness's attention stage with the three ws partials at num_layers=1
# (batch 32) and at batch 4 (16 splits), flashmla_sparse only, to see whether j4-j6's fp16
# penalty at the default point (2 layers, batch 32) follows the layers or the batch.
set -u
mkdir -p $OUT
SECONDS=0
for v in "l1 num_layers=1" "b4 batch_size=4"; do
  set -- $v
  timeout 60 python3 -m harness -m attention_kernel=triton_ws,triton_ws_f32p,triton_ws_bf16p top_k=2048 steps=8 \
    backend=flashmla_sparse $2 hydra.sweep.dir=$OUT/$1 > $OUT/$1.txt 2>&1
  echo "$1 rc=$? s=$SECONDS"; grep -i "error" $OUT/$1.txt | head -3
done
python3 - <<'PY'
import os
import pandas as pd
from harness import results
pd.set_option("display.width", 250)
for h in ("l1", "b4"):
    try:
        df = results.load(os.path.join(os.environ["OUT"], h))
        print(h); print(df[["backend", "attention_kernel", "batch_size", "num_layers", "stage_attention_us", "latency_us_median"]].sort_values(["backend", "attention_kernel"]).to_string(index=False))
    except Exception as e:
        print(h, e)
PY
echo "total s=$SECONDS"
