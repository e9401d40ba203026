"""The top-k select kernel compiled for sm_90a by Triton 3.6 (no GPU): shared memory, barriers,
atomics, and registers / spills from the bundled cuobjdump.

    env -u TRITON_INTERPRET PYTHONPATH=$PWD /tmp/t36/bin/python \
        results/h200-2026-12-03b/scripts/compile_select.py CAP SMALL CHUNKS [WARPS]
"""
import re
import subprocess
import sys
import tempfile

from backends.kernels import topk as T
from sm90 import compile_sm90

cap = int(sys.argv[1]); small = int(sys.argv[2]); chunks = int(sys.argv[3])
sig = dict(logits_ptr="*fp32", len_ptr="*i32", chunks_ptr="*i32", cand_ptr="*i32", cnt_ptr="*i32", out_ptr="*i32", bt_ptr="*i32", req_ptr="*i32", off_ptr="*i32")
const = dict(METHOD=0, HAS_REQ=False, CAP=cap, BLOCK=2048, RADIX_BITS=1, STRIDE=8192, CHUNKS=chunks, SMALL=small)
k = compile_sm90(T._topk_select_kernel, sig, const, int(sys.argv[4]) if len(sys.argv) > 4 else 8, 3, div=("stride_l","n_cols","max_chunks","chunk_size","stride_o"))
ptx = k.asm["ptx"]
print("cap", cap, "small", small, "chunks", chunks, "shared", k.metadata.shared, "n_regs", getattr(k, "n_regs", None), "spills", getattr(k, "n_spills", None), "bar.sync", len(re.findall(r"bar\.sync", ptx)), "atom", len(re.findall(r"atom\.", ptx)))
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(k.asm["cubin"]); f.close()
print(subprocess.run(["/tmp/t36/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout.strip().splitlines()[-1])
