"""The select's k-th-key bisection, one bit a step (`bisect1`, the kernel's) against two bits
a step from three probes counted in one 2-D reduction (`bisect2`), compiled for sm_90a by
Triton 3.6 (no GPU): instructions, barriers and shuffles of one step. Run as compile_scan.py.
"""
import triton
import triton.language as tl

from backends.kernels.topk import _common_prefix
from sm90 import compile_sm90, loop_body

@triton.jit
def bisect1(key_ptr, out_ptr, k, NB: tl.constexpr):
    key = tl.load(key_ptr + tl.arange(0, NB)).to(tl.uint32, bitcast=True)
    T, nbits = _common_prefix(key)
    bit = tl.where(nbits > 0, tl.full([], 1, tl.uint32) << (tl.maximum(nbits, 1) - 1).to(tl.uint32), 0)
    for _ in range(0, nbits):
        cand = T | bit
        cnt = tl.sum((key >= cand).to(tl.int32), axis=0)
        T = tl.where(cnt >= k, cand, T)
        bit = bit >> 1
    tl.store(out_ptr, T.to(tl.int32, bitcast=True))

@triton.jit
def bisect2(key_ptr, out_ptr, k, NB: tl.constexpr):
    key = tl.load(key_ptr + tl.arange(0, NB)).to(tl.uint32, bitcast=True)
    T, nbits = _common_prefix(key)
    steps = (nbits + 1) // 2
    sh = (2 * steps - 2).to(tl.uint32)
    d = tl.arange(0, 4).to(tl.uint32)
    for _ in range(0, steps):
        base = T & ~(tl.full([], 3, tl.uint32) << sh)
        cands = base | (d << sh)
        cnts = tl.sum((key[:, None] >= cands[None, :]).to(tl.int32), axis=0)
        best = tl.max(tl.where(cnts >= k, d, 0), axis=0)
        T = base | (best << sh)
        sh = sh - 2
    tl.store(out_ptr, T.to(tl.int32, bitcast=True))

for nb, w in [(8192, 8), (4096, 8)]:
    for fn in (bisect1, bisect2):
        k = compile_sm90(fn, {"key_ptr": "*i32", "out_ptr": "*i32"}, dict(NB=nb), w)
        print(fn.__name__, nb, w, "loop insts/bar/shfl", loop_body(k.asm["ptx"]), "smem", k.metadata.shared)
