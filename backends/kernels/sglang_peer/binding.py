"""The ctypes binding of the built peer library: ``SGLangSwapInKernel`` loads it, checks the
configuration compiled into it and launches upstream's kernel with upstream's buffers (the
table in the package docstring); ``_PeerArgs`` mirrors ``struct PeerArgs`` of ``launcher.cu``."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported
from backends.kernels.sglang_peer.build import (KernelConfig, build_library, default_arch,
                                                library_path)
from backends.kernels.sglang_peer.staging import DEFAULT_BUILD_DIR

_ARG_FIELDS = (
    "top_k", "device_buffer_tokens", "host_cache_locs", "device_buffer_locs", "host_cache",
    "device_buffer", "top_k_device_locs", "req_pool_indices", "seq_lens", "lru_slots",
    "num_real_reqs")
_INT_FIELDS = (
    "batch", "buffer_stride_0", "host_stride", "lru_slot_stride_0", "top_k_stride",
    "top_k_device_locs_stride", "item_size_bytes")


class _PeerArgs(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_void_p) for n in _ARG_FIELDS]
                + [(n, ctypes.c_int64) for n in _INT_FIELDS]
                + [("miss_src", ctypes.c_void_p), ("miss_dst", ctypes.c_void_p),
                   ("miss_count", ctypes.c_void_p), ("plan_stride", ctypes.c_int64),
                   ("stream", ctypes.c_void_p)])


class SGLangSwapInKernel:
    """The built library for one ``KernelConfig``; ``launch`` runs upstream's kernel."""

    def __init__(self, lib_path: os.PathLike, cfg: KernelConfig):
        self.cfg, self.path = cfg, Path(lib_path)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise PeerUnavailable(f"cannot load {self.path}: {e}") from e
        self.lib.peer_config.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        self.lib.peer_swap_in.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(_PeerArgs)]
        self.lib.peer_swap_in.restype = ctypes.c_int
        self.lib.peer_kernel_attrs.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int64)]
        self.lib.peer_error_string.restype = ctypes.c_char_p
        self.lib.peer_error_string.argtypes = [ctypes.c_int]
        self.lib.peer_set_device.argtypes = [ctypes.c_int]
        got = self.config()
        if got[:3] != (cfg.block_size, cfg.top_k, cfg.hot_buffer_size):
            raise PeerUnavailable(f"{self.path} was built for (block, top_k, hot) = {got[:3]}, "
                                  f"not {(cfg.block_size, cfg.top_k, cfg.hot_buffer_size)}")
        if got[4] != ctypes.sizeof(_PeerArgs):
            raise PeerUnavailable(f"{self.path}: argument struct is {got[4]} B, ours "
                                  f"{ctypes.sizeof(_PeerArgs)} B (stale build?)")
        self.smem = got[3]

    @classmethod
    def load(cls, cfg: KernelConfig, *, build: bool = True, arch: Optional[str] = None,
             build_dir: os.PathLike = DEFAULT_BUILD_DIR, **build_kw) -> "SGLangSwapInKernel":
        """Builds when needed (``build=True``) and loads; PeerUnavailable when impossible."""
        arch = arch or default_arch()
        if build:
            path = build_library(cfg, arch=arch, build_dir=build_dir, **build_kw)
        else:
            path = library_path(cfg, arch, build_dir)
            if not path.is_file():
                raise PeerUnavailable(f"{path} is not built (python -m "
                                      f"backends.kernels.sglang_peer build ...)")
        try:
            return cls(path, cfg)
        except PeerUnavailable as first:
            # A library carried from another machine that this one cannot load (C library
            # too old, stale struct): rebuild here when we may.
            if not build:
                raise
            build_kw = {k: v for k, v in build_kw.items() if k != "force"}
            try:
                path = build_library(cfg, arch=arch, build_dir=build_dir, force=True, **build_kw)
            except PeerUnavailable as e:
                raise PeerUnavailable(f"{first}; rebuilding failed: {e}") from e
            return cls(path, cfg)

    def config(self) -> Tuple[int, int, int, int, int]:
        """``(block, top_k, hot_buffer_size, dynamic smem bytes, argument struct bytes)``
        compiled into the library."""
        buf = (ctypes.c_int64 * 5)()
        self.lib.peer_config(buf)
        return tuple(int(v) for v in buf)

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.peer_error_string(code).decode()
            raise RuntimeError(f"sglang peer {what}: CUDA error {code} ({msg})")

    def kernel_attrs(self, record: bool = True, skip_io: bool = False, seq64: bool = False,
                     rid64: bool = False) -> Dict[str, int]:
        """``cudaFuncGetAttributes`` of one instantiation (needs a GPU)."""
        _require_cuda("kernel attributes")
        buf = (ctypes.c_int64 * 6)()
        self._check(self.lib.peer_kernel_attrs(int(record), int(skip_io), int(seq64),
                                               int(rid64), buf), "cudaFuncGetAttributes")
        return dict(zip(("registers", "static_smem", "local_bytes", "max_threads",
                         "binary_version", "dynamic_smem"), (int(v) for v in buf)))

    def launch(self, *, top_k: torch.Tensor, device_buffer_tokens: torch.Tensor,
               host_cache_locs: torch.Tensor, device_buffer_locs: torch.Tensor,
               host_cache: torch.Tensor, device_buffer: torch.Tensor,
               top_k_device_locs: torch.Tensor, req_pool_indices: torch.Tensor,
               seq_lens: torch.Tensor, lru_slots: torch.Tensor, num_real_reqs: torch.Tensor,
               item_size_bytes: int, miss_src: Optional[torch.Tensor] = None,
               miss_dst: Optional[torch.Tensor] = None, miss_count: Optional[torch.Tensor] = None,
               skip_io: bool = False) -> None:
        """One launch on the current stream, with upstream's buffers (module docstring table)."""
        _require_cuda("the upstream swap-in kernel")
        B, K = top_k.shape
        cfg = self.cfg
        dev = top_k.device
        checks = (
            (top_k, torch.int32, 2), (device_buffer_tokens, torch.int32, 2),
            (host_cache_locs, torch.int64, 2), (device_buffer_locs, torch.int32, 2),
            (top_k_device_locs, torch.int32, 2), (lru_slots, torch.int16, 2),
            (num_real_reqs, torch.int32, 1))
        for t, dt, nd in checks:
            if t.dtype != dt or t.dim() != nd or t.stride(-1) != 1 or t.device != dev:
                raise ValueError(f"upstream buffer must be {dt} {nd}-d, unit inner stride, on "
                                 f"{dev}; got {t.dtype} {tuple(t.shape)} on {t.device}")
        if K != cfg.top_k or lru_slots.shape[1] != cfg.hot_buffer_size:
            raise ValueError(f"library built for top_k {cfg.top_k}, hot {cfg.hot_buffer_size}; "
                             f"got top_k {K}, lru width {lru_slots.shape[1]}")
        if device_buffer_tokens.stride(0) != device_buffer_locs.stride(0):
            raise ValueError("device_buffer_tokens and device_buffer_locs must share a row stride")
        if not host_cache_locs.is_contiguous():
            raise ValueError("host_cache_locs must be contiguous (its row stride is its width)")
        if item_size_bytes % 16:
            raise PeerUnsupported(f"upstream copies 16-byte pairs: row bytes {item_size_bytes} "
                                  "must be a multiple of 16")
        if not host_cache.is_pinned() and host_cache.device.type == "cpu":
            raise ValueError("host_cache must be pinned (read over UVA)")
        for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
            if t.dtype not in (torch.int32, torch.int64) or t.shape != (B,) or \
                    t.device != dev or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int32/int64 [{B}] tensor on {dev}")
        record = miss_src is not None
        if record:
            if miss_src.dtype != torch.int64 or miss_dst.dtype != torch.int32 or \
                    miss_count.dtype != torch.int32 or miss_src.stride(0) != miss_dst.stride(0):
                raise ValueError("miss_src int64, miss_dst int32 (same row stride), miss_count "
                                 "int32")
        a = _PeerArgs(
            top_k.data_ptr(), device_buffer_tokens.data_ptr(), host_cache_locs.data_ptr(),
            device_buffer_locs.data_ptr(), host_cache.data_ptr(), device_buffer.data_ptr(),
            top_k_device_locs.data_ptr(), req_pool_indices.data_ptr(), seq_lens.data_ptr(), lru_slots.data_ptr(), num_real_reqs.data_ptr(),
            B, device_buffer_tokens.stride(0), host_cache_locs.shape[1], lru_slots.stride(0),
            top_k.stride(0), top_k_device_locs.stride(0), int(item_size_bytes),
            miss_src.data_ptr() if record else None, miss_dst.data_ptr() if record else None,
            miss_count.data_ptr() if record else None, miss_src.stride(0) if record else 0,
            torch.cuda.current_stream(dev).cuda_stream)
        if B == 0:
            return
        self._check(self.lib.peer_set_device(dev.index if dev.index is not None
                                             else torch.cuda.current_device()), "set device")
        self._check(self.lib.peer_swap_in(int(record), int(skip_io),
                                          int(seq_lens.dtype == torch.int64),
                                          int(req_pool_indices.dtype == torch.int64),
                                          ctypes.byref(a)), "launch")


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise PeerUnavailable(f"{what} needs a CUDA GPU; this machine has none")
