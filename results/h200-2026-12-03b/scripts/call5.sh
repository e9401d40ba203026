#!/bin/bash
# Device call 5 (2026-12-03, second session): the final defaults end to end. The default sweep
# (wall time, set-up a point), the indexer selection inside the step, then the GPU tests of the
# kernels and paths this session changed. Run from the repository root after the device prefix.
set -u
SECONDS=0
python3 -m harness +sweep=page_topk backend=flashmla_sparse,hisparse > $OUT/sweep.txt 2>&1
echo "sweep rc=$? wall_s=$SECONDS" | tee -a $OUT/sweep.txt
grep -i "ok\|error\|setup\|set-up" $OUT/sweep.txt | tail -6
python3 -m harness selection=indexer steps=3 timing.warmup_steps=1 > $OUT/indexer_e2e.txt 2>&1
echo "indexer e2e rc=$?"; tail -8 $OUT/indexer_e2e.txt
timeout 300 python3 -m pytest -q -p no:xdist -m gpu tests/test_topk.py tests/test_topk_transform.py \
  tests/test_sparse_mla_decode.py tests/test_indexer.py tests/test_gpu_end_to_end.py \
  tests/test_flashmla_peer.py tests/test_hisparse_coordinator.py > $OUT/gpu_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -5 $OUT/gpu_tests.txt
