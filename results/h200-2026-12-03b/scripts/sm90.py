"""Shared helpers of this folder's compile scripts: a Triton kernel compiled for sm_90a by the
installed Triton (3.6 in /tmp/t36 for the GPU machine's figures), no GPU needed, and the
instruction count of its first loop's body in the PTX."""
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_sm90(fn, types, const, warps, stages=1, div=()):
    """``fn`` compiled for sm_90a: ``types`` maps argument names to Triton types (others
    ``i32``), ``const`` the constexprs; pointers and the arguments named in ``div`` carry the
    16-divisibility Triton specialises at launch."""
    names = list(fn.arg_names)
    signature, attrs = {}, {}
    for i, n in enumerate(names):
        if n in const:
            signature[n] = "constexpr"
            continue
        signature[n] = types.get(n, "i32")
        if signature[n].startswith("*") or n in div:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, attrs=attrs,
                    constexprs={(names.index(n),): v for n, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def loop_body(ptx):
    """``(instructions, bar.sync, shfl)`` between the PTX's first loop header and its
    back-branch."""
    lines = ptx.splitlines()
    start = next(i for i, l in enumerate(lines) if "Loop Header" in l)
    end = next(i for i in range(start + 1, len(lines))
               if re.search(r"bra(\.uni)?\s+\$L__BB0_\d+;", lines[i]))
    ins = [l for l in lines[start:end]
           if l.strip() and not l.strip().startswith(("$", "//", "{", "}", "."))]
    return len(ins), sum("bar.sync" in l for l in ins), sum("shfl" in l for l in ins)
