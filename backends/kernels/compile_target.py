"""Compiling a kernel for a GPU target without a GPU: what the installed Triton makes of a
launch (PTX, cubin, shared memory), for tests and reports that inspect the code, not run it.
Used by each kernel module's ``compile_for_*`` function."""
from __future__ import annotations

from typing import Dict, Iterable


def compile_for_target(fn, const: Dict[str, object], ptrs: Dict[str, str],
                       divisible: Iterable[str], *, floats: Iterable[str] = (),
                       arch: int = 90, gluon: bool = False, **options):
    """``fn`` (a ``@triton.jit`` or, with ``gluon``, a ``@gluon.jit`` function) compiled for
    CUDA compute capability ``arch`` (90: sm_90a) by the installed Triton: a
    ``triton.compiler.CompiledKernel`` (``asm["ttgir" | "ptx" | "cubin"]``, ``metadata``).

    ``const``: the compile-time arguments (names to values); ``ptrs``: the pointer arguments'
    types (``"*bf16"``, ``"*u8"``, ...), all 16-byte aligned as torch allocates; ``floats``:
    the float32 scalars; every other argument an int32 scalar, specialised as divisible by 16
    where named in ``divisible`` (as Triton does for a launch's values); ``options``: the
    compile options (``num_warps``, ``num_stages``, ``maxnreg``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    names = list(fn.arg_names)
    divisible, floats = set(divisible), set(floats)
    signature, attrs = {}, {}
    for i, n in enumerate(names):
        if n in const:
            signature[n] = "constexpr"
            continue
        signature[n] = ptrs.get(n, "fp32" if n in floats else "i32")
        if n in ptrs or n in divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = Source(fn=fn, signature=signature, attrs=attrs,
                 constexprs={(names.index(n),): v for n, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
