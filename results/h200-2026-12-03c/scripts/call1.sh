#!/bin/bash
# Device call 1 (2026-12-03, third session): the default sweep on a fresh machine (wall time,
# set-up a point with the UVA fill), the swap-in launch variants beside SGLang's kernel, the
# indexer variants (fp8 query), then the GPU tests of what changed. Run from the repository root
# after the device prefix, with .whl/ and .peer_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m harness +sweep=page_topk backend=flashmla_sparse,hisparse > $OUT/sweep.txt 2>&1
echo "sweep rc=$? wall_s=$SECONDS" | tee -a $OUT/sweep.txt
grep -o "set-up [0-9.]* s" $OUT/sweep.txt | sort -t' ' -k2 -n | tail -2
S=$SECONDS
timeout 150 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 150 python3 -m harness.bench run indexer --variants --contexts 32768 131072 --out $OUT/indexer > $OUT/indexer.txt 2>&1
echo "indexer rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:xdist -m gpu tests/test_topk.py tests/test_host_memory.py \
  tests/test_hisparse_coordinator.py tests/test_copy_engines.py tests/test_sglang_peer.py \
  tests/test_hisparse_connector.py tests/test_indexer.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; tail -4 $OUT/gpu_tests.txt
timeout 60 python3 -m pytest -q -p no:xdist tests/test_indexer.py -k "gpu or identity" > $OUT/gpu_indexer_identity.txt 2>&1
echo "indexer identity rc=$?"; tail -2 $OUT/gpu_indexer_identity.txt
timeout 60 python3 -m pytest -q -p no:xdist tests/test_hisparse_coordinator.py tests/test_copy_engines.py \
  -k "launch_option or pdl" > $OUT/gpu_launch_tests.txt 2>&1
echo "launch tests rc=$?"; tail -2 $OUT/gpu_launch_tests.txt
echo "== swap_in_peer"; grep -E "all_hits|all_misses|steady_state" $OUT/swap_in_peer.txt | cut -c1-150 | head -40
echo "== indexer"; head -45 $OUT/indexer.txt | cut -c1-150
echo "total s=$SECONDS"
