#!/bin/bash
# Device call 2 (2026-12-03, third session): the swap-in with PTX only on the miss path (the new
# default) beside the other launches and SGLang's kernel; the indexer variants with the fp8
# query's prefetch default; the fp8 index query inside the step; CUDA-graph replay vs eager with
# the PDL copy; then the whole GPU test suite. Run from the repository root after the device
# prefix, with .whl/ and .peer_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 150 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$SECONDS"
S=$SECONDS
timeout 150 python3 -m harness.bench run indexer --variants --contexts 32768 131072 --out $OUT/indexer > $OUT/indexer.txt 2>&1
echo "indexer rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 120 python3 -m harness selection=indexer steps=3 timing.warmup_steps=1 hydra.run.dir=$OUT/e2e_fp8 > $OUT/indexer_e2e.txt 2>&1
echo "indexer e2e (fp8 query) rc=$? s=$((SECONDS-S))"; grep -E "median|error|Error" $OUT/indexer_e2e.txt | cut -c1-200 | tail -4
S=$SECONDS
timeout 150 python3 -m harness -m timing.cuda_graph=false,true backend=hisparse,hisparse_connector,flashmla_sparse top_k=512,2048 steps=8 timing.warmup_steps=2 hydra.sweep.dir=$OUT/graph > $OUT/graph.txt 2>&1
echo "graph vs eager rc=$? s=$((SECONDS-S))"; grep -E "median" $OUT/graph.txt | cut -c1-160
S=$SECONDS
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/ > $OUT/gpu_tests.txt 2>&1
echo "gpu suite rc=$? s=$((SECONDS-S))"; tail -6 $OUT/gpu_tests.txt
echo "== swap_in_peer"; grep -E "ok [0-9.]+ us" $OUT/swap_in_peer.txt | grep -v "position" | cut -c1-120
echo "== indexer"; grep -E "^ +[0-9]+ indexer" $OUT/indexer.txt | head -12; grep -E "^ +[0-9]+ indexer" $OUT/indexer.txt | grep -E "q_fp8|default" | head -20
echo "total s=$SECONDS"
