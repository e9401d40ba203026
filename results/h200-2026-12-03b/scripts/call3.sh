#!/bin/bash
# Device call 3 (2026-12-03, second session): GPU tests of the top-k and attention changes, the
# top-k stages and variants, the attention tuning grid beside FlashMLA, the zero-copy gather.
# Run from the repository root after the device prefix (PYTHONPATH=/tmp/site:$PWD).
set -u
python3 -m pytest -q -p no:xdist -m gpu tests/test_topk.py tests/test_sparse_mla_decode.py > $OUT/gpu_tests.txt 2>&1
tail -3 $OUT/gpu_tests.txt
python3 results/h200-2026-12-03b/scripts/topk_stages.py > $OUT/topk_stages.txt 2>&1
tail -26 $OUT/topk_stages.txt
python3 -m harness.bench run indexer --variants --contexts 32768 131072 --out $OUT/indexer > $OUT/indexer_variants.txt 2>&1
grep "topk_per_row\|torch.topk" $OUT/indexer_variants.txt | grep -v "^\[" | awk '{print $1, $2, $(NF-9), $(NF-8)}' | head -70
python3 -m harness.bench run attention --tune --shapes B128_H128_k2048,B128_H16_k2048,B1_H128_k2048,B2_H128_k2048,B4_H128_k2048,B8_H128_k2048 --out $OUT/attention > $OUT/attention_tune.txt 2>&1
tail -45 $OUT/attention_tune.txt
python3 -m harness.bench run swap_in --section gather --gather-pools 1048576 --out $OUT/gather > $OUT/gather.txt 2>&1
tail -30 $OUT/gather.txt
