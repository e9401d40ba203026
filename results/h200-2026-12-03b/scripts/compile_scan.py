"""The top-k scan kernel compiled for sm_90a by Triton 3.6 on the CPU machine (no GPU): shared
memory and counts of asynchronous copies, global loads, barriers and shuffles in its PTX.

    env -u TRITON_INTERPRET PYTHONPATH=$PWD /tmp/t36/bin/python \
        results/h200-2026-12-03b/scripts/compile_scan.py BLOCK WARPS STAGES

(/tmp/t36: `python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 numpy torch==2.13.0`.)
"""
import re
import sys

from backends.kernels import topk as T
from sm90 import compile_sm90

block = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
warps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
stages = int(sys.argv[3]) if len(sys.argv) > 3 else 4
sig = dict(logits_ptr="*fp32", len_ptr="*i32", chunks_ptr="*i32", thr_ptr="*i32", cand_ptr="*i32", cnt_ptr="*i32")
const = dict(LLO_N=3, LLO_D=4, LHI_N=3, LHI_D=2, CAP=8192, BLOCK=block, FUSE_THRESHOLD=False, SAMPLE=2048, RADIX_BITS=1, WINDOW=True, WLO_N=1, WLO_D=1, WHI_N=9, WHI_D=8)
k = compile_sm90(T._topk_scan_kernel, sig, const, warps, stages,
                 div=("stride_l", "chunk_size", "n_cols", "max_chunks"))
ttgir = k.asm["ttgir"]
open(f"/tmp/scan_{block}_{warps}_{stages}.ttgir", "w").write(ttgir)
open(f"/tmp/scan_{block}_{warps}_{stages}.ptx", "w").write(k.asm["ptx"])
print("shared", k.metadata.shared, "async_copy", ttgir.count("async_copy_global_to_local"), "local_alloc", ttgir.count("local_alloc"), "regs?", )
ptx = k.asm["ptx"]
print("ld.global", len(re.findall(r"ld\.global", ptx)), "cp.async", len(re.findall(r"cp\.async", ptx)), "bar.sync", len(re.findall(r"bar\.sync", ptx)), "shfl", len(re.findall(r"shfl", ptx)))
