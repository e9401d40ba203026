python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
python3 results/h200-2026-12-02-kernels/scripts/diag2.py > $OUT/diag2.txt 2>&1; tail -45 $OUT/diag2.txt
SECS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section SourceCounters"
timeout 200 ncu $SECS -k regex:resolve_swap_in --launch-skip 2 --launch-count 1 python3 results/h200-2026-12-02-kernels/scripts/ncu_prog.py > $OUT/ncu_resolve.txt 2>&1
timeout 200 ncu $SECS -k regex:_topk_ --launch-skip 3 --launch-count 3 python3 results/h200-2026-12-02-kernels/scripts/ncu_prog.py > $OUT/ncu_topk32k.txt 2>&1
timeout 200 ncu $SECS -k regex:_topk_ --launch-skip 9 --launch-count 3 python3 results/h200-2026-12-02-kernels/scripts/ncu_prog.py > $OUT/ncu_topk128k.txt 2>&1
grep -E "Duration|Stall|Warp Cycles Per Issued|Issued Ipc|Memory Throughput|Registers|Achieved Occupancy|==PROF==|==ERROR" $OUT/ncu_resolve.txt | head -30
