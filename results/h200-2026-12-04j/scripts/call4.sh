#!/bin/bash
# Device call j4: the final code (scaled fp16 split partials the ws kernel's default; combine
# programs of 2048 words): the A/B of float32 / bf16 / fp16 partials (scripts/ws_ab49.py, three
# rounds); `attention --tune` with ws (fp16), ws_f32p, ws_bf16p at the small and split shapes;
# the harness at dsv32's defaults with the three attention names; then the whole GPU suite.
# Run from the repository root after the device prefix, with .whl, .peer_build and
# .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 80 python3 results/h200-2026-12-04j/scripts/ws_ab49.py 3 > $OUT/ws_ab49.txt 2>&1
echo "ab rc=$? s=$SECONDS"; sed -n '/^summary/,$p' $OUT/ws_ab49.txt; echo "BAD rows: $(grep -c BAD $OUT/ws_ab49.txt)"
S=$SECONDS
timeout 80 python3 -m harness.bench run attention --tune --out $OUT/bench \
  --shapes B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048,B16_H128_k2048,B32_H128_k2048,B4_H16_k2048,B8_H16_k2048 \
  --variants ws,ws_f32p,ws_bf16p > $OUT/bench.txt 2>&1
echo "bench rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 60 python3 -m harness -m attention_kernel=triton_ws,triton_ws_f32p,triton_ws_bf16p top_k=2048 steps=6 \
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
try:
    b = pd.read_parquet(os.path.join(os.environ["OUT"], "bench", "result.parquet"))
    b["mode"] = b["cuda_graph"].map({True: "graph", False: "eager"})
    fm = b[b.kernel == "flashmla"].groupby(["case", "kv_dtype", "mode"])["latency_us_median"].first()
    ours = b[b.kernel != "flashmla"].copy()
    ours["fmla"] = [fm.get((c, k, m)) for c, k, m in zip(ours.case, ours.kv_dtype, ours["mode"])]
    ours["cell"] = [f"{u:.1f}/{f:.1f}={u / f:.3f}" for u, f in zip(ours.latency_us_median, ours.fmla)]
    ours["splits"] = ours.launch_config.str.extract(r'"num_splits": (\d+)')[0]
    pd.set_option("display.width", 250)
    print(ours.pivot_table(index=["kv_dtype", "case", "mode"], columns="variant", values="cell", aggfunc="first").to_string())
    print(ours.pivot_table(index=["kv_dtype", "case"], columns="variant", values="max_rel_err", aggfunc="max").to_string(float_format=lambda x: f"{x:.4g}"))
    print(ours.pivot_table(index=["kv_dtype", "case"], columns="variant", values="splits", aggfunc="first").to_string())
    print("statuses:", ours.status.value_counts().to_dict())
except Exception as e:
    print("bench table:", e)
PY
S=$SECONDS
timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu tests > $OUT/gpu_suite.txt 2>&1
echo "gpu suite rc=$? s=$((SECONDS-S))"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_suite.txt | tail -12
echo "total s=$SECONDS"
