"""Compiles the sparse MLA decode kernel for sm_90a on a machine without a GPU and prints what
Triton made of it: the MMA layouts (warpsPerCTA), wgmma instructions in the PTX, ptxas registers
and spill bytes, shared memory. The figures of BENCHMARKS.md 6k ("40 instead of 76 wgmma
instructions", spills, 224 / 193 / 234 KB) come from it, run with Triton 3.6.0 (the GPU machine's
version) in its own venv (`python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
numpy torch==2.13.0`):

    /tmp/t36/bin/python results/h200-2026-12-03-attention/scripts/compile_sm90.py
    CFGS="[dict(is_fp8=True, num_stages=3, extra=dict(SPLIT_SCORES=True))]" DUMP=x /tmp/t36/bin/python ...

SRC/MOD/FN pick another copy of the kernel (an experiment's edited module); DUMP writes the TTGIR
and PTX to /tmp/cc/. The integer arguments carry the divisibility Triton would specialise for
B=128, H=128, top_k=2048 at DeepSeek-V3.2 size (both row formats). A record of how the figures
were obtained, not part of the harness.
"""
import sys, re, os, importlib
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT); sys.path.insert(0, os.environ.get("SRC", ROOT))
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
modname = os.environ.get("MOD", "backends.kernels.sparse_mla_decode")
fnname = os.environ.get("FN", "_sparse_mla_decode_fwd")
mod = importlib.import_module(modname)
fn = getattr(mod, fnname)

def build(is_fp8, block_h=64, block_n=64, num_warps=8, num_stages=2, extra=None, extra_vals=None):
    names = fn.arg_names
    sig = {}
    const = dict(D_V=512, D_V_PAD=512, D_ROPE=64, D_ROPE_PAD=64, G=4, IS_FP8=is_fp8, SPLIT=False,
                 PREFETCH=1, BLOCK_H=block_h, BLOCK_N=block_n, ROPE_VEC=8, MMA_DTYPE=triton.language.bfloat16)
    if extra: const.update(extra)
    ptrs = {"q_ptr": "*bf16", "kv_ptr": "*u8" if is_fp8 else "*bf16", "scale_ptr": "*fp32" if is_fp8 else "*bf16",
            "rope_ptr": "*bf16", "idx_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
            "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in ptrs:
            sig[n] = ptrs[n]
        elif n == "qk_scale_log2":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    consts = {k: v for k, v in const.items() if k in names}
    if is_fp8:
        vals = dict(stride_qb=73728, stride_qh=576, stride_kv=656, stride_scale=164, scale_off=128, stride_rope=328, rope_off=264)
    else:
        vals = dict(stride_qb=73728, stride_qh=576, stride_kv=576, stride_scale=0, scale_off=0, stride_rope=576, rope_off=512)
    vals.update(stride_ib=2048, stride_ob=65536, stride_oh=512, stride_lb=128, H=128, K=2048, num_slots=1<<20,
                num_splits=1, tiles_per_split=32, num_head_blocks=2)
    if extra_vals: vals.update(extra_vals)
    for n, v in vals.items():
        if n in names and v == 1:
            sig[n] = "constexpr"; consts[n] = 1
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ptrs if n in names}
    for n, v in vals.items():
        if n in names and v != 1 and v % 16 == 0:
            attrs[(names.index(n),)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    return k

if __name__ == "__main__":
    import itertools
    cfgs = eval(os.environ.get("CFGS", "[dict(is_fp8=f, num_stages=2, extra=dict(SPLIT_SCORES=sp)) for f in (False, True) for sp in (False, True)]"))
    for c in cfgs:
        k = build(**c)
        ttgir = k.asm["ttgir"]
        mmas = sorted(set(re.findall(r"#ttg.nvidia_mma<\{[^}]*\}>", ttgir)))
        ptx = k.asm["ptx"]
        # ptxas -v
        import subprocess, tempfile
        from triton.backends.nvidia.compiler import get_ptxas
        p = tempfile.NamedTemporaryFile(suffix=".ptx", delete=False); p.write(ptx.encode()); p.close()
        pt = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        r = subprocess.run([pt, "-v", "--gpu-name=sm_90a", p.name, "-o", "/dev/null"], capture_output=True, text=True)
        info = re.findall(r"Used (\d+) registers.*", r.stderr)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        print(modname, c, "regs", k.n_regs if hasattr(k,'n_regs') else info, "ptxas", info, "spill", spill, "smem", k.metadata.shared)
        for m in mmas: print("   ", m)
        if os.environ.get("DUMP"):
            os.makedirs("/tmp/cc", exist_ok=True); open(f"/tmp/cc/{os.environ['DUMP']}_{int(c.get('is_fp8'))}.ttgir","w").write(ttgir)
            os.makedirs("/tmp/cc", exist_ok=True); open(f"/tmp/cc/{os.environ['DUMP']}_{int(c.get('is_fp8'))}.ptx","w").write(ptx)
        wg = len(re.findall(r"wgmma.mma_async", ptx))
        print("    wgmma instrs in ptx:", wg, " ttgir convert_layout:", ttgir.count("convert_layout"), " local_alloc:", ttgir.count("local_alloc"))
