#!/bin/bash
# Device call 5 (2026-12-03, third session): the final code on the GPU: the extend step with the
# fp8 index query (the ragged indexer's fp8 path inside the step), the decode step with the
# indexer selection, and the GPU tests of the files changed since call 2. Run from the
# repository root after the device prefix, with .whl/ and .peer_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 120 python3 -m harness phase=extend steps=2 timing.warmup_steps=1 report=false \
  hydra.run.dir=$OUT/extend_fp8 > $OUT/extend.txt 2>&1
echo "extend (fp8 query) rc=$? s=$SECONDS"; grep -E "ok |incorrect|error" $OUT/extend.txt | cut -c1-200 | tail -4
S=$SECONDS
timeout 240 python3 -m pytest -q -p no:xdist -m gpu tests/test_extend.py tests/test_indexer.py \
  tests/test_hisparse_coordinator.py tests/test_host_memory.py tests/test_copy_engines.py \
  tests/test_gpu_end_to_end.py tests/test_sglang_peer.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$? s=$((SECONDS-S))"; tail -4 $OUT/gpu_tests.txt
echo "total s=$SECONDS"
