#!/bin/bash
# Device call h4: (1) GPU tests of the translation flush, the hugetlb pools and the cold mode end
# to end; (2) tlb34.py: the host pool's page size against cold translations; (3) the context
# bench, cycled and cold translations; (4) the layer step of both host-reading designs with
# timing.cold_host_translations false / true. Run from the repository root after the device
# prefix, with .whl, .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
H=/sys/kernel/mm/hugepages
echo 4 > $H/hugepages-1048576kB/nr_hugepages; echo 800 > $H/hugepages-2048kB/nr_hugepages
echo "hugetlb 1G nr=$(cat $H/hugepages-1048576kB/nr_hugepages) 2M nr=$(cat $H/hugepages-2048kB/nr_hugepages)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_translation_flush.py \
  tests/test_host_memory.py "tests/test_gpu_end_to_end.py::test_cold_host_translations" \
  "tests/test_gpu_end_to_end.py::test_both_backends_dsv32" > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
S=$SECONDS
timeout 150 python3 results/h200-2026-12-04h/scripts/tlb34.py 2 > $OUT/tlb34.txt 2>&1
echo "tlb34 rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 200 python3 -m harness.bench run swap_in --section context --host-alloc registered \
  --host-translations cycled,cold --contexts 16384,32768,65536,131072 --resolve-kernel cuda \
  --out $OUT/ctx > $OUT/ctx.txt 2>&1
echo "ctx rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 200 python3 -m harness -m backend=hisparse,hisparse_connector \
  timing.cold_host_translations=false,true top_k=2048 steps=6 report=false \
  hydra.sweep.dir=$OUT/step > $OUT/step.txt 2>&1
echo "step rc=$? s=$((SECONDS-S))"
python3 - <<'PY'
import os
from harness import results
df = results.load(os.environ["OUT"] + "/step")
cols = ["backend", "cold_host_translations", "status", "batch_size", "context_len",
        "latency_us_median", "latency_us_p10", "latency_us_p90"]
cols += [c for c in df.columns if c.startswith("stage_") and c.endswith("_us") and df[c].notna().any()]
print(df[cols].sort_values(["backend", "cold_host_translations"]).to_string(index=False))
PY
sed -n '/^pool_GiB/,$p' $OUT/tlb34.txt
sed -n '/equal misses vs context/,/^$/p' $OUT/ctx.txt
echo "total s=$SECONDS"
