"""Instructions per element of a compaction loop compiled for sm_90a by Triton 3.6 (no GPU):
the 1-D block-wide prefix sum (`scan1d`), the per-thread-row one (`scan2d`, rows of C values)
and the same comparing float values (`scan2df`). Run as compile_scan.py, no arguments.
"""
import sys, re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

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

def comp(fn, const, warps):
    names = list(fn.arg_names)
    sig = {}; attrs = {}
    for i, nm in enumerate(names):
        if nm in const: sig[nm] = "constexpr"
        elif nm.endswith("ptr"): sig[nm] = "*fp32" if nm == "x_ptr" else "*i32"; attrs[(i,)] = [["tt.divisibility", 16]]
        elif nm == "t": sig[nm] = "u32"
        else: sig[nm] = "i32"; attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, attrs=attrs, constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=1))

def body(ptx):
    # instructions in the innermost loop (between the loop header label and its back-branch)
    lines = ptx.splitlines()
    start = next(i for i, l in enumerate(lines) if "Loop Header" in l)
    end = next(i for i in range(start, len(lines)) if re.search(r"bra(\.uni)?\s+\$L__BB0_\d+;", lines[i]) and i > start)
    ins = [l for l in lines[start:end] if l.strip() and not l.strip().startswith(("$", "//", "{", "}", "."))]
    return len(ins), sum("bar.sync" in l for l in ins), sum("shfl" in l for l in ins)

for blk, w in [(2048, 4), (1024, 4), (4096, 8)]:
    k = comp(scan1d, dict(BLOCK=blk), w)
    print("1d", blk, w, "insts/bar/shfl", body(k.asm["ptx"]), "per elem/thread", round(body(k.asm["ptx"])[0] / (blk / (32 * w)), 1))
    for C in (4, 8, 16):
        k = comp(scan2d, dict(BLOCK=blk, C=C), w)
        print("2d", blk, w, C, "insts/bar/shfl", body(k.asm["ptx"]), "per elem/thread", round(body(k.asm["ptx"])[0] / (blk / (32 * w)), 1))

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

def comp2(fn, const, warps):
    names = list(fn.arg_names)
    sig = {}; attrs = {}
    for i, nm in enumerate(names):
        if nm in const: sig[nm] = "constexpr"
        elif nm.endswith("ptr"): sig[nm] = "*fp32" if nm == "x_ptr" else "*i32"; attrs[(i,)] = [["tt.divisibility", 16]]
        elif nm == "tf": sig[nm] = "fp32"
        else: sig[nm] = "i32"; attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, attrs=attrs, constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=1))
for blk, w in [(2048, 4), (1024, 4), (4096, 8)]:
    for C in (4,):
        k = comp2(scan2df, dict(BLOCK=blk, C=C), w)
        b = body(k.asm["ptx"])
        print("2df", blk, w, C, "insts/bar/shfl", b, "per elem/thread", round(b[0] / (blk / (32 * w)), 1))
        if blk == 2048: open("/tmp/scan2df.ptx", "w").write(k.asm["ptx"]); open("/tmp/scan2df.ttgir", "w").write(k.asm["ttgir"])
