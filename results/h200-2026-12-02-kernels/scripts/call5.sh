python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
S=$(date +%s.%N)
python3 -m harness +sweep=page_topk backend=flashmla_sparse,hisparse hydra.sweep.dir=/tmp/sw > $OUT/sweep.log 2>&1
E=$(date +%s.%N); echo "sweep wall s: $(python3 -c "print(round($E-$S,1))") rc=$?" | tee $OUT/sweep_time.txt
python3 - <<'PY' | tee $OUT/sweep_summary.txt
import glob, pandas as pd
fs = [f for f in glob.glob('/tmp/sw/**/result.parquet', recursive=True)]
d = pd.concat([pd.read_parquet(f) for f in fs])
print(len(fs), "points", len(d), "rows"); print(d.groupby(['backend','status']).size())
cols = [c for c in ('setup_s','first_step_s','later_steps_s','final_check_s','teardown_s') if c in d]
print(d.groupby('backend')[cols].sum().round(1)); print(d.groupby('backend')['setup_s'].max().round(2))
PY
python3 -m harness selection=indexer steps=3 timing.warmup_steps=1 hydra.run.dir=/tmp/e2e > $OUT/e2e.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_parquet('/tmp/e2e/result.parquet'); print(d[['backend','status','error']].to_string())" | tee $OUT/e2e_status.txt
timeout 330 python3 -m pytest -q -m gpu tests/test_topk.py tests/test_indexer.py tests/test_sglang_peer.py tests/test_gpu_end_to_end.py > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$?"; tail -4 $OUT/gpu_tests.txt
