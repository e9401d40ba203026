"""Instructions per element of a compaction loop compiled for sm_90a by Triton 3.6 (no GPU):
the 1-D block-wide prefix sum (`scan1d`), the per-thread-row one (`scan2d`, rows of C values)
and the same comparing float values (`2df` rows). Run as compile_scan.py, no arguments.
"""
import triton
import triton.language as tl

from sm90 import compile_sm90, loop_body

KEY_TYPES = {"x_ptr": "*fp32", "out_ptr": "*i32", "cnt_ptr": "*i32", "t": "u32"}
FLOAT_TYPES = {"x_ptr": "*fp32", "out_ptr": "*i32", "cnt_ptr": "*i32", "t": "fp32"}

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
def scan2d(x_ptr, out_ptr, cnt_ptr, n, t, BLOCK: tl.constexpr, C: tl.constexpr,
           FLOAT: tl.constexpr):
    """Rows of C values a thread: prefix sums within the row, then across the row totals;
    FLOAT: ``t`` is the threshold's float (the values compared directly), else its key."""
    cnt = 0
    R: tl.constexpr = BLOCK // C
    for it in range(0, n // BLOCK):
        p = it * BLOCK + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
        v = tl.load(x_ptr + p)
        if FLOAT:
            sel = (v >= t).to(tl.int32)
        else:
            sel = (_key(v) >= t).to(tl.int32)
        inrow = tl.cumsum(sel, axis=1)
        rows = tl.sum(sel, axis=1)
        rowpre = tl.cumsum(rows, axis=0) - rows
        slot = cnt + rowpre[:, None] + inrow - 1
        tl.store(out_ptr + slot, p, mask=sel > 0)
        cnt += tl.sum(rows, axis=0)
    tl.store(cnt_ptr, cnt)


def per_element(name, fn, types, const, blk, w):
    b = loop_body(compile_sm90(fn, types, const, w).asm["ptx"])
    print(name, blk, w, const.get("C", ""), "insts/bar/shfl", b, "per elem/thread",
          round(b[0] / (blk / (32 * w)), 1))


for blk, w in [(2048, 4), (1024, 4), (4096, 8)]:
    per_element("1d", scan1d, KEY_TYPES, dict(BLOCK=blk), blk, w)
    for C in (4, 8, 16):
        per_element("2d", scan2d, KEY_TYPES, dict(BLOCK=blk, C=C, FLOAT=False), blk, w)
    per_element("2df", scan2d, FLOAT_TYPES, dict(BLOCK=blk, C=4, FLOAT=True), blk, w)
