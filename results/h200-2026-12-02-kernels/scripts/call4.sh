python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
git log --oneline | head -1
python3 -m harness.bench run indexer --variants --contexts 32768 131072 --out $OUT/idx > $OUT/idx.txt 2>&1
grep -E "^(indexer_logits_paged (default|tma_prefetch)|topk_per_row|torch.topk)" $OUT/idx.txt
python3 results/h200-2026-12-02-kernels/scripts/topk_breakdown.py > $OUT/topk.txt 2>&1; grep -A9 "^ctx  stage" $OUT/topk.txt
