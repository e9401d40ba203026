"""Indexer logits kernel compiled for sm_90a by Triton 3.6 without a GPU: main-loop SASS per warp.

Per configuration: the SASS of the main (tile) loop per warp by instruction class, registers,
stack (spills), shared memory, programs resident per SM, wgmma / TMA / async-copy counts, and
the issue-bound floor at 32K (4 warp-instructions per SM per cycle at 1.98 GHz).

    env -u TRITON_INTERPRET PYTHONPATH=$PWD /tmp/t36/bin/python \
        results/h200-2026-12-03c/scripts/compile_indexer.py [NAME ...]

NAME: entries of ``CONFIGS`` below (default all). The integer arguments carry the divisibility
Triton specialises at the bench's size (B=64, 64 heads x 128 dims, fp8 keys, page 64, 32K,
4096-token programs); ``SRC=path`` compiles another checkout's ``backends/kernels/indexer.py``;
``DUMP=dir`` writes each configuration's TTGIR, PTX and SASS there.
(/tmp/t36: ``python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 numpy
torch==2.13.0``.)
"""
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "h200-2026-12-03b", "scripts"))
from sm90 import compile_sm90  # noqa: E402

BIN = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin")
SRC = os.environ.get("SRC", os.path.join(HERE, "..", "..", "..", "backends", "kernels", "indexer.py"))
_spec = importlib.util.spec_from_file_location("indexer_under_test", SRC)
K = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = K
_spec.loader.exec_module(K)

B, H, D, P, CTX, BLOCK_N, TPP = 64, 64, 128, 64, 32768, 64, 4096
#: name -> (constexprs beyond the defaults, num_warps, num_stages)
CONFIGS = {
    "default": (dict(), 4, 5),
    "q_fp8": (dict(Q_FP8=True), 4, 5),
    "q_fp8_stages7": (dict(Q_FP8=True), 4, 7),
    "q_fp8_stages9": (dict(Q_FP8=True), 4, 9),
    "q_fp8_stages4": (dict(Q_FP8=True), 4, 4),
    "q_fp8_stages6": (dict(Q_FP8=True), 4, 6),
    "q_fp8_prefetch": (dict(Q_FP8=True, PREFETCH=True), 4, 5),
    "q_fp8_w8": (dict(Q_FP8=True), 8, 5),
    "pointer_loads": (dict(TMA=False), 4, 5),
    "q_fp8_pointer_loads": (dict(Q_FP8=True, TMA=False), 4, 5),
}
#: SASS opcode (first dotted part) -> class shown in the table
CLASSES = {
    "HGMMA": "mma", "QGMMA": "mma", "HMMA": "mma", "LDS": "lds", "LDSM": "lds", "STS": "sts",
    "F2FP": "cvt", "F2F": "cvt", "I2F": "cvt", "PRMT": "cvt", "HADD2": "cvt", "HMUL2": "cvt",
    "FMNMX": "relu", "FMUL": "fmul/fma", "FFMA": "fmul/fma", "FADD": "fadd", "SHFL": "shfl",
    "UTMALDG": "tma", "UBLKCP": "tma", "LDGSTS": "cp.async", "LDG": "ldg", "STG": "stg",
    "SYNCS": "mbarrier", "BAR": "bar", "WARPGROUP": "wgsync", "WARPSYNC": "wgsync",
}


def kernel_args(const):
    """Signature types, constexprs and divisible integer arguments of ``K._indexer_logits_kernel``
    at the bench size (a CUDA launch); ``const`` overrides the constexprs; Q_FP8 / ROUND_FP8 are
    left out for a kernel without them (``SRC`` of an older checkout)."""
    names = K._indexer_logits_kernel.arg_names
    c = dict(H=H, D=D, PAGE=P, BLOCK_N=BLOCK_N, KV_FP8=True, PAGED=True, PAGES_PER_TILE=1,
             PREFETCH=False, TMA=True, Q_FP8=False, ROUND_FP8=False)
    c.update(const)
    if "Q_FP8" not in names:
        if c["Q_FP8"]:
            raise SystemExit(f"{SRC} has no Q_FP8")
        del c["Q_FP8"], c["ROUND_FP8"]
    types = dict(q_ptr="*bf16", w_ptr="*fp32", k_ptr="*fp8e4nv", s_ptr="*fp32", bt_ptr="*i32",
                 start_ptr="*i32", len_ptr="*i32", out_ptr="*fp32",
                 k_desc=f"tensordesc<fp8e4nv[1,{BLOCK_N},{D}]>" if c["TMA"] else "*fp8e4nv")
    div = ("stride_qm", "stride_qh", "stride_wm", "stride_bt", "stride_kpage", "stride_spage",
           "stride_kn", "stride_om", "max_len", "tiles_per_prog")
    return types, c, div


def sass_of(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    return subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True,
                          text=True, check=True).stdout


def main_loop(sass: str):
    """Opcodes of the innermost loop that holds the MMA: the instructions from a backward branch's
    target up to that branch (predicated-off paths inside it counted too)."""
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
    addr = [int(re.search(r"/\*([0-9a-f]{4,})\*/", l).group(1), 16) for l in lines]
    # label positions: the address of the first instruction after the label line
    pos, cur = {}, None
    for l in sass.splitlines():
        m = re.match(r"\s*\.?(L_x_\d+):", l)
        if m:
            cur = m.group(1)
            continue
        a = re.search(r"/\*([0-9a-f]{4,})\*/", l)
        if a and cur:
            pos[cur] = int(a.group(1), 16)
            cur = None
    best = None
    for i, l in enumerate(lines):
        m = re.search(r"\bBRA\b.*?`?\(?\.?(L_x_\d+)", l)
        if not m or m.group(1) not in pos or pos[m.group(1)] >= addr[i]:
            continue
        body = [ln for ln, a in zip(lines, addr) if pos[m.group(1)] <= a <= addr[i]]
        ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0] for ln in body]
        if any(o.startswith(("HGMMA", "QGMMA", "HMMA")) for o in ops) and (best is None or len(ops) < len(best)):
            best = ops
    return best or []


def report(name, const, warps, stages, dump=None):
    types, c, div = kernel_args(const)
    k = compile_sm90(K._indexer_logits_kernel, types, c, warps, stages, div=div)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    sass = sass_of(k.asm["cubin"])
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext, txt in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
            with open(os.path.join(dump, f"{name}.{ext}"), "w") as f:
                f.write(txt)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    res = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                         capture_output=True, text=True, check=True).stdout
    spills = re.search(r"STACK:(\d+)", res)
    regs = re.search(r"REG:(\d+)", res)
    ops = main_loop(sass)
    cls = collections.Counter(CLASSES.get(o.split(".")[0], "other") for o in ops)
    smem = k.metadata.shared
    n = len(ops)
    # programs resident per SM: registers (65536 / (regs * 32 * warps), in 256-register units
    # per warp), shared memory (228 KB per SM, 227 KB per block)
    r = int(regs.group(1)) if regs else 0
    per_warp = -(-r * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps) if r else 0
    by_smem = (233472 // (smem + 1024)) if smem else 99
    resident = min(by_regs, by_smem, 32 // warps)
    # issue-bound time per tile: every warp of every resident program issues n instructions per
    # tile; one SM issues 4 warp-instructions per cycle (1.98 GHz boost, H200); tiles in flight
    # per SM = resident programs
    cyc_per_tile = n * warps / 4
    tiles_per_sm = B * CTX // BLOCK_N / 132
    t_issue = tiles_per_sm * cyc_per_tile / 1.98e3  # us
    print(f"{name:<22} warps {warps} stages {stages}: loop {n} SASS/warp/tile "
          f"({n * warps} per program), regs {r}, stack {spills.group(1) if spills else '?'} B, "
          f"smem {smem} B, resident/SM {resident} (regs {by_regs}, smem {by_smem}); "
          f"wgmma(ptx) {len(re.findall(r'wgmma.mma_async', ptx))}, "
          f"TMA(ptx) {len(re.findall(r'cp.async.bulk.tensor', ptx))}, "
          f"cp.async(ptx) {len(re.findall(r'cp.async.ca|cp.async.cg', ptx))}, "
          f"ttgir local_load {ttgir.count('ttg.local_load')}; "
          f"issue-bound 32K >= {t_issue:.1f} us")
    print("    " + ", ".join(f"{k_}:{v}" for k_, v in sorted(cls.items(), key=lambda x: -x[1])))
    mma = sorted({o for o in ops if o.startswith(("HGMMA", "QGMMA", "HMMA"))})
    print("    mma:", " ".join(mma))


if __name__ == "__main__":
    names = sys.argv[1:] or list(CONFIGS)
    for nm in names:
        const, w, s = CONFIGS[nm]
        try:
            report(nm, const, w, s, os.environ.get("DUMP"))
        except SystemExit as e:
            print(f"{nm}: skipped ({e})")
