#!/bin/bash
# Device call h6: the capacity sweep's offloading designs (TP1, 4K..128K, each at the batch it
# can hold under the 50 GB budget) with the host-address translations as the run leaves them and
# cold before each sample. Run from the repository root after the device prefix, with .whl,
# .peer_build and .kernel_build carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 560 python3 -m harness +sweep=capacity backend=hisparse,hisparse_connector \
  capacity.tp_size=1 timing.cold_host_translations=false,true report=false \
  hydra.sweep.dir=$OUT/cap > $OUT/cap.txt 2>&1
echo "cap rc=$? s=$SECONDS"
python3 - <<'PY'
import os
from harness import results
df = results.load(os.environ["OUT"] + "/cap")
cols = [c for c in ["backend", "context_len", "cold_host_translations", "status", "batch_size",
                    "latency_us_median", "stage_swap_in_us", "stage_resolve_us",
                    "stage_attention_us", "tpot_ms", "tokens_per_s", "decode_tok_s_per_gpu",
                    "host_bytes", "misses"] if c in df.columns]
print(df[cols].sort_values(["backend", "context_len", "cold_host_translations"]).to_string(index=False))
print([c for c in df.columns if "tok" in c or "tpot" in c])
PY
grep -i "error\|Traceback" $OUT/cap.txt | head -5
echo "total s=$SECONDS"
