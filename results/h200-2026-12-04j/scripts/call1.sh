#!/bin/bash
# Device call j1: scaled fp16 split partials (split_partials="float16", attention_kernel=
# triton_ws_f16p) beside float32 and bf16: GPU tests of both decode kernels and the combine;
# `attention --tune` with ws, ws_bf16p, ws_f16p at the small and split shapes, and a second
# round at B1-B8; the harness at dsv32's defaults with the three names. Run from the
# repository root after the device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed|Error|assert" $OUT/gpu_tests.txt | tail -12
S=$SECONDS
timeout 200 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048,B16_H128_k2048,B32_H128_k2048,B4_H16_k2048,B8_H16_k2048 \
  --variants ws,ws_bf16p,ws_f16p > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 100 python3 -m harness.bench run attention --tune --out $OUT/bench2 \
  --shapes B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048 \
  --variants ws,ws_f16p > $OUT/bench2.txt 2>&1
echo "bench2 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 80 python3 -m harness -m attention_kernel=triton_ws,triton_ws_bf16p,triton_ws_f16p top_k=2048 steps=6 \
  hydra.sweep.dir=$OUT/harness > $OUT/harness.txt 2>&1
echo "harness rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
import pandas as pd
from harness import results
try:
    df = results.load(os.path.join(os.environ["OUT"], "harness"))
    cols = [c for c in ("backend", "attention_kernel", "status", "latency_us_median", "stage_attention_us") if c in df]
    print(df[cols].sort_values(["backend", "attention_kernel"]).to_string(index=False))
except Exception as e:
    print("harness table:", e)
for name in ("bench", "bench2"):
    try:
        b = pd.read_parquet(os.path.join(os.environ["OUT"], name, "result.parquet"))
    except Exception as e:
        print(name, e); continue
    b["mode"] = b["cuda_graph"].map({True: "graph", False: "eager"})
    fm = b[b.kernel == "flashmla"].groupby(["case", "kv_dtype", "mode"])["latency_us_median"].first()
    ours = b[b.kernel != "flashmla"].copy()
    ours["fmla_us"] = [fm.get((c, k, m)) for c, k, m in zip(ours.case, ours.kv_dtype, ours["mode"])]
    ours["ratio"] = ours.latency_us_median / ours.fmla_us
    ours["splits"] = ours.launch_config.str.extract(r'"num_splits": (\d+)')
    print("==", name)
    print(ours[["case", "kv_dtype", "mode", "variant", "status", "splits", "latency_us_median", "fmla_us", "ratio", "max_rel_err"]]
          .sort_values(["kv_dtype", "case", "mode", "variant"]).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
PY
echo "total s=$SECONDS"
