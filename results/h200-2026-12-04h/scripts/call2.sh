#!/bin/bash
# Device call h2: (1) explicit huge pages for the host pool: 1 GiB and 2 MiB pages reserved in
# this (fresh, disposable) VM's kernel, the host-memory GPU tests on them, and the swap-in at
# equal misses against context (batch 32, 16K / 64K / 128K) from a registered, a THP, a 2 MiB
# hugetlb and a 1 GiB hugetlb pool; (2) small-batch fp8 split counts as CUDA-graph replays
# (graph32.py). Run from the repository root after the device prefix, with .whl, .peer_build and
# .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
H=/sys/kernel/mm/hugepages
echo 8 > $H/hugepages-1048576kB/nr_hugepages; echo 2048 > $H/hugepages-2048kB/nr_hugepages
echo "hugetlb 1G nr=$(cat $H/hugepages-1048576kB/nr_hugepages) 2M nr=$(cat $H/hugepages-2048kB/nr_hugepages)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_memory.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_host_memory.py tests/test_env.py -k "hugetlb or virtualized" > $OUT/cpu_tests.txt 2>&1
echo "cpu-side tests rc=$?"; grep -E "^FAILED|^SKIPPED|passed|failed" $OUT/cpu_tests.txt | tail -4
S=$SECONDS
timeout 240 python3 -m harness.bench run swap_in --section context \
  --host-alloc registered,thp,hugetlb_2m,hugetlb_1g --contexts 16384,65536,131072 \
  --resolve-kernel cuda --out $OUT/ctx > $OUT/ctx.txt 2>&1
echo "ctx rc=$? s=$((SECONDS-S))"
grep "host:" $OUT/ctx.txt | head -2
S=$SECONDS
timeout 200 python3 results/h200-2026-12-04h/scripts/graph32.py 2 > $OUT/graph32.txt 2>&1
echo "graph32 rc=$? s=$((SECONDS-S))"
cat $OUT/graph32.txt | tail -40
sed -n '/equal misses vs context/,/^$/p' $OUT/ctx.txt
tail -3 $OUT/ctx.txt
echo "total s=$SECONDS"
