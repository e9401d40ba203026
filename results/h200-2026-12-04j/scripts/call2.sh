#!/bin/bash
# Device call j2: fp16 partials with the combine's programs spanning several column ranges (a
# weight a word's range): GPU tests of both decode kernels; `attention --tune` with ws,
# ws_bf16p, ws_f16p at the small and split shapes, two rounds; fp8_ds_mla tiles with scales of
# 2^8 and more in each kernel (scripts/range47.py). Run from the repository root after the
# device prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 60 python3 results/h200-2026-12-04j/scripts/range47.py > $OUT/range47.txt 2>&1
echo "range rc=$? s=$SECONDS"; cat $OUT/range47.txt | tail -25
S=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_mla_decode_ws.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; grep -E "^FAILED|^ERROR|passed|failed|^E  " $OUT/gpu_tests.txt | tail -12
for r in 1 2; do
S=$SECONDS
timeout 130 python3 -m harness.bench run attention --tune --out $OUT/bench$r \
  --shapes B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048,B16_H128_k2048,B32_H128_k2048,B4_H16_k2048,B8_H16_k2048 \
  --variants ws,ws_bf16p,ws_f16p > $OUT/bench$r.txt 2>&1
echo "bench$r rc=$? s=$((SECONDS-S))"
done
python3 - <<'PY'
import os
import pandas as pd
rows = []
for r in (1, 2):
    try:
        b = pd.read_parquet(os.path.join(os.environ["OUT"], f"bench{r}", "result.parquet"))
    except Exception as e:
        print(r, e); continue
    b["mode"] = b["cuda_graph"].map({True: "graph", False: "eager"})
    fm = b[b.kernel == "flashmla"].groupby(["case", "kv_dtype", "mode"])["latency_us_median"].first()
    ours = b[b.kernel != "flashmla"].copy()
    ours["fmla"] = [fm.get((c, k, m)) for c, k, m in zip(ours.case, ours.kv_dtype, ours["mode"])]
    ours["ratio"] = ours.latency_us_median / ours.fmla
    ours["round"] = r
    rows.append(ours)
d = pd.concat(rows)
d["cell"] = [f"{u:.1f}/{f:.1f}={x:.3f}" for u, f, x in zip(d.latency_us_median, d.fmla, d.ratio)]
t = d.pivot_table(index=["kv_dtype", "case", "mode", "round"], columns="variant", values="cell", aggfunc="first")
e = d.pivot_table(index=["kv_dtype", "case"], columns="variant", values="max_rel_err", aggfunc="max")
pd.set_option("display.width", 250)
print(t.to_string()); print(e.to_string(float_format=lambda x: f"{x:.4g}"))
PY
echo "total s=$SECONDS"
