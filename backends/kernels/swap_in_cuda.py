"""The HiSparse resolve in CUDA (``swap_in_resolve.cu``): the Triton ``resolve_swap_in_kernel``'s
upstream LRU order with the selection joined to the hot buffer in a shared-memory hash table
instead of a stamp table in global memory (the ``.cu`` file's header says why). Built with nvcc
at first use into ``.kernel_build/`` (reused while the source and flags are unchanged), loaded
through ctypes, launched on torch's current stream; GPU only.

``CudaResolve.launch`` takes the Triton kernel's arguments (``backends/kernels/swap_in.py``) and
writes the same outputs; ``cuda_resolve_shape`` says whether a (top_k, hot units) shape fits,
``cuda_resolve_unavailable`` whether the resolve can run here at all.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from backends.kernels.flashmla_peer import PeerUnavailable
from backends.kernels.nvcc_build import build_cached, default_arch, gencode
from backends.kernels.swap_in import next_pow2

RESOLVE_CU = Path(__file__).with_name("swap_in_resolve.cu")
DEFAULT_BUILD_DIR = Path(__file__).resolve().parents[2] / ".kernel_build"
MAX_THREADS = 1024
MAX_EPT, MAX_LPT = 8, 16              # entries / walk lanes a thread compiled (powers of two)
MAX_DYNAMIC_SMEM = 227 * 1024         # per-block opt-in limit on SM90

_PTRS = ("req_idx", "seq_lens", "topk", "slot_unit", "lru", "host_table", "out", "plan", "counts")
_I64 = ("topk_stride", "host_table_stride", "out_stride", "plan_stride", "counts_stride",
        "batch", "K", "C", "D", "slots_per_req", "row_bytes", "max_misses", "n_units", "unit",
        "page", "hash_size")
_I32 = ("req64", "seq64", "page_mode", "launch_dependents", "threads", "pad_")


class _ResolveArgs(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_void_p) for n in _PTRS] + [(n, ctypes.c_int64) for n in _I64]
                + [(n, ctypes.c_int32) for n in _I32] + [("stream", ctypes.c_void_p)])


@dataclass(frozen=True)
class CudaResolveShape:
    """Launch shape of one (top_k, hot units) problem: ``threads`` a block, ``ept`` selection
    entries and ``lpt`` hot-buffer walk lanes a thread, ``hash_size`` entries of the shared
    hash table (a power of two >= 2 top_k), ``smem`` dynamic shared-memory bytes."""
    threads: int
    ept: int
    lpt: int
    hash_size: int
    smem: int


def cuda_resolve_shape(top_k: int, hot_units: int, num_warps: Optional[int] = None
                       ) -> CudaResolveShape:
    """The launch shape for ``top_k`` entries and ``hot_units`` hot slots (``num_warps``: the
    block's warps; default as few as the compiled entries / lanes a thread allow, at most 32).
    ValueError naming the field when the shape does not fit the compiled kernels or shared
    memory."""
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, 32, got {num_warps!r}")
    t = MAX_THREADS if num_warps is None else 32 * num_warps
    ept, lpt = next_pow2(-(-top_k // t)), next_pow2(-(-hot_units // t))
    if ept > MAX_EPT or lpt > MAX_LPT:
        raise ValueError(f"the CUDA resolve takes top_k <= {MAX_EPT * t} and hot units <= "
                         f"{MAX_LPT * t} at {t // 32} warps; got top_k {top_k}, hot units "
                         f"{hot_units} (use the Triton resolve)")
    if num_warps is None:
        need = max(-(-top_k // ept), -(-hot_units // lpt))
        t = min(MAX_THREADS, max(32, -(-need // 32) * 32))
    hs = next_pow2(max(4 * top_k, 2))      # load factor <= 1/4; <= 1/2 where that fits
    if (3 * hs + hot_units) * 4 > MAX_DYNAMIC_SMEM:
        hs //= 2
    smem = (3 * hs + hot_units) * 4
    if smem > MAX_DYNAMIC_SMEM:
        raise ValueError(f"the CUDA resolve needs {smem} B of shared memory for top_k {top_k}, "
                         f"hot units {hot_units}: more than {MAX_DYNAMIC_SMEM} B (use the "
                         "Triton resolve)")
    return CudaResolveShape(t, ept, lpt, hs, smem)


def nvcc_flags(arch: str) -> list:
    return ["-std=c++17", "-O3", gencode(arch), "-Xcompiler", "-fPIC", "-shared", "-Xptxas", "-v"]


def build_resolve_library(arch: Optional[str] = None, build_dir: Path = DEFAULT_BUILD_DIR,
                          nvcc: Optional[str] = None, force: bool = False) -> Path:
    """Builds (or reuses) ``build_dir/libswap_in_resolve_sm<arch>.so``; PeerUnavailable without
    nvcc or on a compile error."""
    arch = arch or default_arch()
    lib = Path(build_dir) / f"libswap_in_resolve_sm{arch}.so"
    src = RESOLVE_CU.read_text()
    flags = nvcc_flags(arch)
    return build_cached(lib, lambda exe, out: [exe, *flags, str(RESOLVE_CU), "-o", str(out)],
                        [src, flags], nvcc=nvcc, force=force, what="the CUDA resolve",
                        meta=dict(arch=arch))


class CudaResolve:
    """The loaded library (``load`` builds it when needed); ``launch`` runs the resolve."""

    _cache: Dict[Tuple[str, str], "CudaResolve"] = {}
    _failed: Dict[Tuple[str, str], str] = {}     # why a build or load failed (not retried)

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise PeerUnavailable(f"cannot load {self.path}: {e}") from e
        self.lib.resolve_launch.argtypes = [ctypes.POINTER(_ResolveArgs)] + [ctypes.c_int] * 3
        self.lib.resolve_kernel_attrs.argtypes = [ctypes.c_int, ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_int64)]
        self.lib.resolve_error_string.restype = ctypes.c_char_p
        self.lib.resolve_error_string.argtypes = [ctypes.c_int]
        if self.lib.resolve_args_size() != ctypes.sizeof(_ResolveArgs):
            raise PeerUnavailable(f"{self.path}: argument struct is {self.lib.resolve_args_size()}"
                                  f" B, ours {ctypes.sizeof(_ResolveArgs)} B (stale build?)")

    @classmethod
    def load(cls, arch: Optional[str] = None, build_dir: Path = DEFAULT_BUILD_DIR
             ) -> "CudaResolve":
        """The library for this GPU (built at first use; one instance a process, and a failed
        build or load is not retried in the process)."""
        if not torch.cuda.is_available():
            raise PeerUnavailable("the CUDA resolve needs a CUDA GPU; this machine has none")
        arch = arch or default_arch()
        key = (arch, str(build_dir))
        if key in cls._failed:
            raise PeerUnavailable(cls._failed[key])
        if key not in cls._cache:
            try:
                cls._cache[key] = cls(build_resolve_library(arch, build_dir))
            except PeerUnavailable as e:
                cls._failed[key] = str(e)
                raise
        return cls._cache[key]

    def kernel_attrs(self, shape: CudaResolveShape) -> Dict[str, int]:
        """``cudaFuncGetAttributes`` of the instance ``shape`` launches."""
        buf = (ctypes.c_int64 * 4)()
        self._check(self.lib.resolve_kernel_attrs(shape.ept, shape.lpt, buf), "attributes")
        return dict(zip(("registers", "static_smem", "local_bytes", "max_threads"),
                        (int(v) for v in buf)))

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"CUDA resolve {what}: error {code} "
                               f"({self.lib.resolve_error_string(code).decode()})")

    def launch(self, shape: CudaResolveShape, *, req_idx: torch.Tensor, seq_lens: torch.Tensor,
               topk: torch.Tensor, slot_unit: torch.Tensor, lru: torch.Tensor,
               host_table: torch.Tensor, out: torch.Tensor, plan: torch.Tensor,
               counts: torch.Tensor, D: int, slots_per_req: int, row_bytes: int,
               max_misses: int, n_units: int, unit: int, page: int, page_mode: bool,
               launch_dependents: bool) -> None:
        """One launch on the current stream: a block per row of ``topk`` (int32 ``[B, K]``).
        The tensors as the Triton ``resolve_swap_in_kernel`` takes them (int32 ``slot_unit`` /
        ``lru`` ``[max_reqs, C]`` of one layer, ``host_table`` ``[max_reqs, pages]``, ``out``
        ``[>= B, >= K]``, ``plan`` ``[>= B, 1 + 2 max_misses]``, int64 ``counts``); the caller
        has checked shapes and dtypes (``HiSparseCoordinator``)."""
        B, K = topk.shape
        if B == 0:
            return
        a = _ResolveArgs(
            req_idx.data_ptr(), seq_lens.data_ptr(), topk.data_ptr(), slot_unit.data_ptr(),
            lru.data_ptr(), host_table.data_ptr(), out.data_ptr(), plan.data_ptr(),
            counts.data_ptr(),
            topk.stride(0), host_table.stride(0), out.stride(0), plan.stride(0),
            counts.stride(0), B, K, slot_unit.shape[1], D, slots_per_req, row_bytes,
            max_misses, n_units, unit, page, shape.hash_size,
            int(req_idx.dtype == torch.int64), int(seq_lens.dtype == torch.int64),
            int(page_mode), int(launch_dependents), shape.threads, 0,
            torch.cuda.current_stream(topk.device).cuda_stream)
        dev = topk.device.index if topk.device.index is not None else torch.cuda.current_device()
        self._check(self.lib.resolve_launch(ctypes.byref(a), shape.ept, shape.lpt, dev),
                    "launch")


def cuda_resolve_unavailable(device, top_k: int, hot_units: int) -> str:
    """Why the CUDA resolve cannot serve ``top_k`` entries over ``hot_units`` hot slots on
    ``device`` ('' when it can: a CUDA device, a shape that fits, the library built or
    buildable and loadable here)."""
    if torch.device(device).type != "cuda":
        return f"the CUDA resolve needs a CUDA device, got {torch.device(device)}"
    try:
        cuda_resolve_shape(top_k, hot_units)
        CudaResolve.load()
    except (ValueError, PeerUnavailable) as e:
        return str(e)
    return ""
