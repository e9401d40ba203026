#!/bin/bash
# Device call h7: after hugetlb_shortage / hugetlb_free_pages came to serve the mapping, the
# bench and the doctor: the host-memory and flush GPU tests with huge pages reserved, and the
# bench's hugetlb skip / host facts. Run from the repository root after the device prefix.
set -u
mkdir -p $OUT
SECONDS=0
H=/sys/kernel/mm/hugepages
echo 2 > $H/hugepages-1048576kB/nr_hugepages; echo 200 > $H/hugepages-2048kB/nr_hugepages
echo "hugetlb 1G nr=$(cat $H/hugepages-1048576kB/nr_hugepages) 2M nr=$(cat $H/hugepages-2048kB/nr_hugepages)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_memory.py \
  tests/test_host_translation_flush.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$SECONDS"; grep -E "^FAILED|^ERROR|passed|failed" $OUT/gpu_tests.txt | tail -4
timeout 120 python3 -m harness.bench run swap_in --quick --section context \
  --host-alloc hugetlb_2m,hugetlb_1g --out $OUT/q > $OUT/q.txt 2>&1
echo "bench rc=$?"; grep -E "host:|skipped|huge pages|rows ->" $OUT/q.txt | head -8
