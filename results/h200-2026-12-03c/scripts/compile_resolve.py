"""The swap-in resolve (upstream order, token mode, top_k 2048, 4096 hot slots) compiled for
sm_90a by Triton 3.6 on the CPU machine (no GPU), per ``PTX_SCATTER`` (0 none, 1 the miss path's
stores, the default, 2 every scattered store): the whole
kernel and its all-hit path (the kernel with the ``n_lost > 0`` and ``n_miss > 0`` branches cut
out, what an all-hit call of distinct entries executes), per warp count; then the copy kernel with
``WAIT_PRIOR`` and the resolve with ``LAUNCH_DEPENDENTS`` (their ``griddepcontrol`` in the PTX).
Integer arguments that are multiples of 16 at the bench's launch carry Triton's
16-divisibility, as the launch specialises them.

    env -u TRITON_INTERPRET PYTHONPATH=$PWD /tmp/t36/bin/python \\
        results/h200-2026-12-03c/scripts/compile_resolve.py [WARPS ...]

Prints per variant: SASS instructions, bar.sync, global loads / stores, shuffles, shared loads /
stores, registers and local (spill) bytes (``cuobjdump``).
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "h200-2026-12-03b",
                                "scripts"))
from sm90 import compile_sm90  # noqa: E402

import triton  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")
SWAP_IN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "backends", "kernels",
                       "swap_in.py")
SIG = dict(req_idx_ptr="*i32", seq_lens_ptr="*i32", topk_ptr="*i32", slot_unit_ptr="*i32",
           lru_ptr="*i32", host_table_ptr="*i32", out_ptr="*i32", plan_ptr="*i32",
           counts_ptr="*i64", scratch_ptr="*i32")
CONST = dict(UNIT=1, PAGE=64, PAGE_MODE=False, K_PAD=2048, LOG_K_PAD=11, BLOCK_C=4096,
             SEARCH_STEPS=13, UPSTREAM=True)
DIV = ("topk_stride", "out_stride", "plan_stride", "counts_stride", "scratch_stride",
       "host_table_stride", "K", "C", "D", "SLOTS_PER_REQ", "ROW_BYTES", "MAX_MISSES", "N_UNITS")


def sass_stats(cubin: bytes) -> dict:
    """Counts of the SASS of one compiled kernel (module docstring)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True,
                              text=True).stdout
        res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    ins = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", l).split(";")[0].strip()
           for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/\s", l)]
    ins = [i for i in ins if not i.startswith("NOP")]

    def count(pattern):
        return sum(bool(re.search(pattern, i)) for i in ins)
    return dict(ins=len(ins), bar=count(r"\bBAR\.SYNC"), ldg=count(r"\bLDG"),
                stg=count(r"\bSTG"), shfl=count(r"\bSHFL"), lds=count(r"\bLDS"),
                sts=count(r"\bSTS"), regs=int(re.search(r"REG:(\d+)", res).group(1)),
                local=int(re.search(r"LOCAL:(\d+)", res).group(1)))


def module_of(source: str, name: str):
    """``swap_in.py``'s source (edited) as an importable module (Triton needs its file)."""
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(warps):
    src = open(SWAP_IN).read()
    paths = {"whole kernel": src,
             "all-hit path": src.replace("if n_lost > 0:", "if False:")
                                .replace("if n_miss > 0:", "if False:")}
    for path_name, source in paths.items():
        mod = module_of(source, "swap_in_" + path_name.split()[0].replace("-", "_"))
        for w in warps:
            for ptx in (0, 1, 2):
                k = compile_sm90(mod.resolve_swap_in_kernel, SIG, dict(CONST, PTX_SCATTER=ptx), w,
                                 div=DIV)
                print(f"resolve, {path_name}, {w} warps, PTX_SCATTER={ptx}: "
                      f"{sass_stats(k.asm['cubin'])}", flush=True)
    from backends.kernels.host_copy import copy_planned_rows_persistent_kernel
    k = compile_sm90(copy_planned_rows_persistent_kernel,
                     dict(src_pool_ptr="*i64", dst_pool_ptr="*i64", plan_ptr="*i32"),
                     dict(UNIT_ROWS=1, WORDS=82, VEC=2, GROUP_BLOCK=64, ROWS=1, BATCH_BLOCK=64,
                          LOAD_CACHE="", STORE_CACHE="", WAIT_PRIOR=True), 1,
                     div=("plan_stride", "MAX_MISSES", "BATCH"))
    print("copy (persistent, 1 warp) WAIT_PRIOR=True: griddepcontrol.wait in the PTX:",
          k.asm["ptx"].count("griddepcontrol.wait"), sass_stats(k.asm["cubin"]))
    k = compile_sm90(sys.modules["swap_in_whole"].resolve_swap_in_kernel, SIG,
                     dict(CONST, PTX_SCATTER=1, LAUNCH_DEPENDENTS=True), 8, div=DIV)
    print("resolve LAUNCH_DEPENDENTS=True: griddepcontrol.launch_dependents in the PTX:",
          k.asm["ptx"].count("griddepcontrol.launch_dependents"))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [8, 16])
