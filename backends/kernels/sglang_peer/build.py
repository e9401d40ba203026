"""The nvcc build of the peer library: our launcher (``launcher.cu``, next to this file) around
the staged upstream header, compiled with SGLang's JIT flags for the GPU (module docstring of
the package), one shared library per ``KernelConfig`` and arch, reused while its key (staged
sources, launcher, flags) is unchanged; the ptxas report of each kernel instance is kept."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.nvcc_build import DEFAULT_ARCH, build_cached, default_arch, gencode
from backends.kernels.nvcc_build import ptxas_usage as nvcc_ptxas_usage
from backends.kernels.sglang_peer.staging import (DEFAULT_BUILD_DIR, KERNEL_NAME,
                                                  check_kernel_contract, stage_sources,
                                                  staged_sources)
from backends.kernels.sglang_peer.state import INT16_MAX

DEFAULT_BLOCK_SIZE = 960          # SGLang coordinator's swap_in_block_size default
MAX_DYNAMIC_SMEM = 227 * 1024     # per-block opt-in limit on SM90
LAUNCHER_CU = Path(__file__).with_name("launcher.cu")   # our extern "C" launcher


@dataclass(frozen=True)
class KernelConfig:
    """One compiled instance of upstream's kernel: ``top_k`` selected tokens per request,
    ``hot_buffer_size`` device-buffer slots per request (D), ``block_size`` threads per block."""
    top_k: int
    hot_buffer_size: int
    block_size: int = DEFAULT_BLOCK_SIZE

    def validate(self) -> None:
        K, D, B = self.top_k, self.hot_buffer_size, self.block_size
        if not 1 <= K <= INT16_MAX:
            raise PeerUnsupported(f"upstream stores top-k indices as int16: top_k {K} not in "
                                  f"[1, {INT16_MAX}]")
        if not K <= D <= INT16_MAX:
            raise PeerUnsupported(f"upstream needs top_k <= hot_buffer_size <= {INT16_MAX} "
                                  f"(int16 LRU slots); got top_k {K}, hot_buffer_size {D}")
        if B % 32 or not 32 <= B <= 1024:
            raise PeerUnsupported(f"block_size must be a multiple of 32 in [32, 1024], got {B}")
        if smem_bytes(K, D) > MAX_DYNAMIC_SMEM:
            raise PeerUnsupported(f"upstream's shared memory for top_k {K}, hot buffer {D} is "
                                  f"{smem_bytes(K, D)} B > {MAX_DYNAMIC_SMEM} B")

    @property
    def tag(self) -> str:
        return f"b{self.block_size}_k{self.top_k}_h{self.hot_buffer_size}"


def smem_bytes(top_k: int, hot_buffer_size: int, warp: int = 32) -> int:
    """Dynamic shared memory of the kernel (upstream's ``SmemLayout<top_k, hot>::BYTES``)."""
    hash_size = 2 * top_k
    chunks = -(-hot_buffer_size // warp)
    n32 = top_k + 2 * (chunks + 1) + hash_size + 2
    n16 = hot_buffer_size + hash_size
    return 4 * n32 + 2 * n16


def nvcc_command(cfg: KernelConfig, src_dir: Path, cu: Path, out: Path, arch: str,
                 nvcc: str = "nvcc") -> List[str]:
    """The compile line: SGLang's JIT flags for ``arch`` plus ``-shared`` and ptxas stats."""
    flag = gencode(arch)
    sgl_arch = int(arch[0]) * 100 + int(arch[1]) * 10
    return [nvcc, "-std=c++20", "-O3", "--expt-relaxed-constexpr", f"-DSGL_CUDA_ARCH={sgl_arch}",
            flag, "-Xcompiler", "-fPIC", "-shared",
            "-Xptxas", "-v", f"-DPEER_BLOCK_SIZE={cfg.block_size}", f"-DPEER_TOP_K={cfg.top_k}",
            f"-DPEER_HOT_BUFFER={cfg.hot_buffer_size}", f"-I{src_dir / 'include'}",
            f"-I{src_dir / 'csrc'}", f"-I{src_dir / 'tvm_include'}", str(cu), "-o", str(out)]


def _tree_sha(src_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in src_dir.rglob("*") if p.is_file() and p.name != "SOURCE.json"):
        h.update(str(f.relative_to(src_dir)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def library_path(cfg: KernelConfig, arch: str, build_dir: os.PathLike = DEFAULT_BUILD_DIR) -> Path:
    return Path(build_dir) / f"libsglang_hisparse_{cfg.tag}_sm{arch}.so"


def build_library(cfg: KernelConfig, *, arch: Optional[str] = None,
                  build_dir: os.PathLike = DEFAULT_BUILD_DIR, sglang_src=None, tvm_src=None,
                  nvcc: Optional[str] = None, force: bool = False) -> Path:
    """Builds (or reuses) the peer library for ``cfg``; returns its path.

    Reuses ``build_dir/libsglang_hisparse_<tag>_sm<arch>.so`` when its key (staged sources,
    launcher source, flags) matches, which needs no nvcc (a library built on another machine and
    carried). Otherwise stages the sources if needed (from ``sglang_src``/``tvm_src`` or the
    installed packages) and compiles. Raises PeerUnavailable (no sources, no nvcc, compile error:
    the log's tail is in the message) or PeerUnsupported (config out of upstream's range).
    """
    cfg.validate()
    arch = arch or default_arch()
    build_dir = Path(build_dir)
    src_dir = build_dir / "src"
    if sglang_src is not None or tvm_src is not None or staged_sources(build_dir) is None:
        stage_sources(sglang_src, tvm_src, build_dir)
    check_kernel_contract((src_dir / "csrc" / "kvcacheio" / "hisparse.cuh").read_text())
    lib = library_path(cfg, arch, build_dir)
    launcher = LAUNCHER_CU.read_text()
    cmd_key = nvcc_command(cfg, Path("SRC"), Path("peer.cu"), Path("lib.so"), arch)[1:]

    def command(exe: str, out: Path) -> List[str]:
        cu = lib.with_suffix(".cu")
        cu.write_text(launcher)
        return nvcc_command(cfg, src_dir, cu, out, arch, exe)

    return build_cached(lib, command, [_tree_sha(src_dir), launcher, cmd_key], force=force,
                        nvcc=nvcc, what="the peer", label=instance_label,
                        meta=dict(arch=arch, config=cfg.__dict__))


def instance_label(mangled: str) -> str:
    """``RecordMissPlan=.. SkipIO=.. seq=int32|int64 rid=..`` of a mangled kernel instance."""
    m = re.search(KERNEL_NAME + r"I((?:L[ib]\d+E)+)([il])([il])E", mangled)
    if m is None:
        return mangled
    vals = re.findall(r"L[ib](\d+)E", m.group(1))
    t = {"i": "int32", "l": "int64"}
    return (f"RecordMissPlan={vals[7]} SkipIO={vals[8]} seq_lens={t[m.group(2)]} "
            f"req_pool_indices={t[m.group(3)]}") if len(vals) == 9 else mangled


def ptxas_usage(log_text: str) -> List[Dict[str, object]]:
    """Per kernel instantiation of the peer: registers, spills and static smem from a
    ``-Xptxas -v`` log."""
    return nvcc_ptxas_usage(log_text, instance_label)
