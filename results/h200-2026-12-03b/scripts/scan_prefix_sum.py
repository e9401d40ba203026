"""Instructions per element of a compaction loop compiled for sm_90a by Triton 3.6 (no GPU):
the 1-D block-wide prefix sum (`scan1d`), the per-thread-row one (`scan2d`, rows of C values)
and the same comparing float values (`scan2df`). Run as compile_scan.py, no arguments.
"""
import triton
import triton.language as tl

from sm90 import compile_sm90, loop_body

KEY_TYPES = {"x_ptr": "*fp32", "out_ptr": "*i32", "cnt_ptr": "*i32", "t": "u32"}
FLOAT_TYPES = {"x_ptr": "*fp32", "out_ptr": "*i32", "cnt_ptr": "*i32", "tf": "fp32"}

@triton.jit
def _key(v):
    bits = v.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)
    flip = (bits >> 31) | -2147483648
    return (bits ^ flip).to(tl.uint32, bitcast=True)

@triton.jit
def scan1d(x_ptr, out_ptr, cnt_ptr, n, t, BLOCK: tl.constexpr):
    cnt = 0
    for it in range(0, n // BLOCK):
        p = it * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + p)
        sel = _key(v) >= t
        slot = cnt + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + slot, p, mask=sel)
        cnt += tl.sum(sel.to(tl.int32), axis=0)
    tl.store(cnt_ptr, cnt)

@triton.jit
def scan2d(x_ptr, out_ptr, cnt_ptr, n, t, BLOCK: tl.constexpr, C: tl.constexpr):
    cnt = 0
    R: tl.constexpr = BLOCK // C
    for it in range(0, n // BLOCK):
        p = it * BLOCK + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
        v = tl.load(x_ptr + p)
        sel = (_key(v) >= t).to(tl.int32)
        inrow = tl.cumsum(sel, axis=1)
        rows = tl.sum(sel, axis=1)
        rowpre = tl.cumsum(rows, axis=0) - rows
        slot = cnt + rowpre[:, None] + inrow - 1
        tl.store(out_ptr + slot, p, mask=sel > 0)
        cnt += tl.sum(rows, axis=0)
    tl.store(cnt_ptr, cnt)

for blk, w in [(2048, 4), (1024, 4), (4096, 8)]:
    b = loop_body(compile_sm90(scan1d, KEY_TYPES, dict(BLOCK=blk), w).asm["ptx"])
    print("1d", blk, w, "insts/bar/shfl", b, "per elem/thread", round(b[0] / (blk / (32 * w)), 1))
    for C in (4, 8, 16):
        b = loop_body(compile_sm90(scan2d, KEY_TYPES, dict(BLOCK=blk, C=C), w).asm["ptx"])
        print("2d", blk, w, C, "insts/bar/shfl", b, "per elem/thread", round(b[0] / (blk / (32 * w)), 1))

@triton.jit
def scan2df(x_ptr, out_ptr, cnt_ptr, n, tf, BLOCK: tl.constexpr, C: tl.constexpr):
    cnt = 0
    R: tl.constexpr = BLOCK // C
    for it in range(0, n // BLOCK):
        p = it * BLOCK + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
        v = tl.load(x_ptr + p)
        sel = (v >= tf).to(tl.int32)
        inrow = tl.cumsum(sel, axis=1)
        rows = tl.sum(sel, axis=1)
        rowpre = tl.cumsum(rows, axis=0) - rows
        slot = cnt + rowpre[:, None] + inrow - 1
        tl.store(out_ptr + slot, p, mask=sel > 0)
        cnt += tl.sum(rows, axis=0)
    tl.store(cnt_ptr, cnt)

for blk, w in [(2048, 4), (1024, 4), (4096, 8)]:
    for C in (4,):
        k = compile_sm90(scan2df, FLOAT_TYPES, dict(BLOCK=blk, C=C), w)
        b = loop_body(k.asm["ptx"])
        print("2df", blk, w, C, "insts/bar/shfl", b, "per elem/thread", round(b[0] / (blk / (32 * w)), 1))
        if blk == 2048: open("/tmp/scan2df.ptx", "w").write(k.asm["ptx"]); open("/tmp/scan2df.ttgir", "w").write(k.asm["ttgir"])
