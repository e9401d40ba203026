"""SGLang's own HiSparse swap-in kernel as a peer of our coordinator (``coordinator=sglang``).

Upstream's kernel is ``load_cache_to_device_buffer_kernel`` in ``kvcacheio/hisparse.cuh`` of the
``sglang`` package (0.5.23: ``sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh``; older releases:
``sglang/jit_kernel/csrc/hisparse.cuh``). SGLang JIT-builds it through a generated
``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` wrapper linked against ``libtvm_ffi``. We do not: the header is
taken out of the installed package or the downloaded wheel at build time (it is never part of
this repository), staged with the headers it includes (``sgl_kernel/*`` from the same package,
``tvm/ffi/*`` and ``dlpack`` from an ``apache-tvm-ffi`` wheel: headers only) and compiled with
``nvcc`` together with our launcher (``_LAUNCHER_SOURCE``, below), which instantiates the
``__global__`` kernel template itself and exposes plain ``extern "C"`` functions. The result is a
shared library loaded with ``ctypes``: it needs neither tvm-ffi nor sglang at run time, links
the CUDA runtime statically, and runs under any Python.

Flags mirror SGLang's JIT build for the GPU it runs on: ``-std=c++20 -O3
--expt-relaxed-constexpr -DSGL_CUDA_ARCH=900 -gencode=arch=compute_90a,code=sm_90a -Xcompiler
-fPIC`` (H100/H200), plus ``-shared -Xptxas -v`` (register use goes to the build log).

Instantiation: ``<BLOCK, TOP_K, HOT_BUFFER, IsMLA=true, IsDsv4Layout=false, SPARSE_BLOCK_SIZE=1,
TopKIsBlocks=false, RecordMissPlan, SkipIO, SeqLensT, ReqPoolIndicesT>``, i.e. what
``load_cache_to_device_buffer_mla`` (``sglang/kernels/ops/kvcache/hisparse.py``) builds; the
coordinator's default block is 960 threads (``swap_in_block_size``). ``RecordMissPlan=true``
gives the per-request miss count (used for counts); ``SkipIO`` is upstream's timing probe.

Upstream state (one layer) and how ours maps onto it (token mode only: upstream is per token)
--------------------------------------------------------------------------------------------
============================  ====================================  ============================
upstream buffer               dtype / shape                         ours
============================  ====================================  ============================
``device_buffer_tokens``      int32 ``[R, D + P]``                  ``slot_unit[layer]`` (cols
                                                                    ``D..`` = -1, never read)
``device_buffer_locs``        int32 ``[R, D + P]`` (same stride)    ``r * (D + P) + s``
``lru_slots``                 int16 ``[R, D]`` LRU first            ``lru[layer]`` (int32)
``host_cache_locs``           int64 ``[R, max_ctx]`` pos -> host    ``host_page_table * P + p%P``
``host_cache`` / device pool  bytes, ``row_bytes`` a row            ``host_kv[l]`` / ``device_kv[l]``
``top_k_device_locs``         int32 ``[B, K]`` (output)             ``swap_in_selected_pages``
``miss_src/dst/count``        int64/int32 ``[B, K]``, int32 ``[B]``  miss plan / ``misses``
============================  ====================================  ============================

Semantics of the upstream kernel (read from the 0.5.23 source; ``UpstreamHotBuffer`` models them
in pure Python) and where they differ from ours (``harness/lru_model.py``):

* short request (``seq_len <= D``): ``out[i] = locs[pos]`` for ``i < min(seq_len, K)`` and
  ``pos >= 0``, else -1 (entries are assumed compacted to the front; no ``pos < seq_len`` check);
* long request: the newest token (``seq_len - 1``) maps to ``locs[D]`` and is not tracked; every
  other entry goes into a shared-memory hash; the hot slots are walked in LRU order, a resident
  selected token is a hit; the i-th miss *in selection order* takes the i-th least recently used
  non-hit slot; new LRU order = untouched non-hit slots, then the misses' slots (selection order),
  then the hit slots **in their previous LRU order** (ours: ascending position). -1 entries of a
  long request are skipped and their output is left as it was (we fill the output with -1 first);
  duplicates race in the hash (an entry can be loaded twice) and positions ``>= seq_len`` are not
  checked, so the peer feeds the kernel a canonical selection (``canonical_selection``: valid,
  distinct, ascending, -1 at the end) and maps the output back to the caller's order. With that
  selection, hits, misses, slot assignment, output slots and copied bytes equal ours exactly; the
  LRU orders differ only in the order of the hit slots, so free-running traces can diverge
  (``tests/test_sglang_peer.py`` has a four-step example). ``swap_in`` (any selection) pays for
  that canonicalising sort; ``swap_in_direct`` passes a selection that already meets upstream's
  contract (``selection_contract_error``; an indexer's top-k does) straight to the kernel, as
  SGLang does, and is what ``hisparse.coordinator=sglang`` runs.
* no counts: misses come from ``miss_count`` (RecordMissPlan), hits are derived
  (distinct valid selections - misses, the newest token counted as a hit, as ours).
* copies: one warp per miss, 16-byte ``ld.global.nc.v2.b64`` from pinned host memory (UVA) with
  ``st.global.cg``, 8-byte tail: ``row_bytes`` must be a multiple of 16 (656 and 1152 are).

Everything that needs a GPU raises ``PeerUnavailable`` without CUDA; shapes upstream does not
support raise ``PeerUnsupported``. CLI (set-up, no GPU needed)::

    python -m backends.kernels.sglang_peer stage --sglang SGLANG.whl --tvm-ffi TVM_FFI.whl
    python -m backends.kernels.sglang_peer build --top-k 2048 --hot 4096 [--block 960]
    python -m backends.kernels.sglang_peer info
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from backends.kernels.flashmla_peer import PeerUnavailable, PeerUnsupported

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUILD_DIR = REPO_ROOT / ".peer_build" / "sglang_hisparse"
DEFAULT_BLOCK_SIZE = 960          # SGLang coordinator's swap_in_block_size default
DEFAULT_ARCH = "90a"              # what SGLang's JIT picks on H100/H200
MAX_DYNAMIC_SMEM = 227 * 1024     # per-block opt-in limit on SM90
INT16_MAX = 32767

# (include dir, kernel header) inside an sglang package root, newest layout first.
HEADER_LAYOUTS = (
    ("sglang/kernels/jit/include", "sglang/kernels/jit/csrc/kvcacheio/hisparse.cuh"),
    ("sglang/jit_kernel/include", "sglang/jit_kernel/csrc/hisparse.cuh"),
)
TVM_INCLUDE = "tvm_ffi/include"   # inside an apache-tvm-ffi wheel or installed package

# The interface our launcher is written against (sglang 0.5.23); ``check_kernel_contract``
# compares the staged header with it so a changed kernel fails the build with a clear message.
KERNEL_NAME = "load_cache_to_device_buffer_kernel"
EXPECTED_TEMPLATE = (
    "int BLOCK_SIZE", "int NUM_TOP_K", "int HOT_BUFFER_SIZE", "bool IsMLA", "bool IsDsv4Layout",
    "int SPARSE_BLOCK_SIZE", "bool TopKIsBlocks", "bool RecordMissPlan", "bool SkipIO",
    "typename SeqLensT", "typename ReqPoolIndicesT")
EXPECTED_PARAMS = (
    "const int32_t* top_k", "int32_t* device_buffer_tokens", "const int64_t* host_cache_locs",
    "const int32_t* device_buffer_locs", "const void* host_cache_k", "const void* host_cache_v",
    "void* device_buffer_k", "void* device_buffer_v", "int32_t* top_k_device_locs",
    "const ReqPoolIndicesT* req_pool_indices", "const SeqLensT* seq_lens", "int16_t* lru_slots",
    "const int32_t* num_real_reqs", "int64_t buffer_stride_0", "int64_t host_stride",
    "int64_t lru_slot_stride_0", "int64_t top_k_stride", "int64_t top_k_device_locs_stride",
    "int64_t page_size", "int64_t item_size_bytes", "int64_t* miss_src_out",
    "int32_t* miss_dst_out", "int32_t* miss_count_out", "int64_t plan_stride")

# Our launcher (compiled with the staged upstream header; PEER_* come from -D flags).
_LAUNCHER_SOURCE = r"""
// dsa-harness: plain C launcher for SGLang's HiSparse swap-in kernel (our code; the upstream
// header is staged from the sglang package at build time and included unchanged).
#include "kvcacheio/hisparse.cuh"

#include <cuda_runtime.h>
#include <cstdint>

// External linkage: the extern "C" entry point takes it (an anonymous-namespace type would
// give that entry point internal linkage and drop it from the library).
struct PeerArgs {
  const int32_t* top_k;
  int32_t* device_buffer_tokens;
  const int64_t* host_cache_locs;
  const int32_t* device_buffer_locs;
  const void* host_cache;      // host pointer of pinned memory (mapped below)
  void* device_buffer;
  int32_t* top_k_device_locs;
  const void* req_pool_indices;
  const void* seq_lens;
  int16_t* lru_slots;
  const int32_t* num_real_reqs;
  int64_t batch;
  int64_t buffer_stride_0;
  int64_t host_stride;
  int64_t lru_slot_stride_0;
  int64_t top_k_stride;
  int64_t top_k_device_locs_stride;
  int64_t item_size_bytes;
  int64_t* miss_src;
  int32_t* miss_dst;
  int32_t* miss_count;
  int64_t plan_stride;
  void* stream;
};

namespace {
constexpr int kBlock = PEER_BLOCK_SIZE;
constexpr int kTopK = PEER_TOP_K;
constexpr int kHot = PEER_HOT_BUFFER;
constexpr size_t kSmem = sglang::SmemLayout<kTopK, kHot>::BYTES;

template <bool Record, bool SkipIO, typename SeqT, typename RidT>
constexpr auto kernel_of() {
  return sglang::load_cache_to_device_buffer_kernel<kBlock, kTopK, kHot, /*IsMLA=*/true,
      /*IsDsv4Layout=*/false, /*SPARSE_BLOCK_SIZE=*/1, /*TopKIsBlocks=*/false, Record, SkipIO,
      SeqT, RidT>;
}

const void* host_to_device(const void* host) {
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0) != cudaSuccess) {
    (void)cudaGetLastError();  // not mapped by this runtime: UVA identity, as our Triton copy
    return host;
  }
  return dev;
}

template <bool Record, bool SkipIO, typename SeqT, typename RidT>
int launch(const PeerArgs& a) {
  auto k = kernel_of<Record, SkipIO, SeqT, RidT>();
  if constexpr (kSmem > 48u * 1024u) {
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem);
    if (e != cudaSuccess) return (int)e;
  }
  k<<<(unsigned)a.batch, kBlock, kSmem, static_cast<cudaStream_t>(a.stream)>>>(
      a.top_k, a.device_buffer_tokens, a.host_cache_locs, a.device_buffer_locs,
      host_to_device(a.host_cache), nullptr, a.device_buffer, nullptr, a.top_k_device_locs,
      static_cast<const RidT*>(a.req_pool_indices), static_cast<const SeqT*>(a.seq_lens),
      a.lru_slots, a.num_real_reqs, a.buffer_stride_0, a.host_stride, a.lru_slot_stride_0,
      a.top_k_stride, a.top_k_device_locs_stride, /*page_size=*/1, a.item_size_bytes,
      a.miss_src, a.miss_dst, a.miss_count, a.plan_stride);
  return (int)cudaGetLastError();
}

template <bool Record, bool SkipIO>
int by_dtype(const PeerArgs& a, int seq64, int rid64) {
  if (seq64 && rid64) return launch<Record, SkipIO, int64_t, int64_t>(a);
  if (seq64) return launch<Record, SkipIO, int64_t, int32_t>(a);
  if (rid64) return launch<Record, SkipIO, int32_t, int64_t>(a);
  return launch<Record, SkipIO, int32_t, int32_t>(a);
}

template <bool Record, bool SkipIO>
const void* kernel_ptr(int seq64, int rid64) {
  if (seq64 && rid64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int64_t, int64_t>());
  if (seq64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int64_t, int32_t>());
  if (rid64) return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int32_t, int64_t>());
  return reinterpret_cast<const void*>(kernel_of<Record, SkipIO, int32_t, int32_t>());
}
}  // namespace

extern "C" {

// block, top_k, hot buffer, dynamic smem bytes, sizeof(PeerArgs) (checked against ctypes)
void peer_config(int64_t* out) {
  out[0] = kBlock;
  out[1] = kTopK;
  out[2] = kHot;
  out[3] = (int64_t)kSmem;
  out[4] = (int64_t)sizeof(PeerArgs);
}

int peer_set_device(int device) { return (int)cudaSetDevice(device); }

int peer_swap_in(int record, int skip_io, int seq64, int rid64, const PeerArgs* a) {
  if (record) return skip_io ? by_dtype<true, true>(*a, seq64, rid64) : by_dtype<true, false>(*a, seq64, rid64);
  return skip_io ? by_dtype<false, true>(*a, seq64, rid64) : by_dtype<false, false>(*a, seq64, rid64);
}

// numRegs, sharedSizeBytes (static), localSizeBytes, maxThreadsPerBlock, binaryVersion, dynamic smem
int peer_kernel_attrs(int record, int skip_io, int seq64, int rid64, int64_t* out) {
  const void* k = record ? (skip_io ? kernel_ptr<true, true>(seq64, rid64) : kernel_ptr<true, false>(seq64, rid64))
                         : (skip_io ? kernel_ptr<false, true>(seq64, rid64) : kernel_ptr<false, false>(seq64, rid64));
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, k);
  if (e != cudaSuccess) return (int)e;
  out[0] = attr.numRegs;
  out[1] = (int64_t)attr.sharedSizeBytes;
  out[2] = (int64_t)attr.localSizeBytes;
  out[3] = attr.maxThreadsPerBlock;
  out[4] = attr.binaryVersion;
  out[5] = (int64_t)kSmem;
  return 0;
}

const char* peer_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

}  // extern "C"
"""

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


# ================================================================== sources: locate and stage
@dataclass
class UpstreamSources:
    """Where the upstream header and its include trees are (a wheel, a directory or staged)."""
    origin: str                    # wheel path, package root, or 'staged:<dir>'
    version: str
    header_text: str
    header_member: str             # path of the header inside the origin


def kernel_signature(header_text: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``(template parameters, function parameters)`` of the ``__global__`` swap-in kernel,
    whitespace-normalised and without ``__restrict__``; raises PeerUnavailable when absent."""
    m = re.search(r"template\s*<(?P<tpl>[^>]*)>\s*__global__\s+void\s+" + KERNEL_NAME
                  + r"\s*\((?P<args>[^)]*)\)", header_text)
    if m is None:
        raise PeerUnavailable(f"the header has no __global__ {KERNEL_NAME}: the sglang release "
                              "is not one this peer was written for")

    def norm(part: str) -> Tuple[str, ...]:
        part = re.sub(r"//[^\n]*", "", part).replace("__restrict__", "")
        out = []
        for item in part.split(","):
            item = re.sub(r"\s+", " ", item).strip()
            item = re.sub(r"\s*\*\s*", "* ", item).strip()
            if item:
                out.append(item)
        return tuple(out)

    return norm(m.group("tpl")), norm(m.group("args"))


def check_kernel_contract(header_text: str) -> None:
    """Raises PeerUnavailable naming the first difference between the header's kernel and the
    interface our launcher passes arguments for."""
    tpl, args = kernel_signature(header_text)
    for what, got, want in (("template parameters", tpl, EXPECTED_TEMPLATE),
                            ("parameters", args, EXPECTED_PARAMS)):
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                     min(len(got), len(want)))
            raise PeerUnavailable(
                f"{KERNEL_NAME} {what} changed upstream: #{i} is "
                f"{got[i] if i < len(got) else '<none>'!r}, our launcher expects "
                f"{want[i] if i < len(want) else '<none>'!r} ({len(got)} vs {len(want)})")


def _wheel_version(name: str) -> str:
    m = re.match(r"[^-]+-([^-]+)-", Path(name).name)
    return m.group(1) if m else "unknown"


def _find_sglang_root(src: Optional[os.PathLike]) -> Tuple[str, Optional[zipfile.ZipFile], Path]:
    """Returns ``(kind, zip or None, root)`` of an sglang wheel / package root / site dir."""
    if src is None:
        env = os.environ.get("SGLANG_PEER_SRC")
        if env:
            src = env
        else:
            spec = importlib.util.find_spec("sglang")   # locates without importing it
            if spec is None or not spec.submodule_search_locations:
                raise PeerUnavailable(
                    "no sglang sources: pass a wheel or directory (stage --sglang PATH, or "
                    "SGLANG_PEER_SRC); get one with `pip download --no-deps sglang -d /tmp/sgl`")
            src = Path(list(spec.submodule_search_locations)[0]).parent
    p = Path(src)
    if p.is_file() and p.suffix == ".whl":
        return "wheel", zipfile.ZipFile(p), p
    if (p / "sglang").is_dir():
        return "dir", None, p
    if p.name == "sglang" and p.is_dir():
        return "dir", None, p.parent
    raise PeerUnavailable(f"{p} is neither an sglang wheel nor a directory holding sglang/")


def _members(kind, zf, root: Path, prefix: str) -> Dict[str, bytes]:
    """Files under ``prefix`` (relative paths -> bytes) from a wheel or a directory."""
    out = {}
    if kind == "wheel":
        for name in zf.namelist():
            if name.startswith(prefix + "/") and not name.endswith("/"):
                out[name[len(prefix) + 1:]] = zf.read(name)
    else:
        base = root / prefix
        for f in sorted(base.rglob("*")) if base.is_dir() else []:
            if f.is_file():
                out[str(f.relative_to(base))] = f.read_bytes()
    return out


def _read(kind, zf, root: Path, member: str) -> Optional[bytes]:
    if kind == "wheel":
        try:
            return zf.read(member)
        except KeyError:
            return None
    f = root / member
    return f.read_bytes() if f.is_file() else None


def _sglang_version(kind, zf, root: Path) -> str:
    if kind == "wheel":
        return _wheel_version(str(root))
    for d in root.glob("sglang-*.dist-info"):
        return d.name[len("sglang-"):-len(".dist-info")]
    v = _read(kind, zf, root, "sglang/version.py")
    m = re.search(rb"__version__\s*=\s*[\"']([^\"']+)", v or b"")
    return m.group(1).decode() if m else "unknown"


def _find_tvm_include(src: Optional[os.PathLike]) -> Tuple[str, Dict[str, bytes], str]:
    """``(origin, files, version)`` of tvm-ffi's header tree (``tvm/...`` and ``dlpack/...``)."""
    if src is None:
        env = os.environ.get("TVM_FFI_PEER_SRC")
        if env:
            src = env
        else:
            spec = importlib.util.find_spec("tvm_ffi")
            if spec is None or not spec.submodule_search_locations:
                raise PeerUnavailable(
                    "no tvm-ffi headers: pass an apache-tvm-ffi wheel or directory (stage "
                    "--tvm-ffi PATH); `pip download --no-deps apache-tvm-ffi -d /tmp/sgl` (any "
                    "platform tag: only its headers are used)")
            src = Path(list(spec.submodule_search_locations)[0]).parent
    p = Path(src)
    if p.is_file() and p.suffix == ".whl":
        zf = zipfile.ZipFile(p)
        files = _members("wheel", zf, p, TVM_INCLUDE)
        version = _wheel_version(str(p))
    else:
        root = p if (p / TVM_INCLUDE).is_dir() else p.parent
        files = _members("dir", None, root, TVM_INCLUDE)
        version = next((d.name[:-len(".dist-info")].split("-")[1]
                        for d in root.glob("apache_tvm_ffi-*.dist-info")), "unknown")
    if "tvm/ffi/container/tensor.h" not in files or "dlpack/dlpack.h" not in files:
        raise PeerUnavailable(f"{p} holds no tvm-ffi headers under {TVM_INCLUDE}/")
    return str(p), files, version


def stage_sources(sglang_src: Optional[os.PathLike] = None,
                  tvm_src: Optional[os.PathLike] = None,
                  build_dir: os.PathLike = DEFAULT_BUILD_DIR) -> Path:
    """Copies the upstream header and the include trees it needs into ``build_dir/src`` (an
    ignored build directory, carried to the GPU machine) and writes ``SOURCE.json``.

    Layout: ``src/include/sgl_kernel/...``, ``src/csrc/kvcacheio/hisparse.cuh``,
    ``src/tvm_include/{tvm,dlpack}/...``. Raises PeerUnavailable when a source is missing or the
    kernel's interface differs from the one our launcher was written for.
    """
    kind, zf, root = _find_sglang_root(sglang_src)
    for inc, hdr in HEADER_LAYOUTS:
        text = _read(kind, zf, root, hdr)
        if text is not None:
            break
    else:
        raise PeerUnavailable(f"{root}: no HiSparse header at any of "
                              f"{[h for _, h in HEADER_LAYOUTS]}")
    header_text = text.decode()
    check_kernel_contract(header_text)
    includes = _members(kind, zf, root, inc)
    if not any(k.startswith("sgl_kernel/") for k in includes):
        raise PeerUnavailable(f"{root}: no sgl_kernel headers under {inc}/")
    tvm_origin, tvm_files, tvm_version = _find_tvm_include(tvm_src)

    src = Path(build_dir) / "src"
    if src.exists():
        shutil.rmtree(src)
    for base, files in ((src / "include", includes), (src / "tvm_include", tvm_files)):
        for rel, data in files.items():
            f = base / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
    (src / "csrc" / "kvcacheio").mkdir(parents=True, exist_ok=True)
    (src / "csrc" / "kvcacheio" / "hisparse.cuh").write_text(header_text)
    meta = dict(sglang_origin=str(root), sglang_version=_sglang_version(kind, zf, root),
                header_member=hdr, header_sha256=hashlib.sha256(text).hexdigest(),
                tvm_ffi_origin=tvm_origin, tvm_ffi_version=tvm_version,
                licenses="sglang and apache-tvm-ffi: Apache-2.0 (staged build inputs, not part "
                         "of the repository)")
    (src / "SOURCE.json").write_text(json.dumps(meta, indent=1))
    return src


def staged_sources(build_dir: os.PathLike = DEFAULT_BUILD_DIR) -> Optional[UpstreamSources]:
    """The staged sources of ``build_dir`` (None when nothing is staged)."""
    src = Path(build_dir) / "src"
    hdr = src / "csrc" / "kvcacheio" / "hisparse.cuh"
    if not hdr.is_file() or not (src / "SOURCE.json").is_file():
        return None
    meta = json.loads((src / "SOURCE.json").read_text())
    return UpstreamSources(origin=f"staged:{src}", version=meta.get("sglang_version", "?"),
                           header_text=hdr.read_text(), header_member=meta.get("header_member"))


# ================================================================== build
@dataclass(frozen=True)
class KernelConfig:
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


def _nvcc(nvcc: Optional[str]) -> str:
    cand = nvcc or os.environ.get("NVCC") or shutil.which("nvcc")
    if cand is None:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        cand = os.path.join(home, "bin", "nvcc")
    if not os.path.isfile(cand):
        raise PeerUnavailable("nvcc not found (PATH, NVCC, CUDA_HOME): it builds the peer")
    return cand


def nvcc_command(cfg: KernelConfig, src_dir: Path, cu: Path, out: Path, arch: str,
                 nvcc: str = "nvcc") -> List[str]:
    """The compile line: SGLang's JIT flags for ``arch`` plus ``-shared`` and ptxas stats."""
    m = re.fullmatch(r"(\d)(\d)([af]?)", arch)
    if m is None:
        raise ValueError(f"arch must look like '90a' or '90', got {arch!r}")
    sgl_arch = int(m.group(1)) * 100 + int(m.group(2)) * 10
    return [nvcc, "-std=c++20", "-O3", "--expt-relaxed-constexpr", f"-DSGL_CUDA_ARCH={sgl_arch}",
            f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xcompiler", "-fPIC", "-shared",
            "-Xptxas", "-v", f"-DPEER_BLOCK_SIZE={cfg.block_size}", f"-DPEER_TOP_K={cfg.top_k}",
            f"-DPEER_HOT_BUFFER={cfg.hot_buffer_size}", f"-I{src_dir / 'include'}",
            f"-I{src_dir / 'csrc'}", f"-I{src_dir / 'tvm_include'}", str(cu), "-o", str(out)]


def _tree_sha(src_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in src_dir.rglob("*") if p.is_file() and p.name != "SOURCE.json"):
        h.update(str(f.relative_to(src_dir)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _default_arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}{minor}{'a' if major >= 9 else ''}"
    return DEFAULT_ARCH


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
    arch = arch or _default_arch()
    build_dir = Path(build_dir)
    src_dir = build_dir / "src"
    if sglang_src is not None or tvm_src is not None or staged_sources(build_dir) is None:
        stage_sources(sglang_src, tvm_src, build_dir)
    check_kernel_contract((src_dir / "csrc" / "kvcacheio" / "hisparse.cuh").read_text())
    lib = library_path(cfg, arch, build_dir)
    cmd_key = nvcc_command(cfg, Path("SRC"), Path("peer.cu"), Path("lib.so"), arch)[1:]
    key = hashlib.sha256(json.dumps([_tree_sha(src_dir), _LAUNCHER_SOURCE, cmd_key]).encode()
                         ).hexdigest()
    key_file = lib.with_suffix(".json")
    if not force and lib.is_file() and key_file.is_file() and \
            json.loads(key_file.read_text()).get("key") == key:
        return lib
    exe = _nvcc(nvcc)
    cu = lib.with_suffix(".cu")
    cu.write_text(_LAUNCHER_SOURCE)
    tmp = lib.with_name(lib.name + ".tmp")
    cmd = nvcc_command(cfg, src_dir, cu, tmp, arch, exe)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = lib.with_suffix(".log")
    log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise PeerUnavailable(f"nvcc failed ({proc.returncode}) building {lib.name}; log {log}:"
                              f"\n{tail}")
    os.replace(tmp, lib)
    ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    key_file.write_text(json.dumps(dict(key=key, arch=arch, config=cfg.__dict__,
                                        nvcc=ver.splitlines()[-1] if ver else "?",
                                        ptxas=ptxas_usage(log.read_text())), indent=1))
    return lib


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
    """Per kernel instantiation: registers, spills and static smem from a ``-Xptxas -v`` log."""
    out = []
    for m in re.finditer(r"Compiling entry function '(\S+)' for '(\S+)'(.*?)(?=Compiling entry|\Z)",
                         log_text, re.S):
        body = m.group(3)
        regs = re.search(r"Used (\d+) registers", body)
        smem = re.search(r"(\d+) bytes smem", body)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", body)
        out.append(dict(kernel=instance_label(m.group(1)), arch=m.group(2),
                        registers=int(regs.group(1)) if regs else None,
                        static_smem=int(smem.group(1)) if smem else 0,
                        spill_stores=int(spill.group(1)) if spill else None,
                        spill_loads=int(spill.group(2)) if spill else None))
    return out


# ================================================================== the loaded kernel
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
        arch = arch or _default_arch()
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


# ================================================================== state mapping (pure)
def device_buffer_locs(max_requests: int, device_buffer_size: int, page_size: int,
                       device=None) -> torch.Tensor:
    """int32 ``[R, D + P]``: global device row of each request's buffer slot (ours: request
    ``r`` owns rows ``r * (D + P) ..``; slot ``D`` is the reserved newest-token row)."""
    w = device_buffer_size + page_size
    r = torch.arange(max_requests, dtype=torch.int64, device=device)[:, None]
    return (r * w + torch.arange(w, dtype=torch.int64, device=device)).to(torch.int32)


def host_cache_locs(host_page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """int64 ``[R, max_pages * P]``: host row of each position (-1 where no page is allocated)."""
    t = host_page_table.to(torch.int64)
    R, pages = t.shape
    off = torch.arange(page_size, dtype=torch.int64, device=t.device)
    rows = t[:, :, None] * page_size + off
    return torch.where(t[:, :, None] >= 0, rows, -1).reshape(R, pages * page_size).contiguous()


def to_upstream_state(slot_unit: torch.Tensor, lru: torch.Tensor, page_size: int
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ours (token mode) -> upstream: ``slot_unit`` int32 ``[..., R, D]`` becomes
    ``device_buffer_tokens`` int32 ``[..., R, D + P]`` (reserved columns -1), ``lru`` int32
    ``[..., R, D]`` becomes ``lru_slots`` int16 (same order, least recent first)."""
    D = slot_unit.shape[-1]
    if lru.shape != slot_unit.shape:
        raise ValueError(f"slot map {tuple(slot_unit.shape)} and LRU {tuple(lru.shape)} differ")
    if D > INT16_MAX:
        raise PeerUnsupported(f"upstream LRU slots are int16: {D} slots do not fit")
    tokens = torch.full((*slot_unit.shape[:-1], D + page_size), -1, dtype=torch.int32,
                        device=slot_unit.device)
    tokens[..., :D] = slot_unit
    return tokens, lru.to(torch.int16)


def from_upstream_state(tokens: torch.Tensor, lru_slots: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream -> ours: ``(slot_unit int32 [..., R, D], lru int32 [..., R, D])``."""
    D = lru_slots.shape[-1]
    return tokens[..., :D].to(torch.int32).clone(), lru_slots.to(torch.int32)


def canonical_selection(topk: torch.Tensor, seq_lens: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(canon, where)``: the selection as upstream's kernel handles it exactly like ours --
    each row's valid (``0 <= p < seq_len``) distinct positions ascending, then -1 -- and, for
    every original entry, its column in ``canon`` (-1 for invalid entries)."""
    big = torch.iinfo(torch.int64).max
    t = topk.to(torch.int64)
    valid = (t >= 0) & (t < seq_lens.to(torch.int64)[:, None])
    v = torch.where(valid, t, big)
    s = torch.sort(v, dim=1).values
    dup = torch.zeros_like(s, dtype=torch.bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s = torch.sort(torch.where(dup, big, s), dim=1).values
    where = torch.searchsorted(s, v.contiguous())
    canon = torch.where(s == big, -1, s).to(torch.int32)
    return canon.contiguous(), torch.where(valid, where, -1)


def selection_contract_error(topk: np.ndarray, seq_lens: np.ndarray,
                             device_buffer_size: int) -> Optional[str]:
    """None when a selection (int ``[B, K]`` request-local positions, -1 padded; ``seq_lens``
    ``[B]``) is one upstream's kernel handles exactly: positions in ``[-1, seq_len)``, no
    position twice in a row, and for short requests (``seq_len <= device_buffer_size``) no -1
    before a valid entry. Otherwise the first violation, in words."""
    t = np.asarray(topk, dtype=np.int64)
    n = np.asarray(seq_lens, dtype=np.int64)[:, None]
    bad = (t < -1) | (t >= n)
    if bad.any():
        b = int(np.argwhere(bad)[0, 0])
        return f"batch row {b} selects a position outside [-1, seq_len={int(n[b, 0])})"
    s = np.sort(t, axis=1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    if dup.any():
        b = int(np.argwhere(dup)[0, 0])
        return f"batch row {b} selects a position twice (upstream's kernel would race)"
    valid = t >= 0
    gap = (~valid[:, :-1] & valid[:, 1:]) & (n <= device_buffer_size)
    if gap.any():
        b = int(np.argwhere(gap)[0, 0])
        return (f"batch row {b} (a short request, seq_len <= {device_buffer_size}) has -1 before "
                "a valid entry")
    return None


def uncanonical(out: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Output slots of a canonical selection back in the caller's entry order (-1 kept)."""
    g = torch.gather(out, 1, where.clamp(min=0))
    return torch.where(where >= 0, g, -1).to(torch.int32)


# ================================================================== pure-Python upstream model
@dataclass
class UpstreamStep:
    """What one upstream step did for one (layer, request): request-local slot offsets per entry
    (``None``: output left untouched), misses in order (position, slot)."""
    offsets: List[Optional[int]]
    hits: int
    misses: int
    loaded: List[Tuple[int, int]] = field(default_factory=list)


class UpstreamHotBuffer:
    """Upstream's per-(layer, request) policy, written from the kernel (module docstring).

    ``tokens[s]``: position in hot slot ``s`` (-1 empty); ``lru``: slots, least recent first.
    Duplicate positions in one selection are refused (the kernel's handling of them depends on a
    shared-memory race)."""

    def __init__(self, device_buffer_size: int, tokens=None, lru=None):
        self.D = device_buffer_size
        self.tokens = list(tokens) if tokens is not None else [-1] * self.D
        self.lru = list(lru) if lru is not None else list(range(self.D))

    @classmethod
    def from_model(cls, model) -> "UpstreamHotBuffer":
        """The same state as a token-mode ``harness.lru_model.HotBufferModel``."""
        if model.page_mode:
            raise PeerUnsupported("upstream's kernel is token-granular")
        return cls(model.D, model.slot_unit, model.lru)

    def step(self, seq_len: int, selection: Sequence[int]) -> UpstreamStep:
        D, K = self.D, len(selection)
        if seq_len <= D:
            count = min(seq_len, K)
            offs = [p if (i < count and p >= 0) else -1 for i, p in enumerate(selection)]
            return UpstreamStep(offs, len({p for p in offs if p >= 0}), 0)
        live = [p for p in selection if p >= 0 and p != seq_len - 1]
        if len(set(live)) != len(live):
            raise ValueError("duplicate positions: upstream's result would be racy")
        offs: List[Optional[int]] = [None] * K
        pending = {}
        newest_hit = 0
        for i, p in enumerate(selection):
            if p == seq_len - 1:
                offs[i], newest_hit = D, 1
            elif p >= 0:
                pending[p] = i
        hits, evictable = [], []
        for s in self.lru:                                   # LRU walk
            t = self.tokens[s]
            if t >= 0 and t in pending:
                offs[pending.pop(t)] = s
                hits.append(s)
            else:
                evictable.append(s)
        misses = sorted(pending.items(), key=lambda kv: kv[1])   # selection order
        loaded = []
        for j, (p, i) in enumerate(misses):
            s = evictable[j]
            self.tokens[s] = p
            offs[i] = s
            loaded.append((p, s))
        M = len(misses)
        self.lru = evictable[M:] + evictable[:M] + hits
        return UpstreamStep(offs, len(hits) + newest_hit, M, loaded)


class ModelSwapInKernel:
    """A stand-in with ``SGLangSwapInKernel.launch``'s buffer protocol that runs
    ``UpstreamHotBuffer`` on CPU tensors (tokens, int16 LRU, locs, host locs, output, miss plan,
    row copies): lets the CPU tests drive ``SGLangHiSparsePeer`` and ``compare_step`` end to end.
    """

    def __init__(self, cfg: KernelConfig):
        self.cfg = cfg

    def launch(self, *, top_k, device_buffer_tokens, host_cache_locs, device_buffer_locs,
               host_cache, device_buffer, top_k_device_locs, req_pool_indices, seq_lens,
               lru_slots, num_real_reqs, item_size_bytes, miss_src=None, miss_dst=None,
               miss_count=None, skip_io=False) -> None:
        D = self.cfg.hot_buffer_size
        for b in range(int(num_real_reqs[0])):
            r, n = int(req_pool_indices[b]), int(seq_lens[b])
            m = UpstreamHotBuffer(D, device_buffer_tokens[r, :D].tolist(), lru_slots[r].tolist())
            st = m.step(n, top_k[b].tolist())
            for i, off in enumerate(st.offsets):
                if off is not None:
                    top_k_device_locs[b, i] = -1 if off < 0 else device_buffer_locs[r, off]
            device_buffer_tokens[r, :D] = torch.tensor(m.tokens, dtype=torch.int32)
            lru_slots[r] = torch.tensor(m.lru, dtype=torch.int16)
            for j, (pos, slot) in enumerate(st.loaded):
                src, dst = int(host_cache_locs[r, pos]), int(device_buffer_locs[r, slot])
                if miss_src is not None:
                    miss_src[b, j], miss_dst[b, j] = src, dst
                if not skip_io:
                    device_buffer[dst] = host_cache[src]
            if miss_count is not None:
                miss_count[b] = st.misses


# ================================================================== the peer
class SGLangHiSparsePeer:
    """Upstream's swap-in kernel driving the host and device pools of a ``HiSparseCoordinator``.

    The peer keeps upstream's state (tokens, int16 LRU, locs, host locs; module docstring) for
    every (layer, request) and writes the missed rows into ``pools.device_kv`` from
    ``pools.host_kv``. ``pools``' own slot maps are only read: by ``sync_from`` (lockstep
    comparisons, ``compare_step``) and, for requests that have not been long yet, by
    ``begin_step`` (set-up grows them in position order, as upstream's coordinator does).
    Free-running use: ``pools.prefill`` then ``peer.prefill``; per step ``pools.begin_step`` then
    ``peer.begin_step`` (same arguments), then ``peer.swap_in`` per layer (no host sync). Use a
    coordinator of its own as ``pools`` (same config and seed as ours gives identical pools).
    Token mode only; raises PeerUnavailable without CUDA (unless a ``kernel`` stand-in such as
    ``ModelSwapInKernel`` is given).
    """

    def __init__(self, pools, *, block_size: int = DEFAULT_BLOCK_SIZE, build: bool = True,
                 build_dir: os.PathLike = DEFAULT_BUILD_DIR, kernel=None, **build_kw):
        if kernel is None and (pools.device.type != "cuda" or not torch.cuda.is_available()):
            raise PeerUnavailable("SGLang's swap-in kernel needs a CUDA coordinator")
        if pools.page_mode:
            raise PeerUnsupported("upstream's kernel is token-granular; load_granularity='page' "
                                  "has no upstream counterpart")
        if pools.row_bytes % 16:
            raise PeerUnsupported(f"row_bytes {pools.row_bytes} is not a multiple of 16")
        self.pools = pools
        self.cfg = KernelConfig(pools.top_k, pools.device_buffer_size, block_size)
        self.cfg.validate()
        self.kernel = kernel if kernel is not None else SGLangSwapInKernel.load(
            self.cfg, build=build, build_dir=build_dir, **build_kw)
        R, D, P, K = pools.max_requests, pools.device_buffer_size, pools.page_size, pools.top_k
        dev = pools.device
        self.tokens, self.lru_slots = to_upstream_state(pools.slot_unit, pools.lru, P)
        self.locs = device_buffer_locs(R, D, P, dev)
        self.host_locs: Optional[torch.Tensor] = None
        self.refresh_host_locs()
        self.out = torch.full((R, K), -1, dtype=torch.int32, device=dev)
        self.miss_src = torch.zeros((R, K), dtype=torch.int64, device=dev)
        self.miss_dst = torch.zeros((R, K), dtype=torch.int32, device=dev)
        self.miss_count = torch.zeros(R, dtype=torch.int32, device=dev)
        self.num_real = torch.zeros(1, dtype=torch.int32, device=dev)
        self._long_seen = np.zeros(R, dtype=bool)
        self.last_where: Optional[torch.Tensor] = None
        self.last_selection: Optional[torch.Tensor] = None   # what the kernel last saw

    @classmethod
    def modelled(cls, pools) -> "SGLangHiSparsePeer":
        """The peer with ``ModelSwapInKernel`` (upstream's policy in Python) in place of the
        compiled kernel: runs anywhere, CPU included (tests, ``harness.bench peers --quick``)."""
        return cls(pools, kernel=ModelSwapInKernel(KernelConfig(pools.top_k,
                                                                pools.device_buffer_size)))

    # ---- state
    def sync_from(self, coord, layers=None, reqs=None) -> None:
        """Copies a coordinator's slot maps and LRU orders (ours) into upstream's layout."""
        layers = range(coord.num_layers) if layers is None else layers
        reqs = slice(None) if reqs is None else torch.as_tensor(list(reqs), dtype=torch.long)
        for layer in layers:
            self.load_state(layer, coord.slot_unit[layer][reqs], coord.lru[layer][reqs], reqs)
        self.refresh_host_locs()

    def load_state(self, layer: int, slot_unit: torch.Tensor, lru: torch.Tensor,
                   reqs=slice(None)) -> None:
        """Sets the hot-buffer state of ``layer`` for requests ``reqs`` from ours: ``slot_unit``
        and ``lru`` int32 ``[len(reqs), D]`` (position per slot; slots least recent first)."""
        tok, lru16 = to_upstream_state(slot_unit, lru, self.pools.page_size)
        self.tokens[layer][reqs] = tok.to(self.tokens.device)
        self.lru_slots[layer][reqs] = lru16.to(self.lru_slots.device)

    def refresh_host_locs(self) -> None:
        """Re-reads the host page table of ``pools`` (after ``load_host_kv`` allocated pages),
        in place: a captured CUDA graph keeps reading the same buffer."""
        locs = host_cache_locs(self.pools.host_page_table, self.pools.page_size)
        if self.host_locs is not None and self.host_locs.shape == locs.shape:
            self.host_locs.copy_(locs)
        else:
            self.host_locs = locs

    def prefill(self, reqs) -> None:
        """After ``pools.prefill``: takes the fresh hot buffers (positions ``0..``)."""
        reqs = [int(r) for r in reqs]
        self._long_seen[reqs] = False
        self.sync_from(self.pools, reqs=reqs)

    def begin_step(self, reqs, seq_lens) -> None:
        """After ``pools.begin_step`` (same arguments): requests that have not been long yet take
        the grown buffers (position order, as upstream's coordinator grows them); from the first
        step at ``seq_len > D`` on, the peer's state is its own."""
        D = self.pools.device_buffer_size
        fresh = [int(r) for r in reqs if not self._long_seen[int(r)]]
        if fresh:
            self.sync_from(self.pools, reqs=fresh)
        for r, n in zip(reqs, seq_lens):
            if int(n) > D:
                self._long_seen[int(r)] = True
        self.refresh_host_locs()

    def state(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(slot_unit, lru)`` of ``layer`` in our layout (int32 ``[R, D]`` each)."""
        return from_upstream_state(self.tokens[layer], self.lru_slots[layer])

    # ---- the call
    def swap_in(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                topk_indices: torch.Tensor, layer_id: int, skip_io: bool = False) -> torch.Tensor:
        """Like ``HiSparseCoordinator.swap_in_selected_pages``: int32 ``[B, top_k]`` global rows
        of ``pools.device_pool(layer_id)`` in the caller's entry order. Runs the canonicalising
        sort (a few small torch ops), the -1 fill of the output and upstream's kernel."""
        canon, where = canonical_selection(topk_indices, seq_lens)
        out = self.swap_in_direct(req_pool_indices, seq_lens, canon, layer_id, skip_io)
        self.last_where = where
        return uncanonical(out, where)

    def swap_in_direct(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       topk_indices: torch.Tensor, layer_id: int, skip_io: bool = False
                       ) -> torch.Tensor:
        """Upstream's kernel alone, fed the selection as SGLang feeds it the indexer's top-k:
        int32 ``[B, top_k]`` that meets upstream's contract (``selection_contract_error`` is
        None: e.g. a canonical selection). Returns int32 ``[B, top_k]`` global rows of
        ``pools.device_pool(layer_id)`` per entry, -1 for -1 entries. Runs the -1 fill of the
        output and the kernel."""
        B = topk_indices.shape[0]
        out = self.out[:B]
        out.fill_(-1)
        self.num_real.fill_(B)
        self.kernel.launch(
            top_k=topk_indices, device_buffer_tokens=self.tokens[layer_id],
            host_cache_locs=self.host_locs, device_buffer_locs=self.locs,
            host_cache=self.pools.host_kv[layer_id], device_buffer=self.pools.device_kv[layer_id],
            top_k_device_locs=out, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
            lru_slots=self.lru_slots[layer_id], num_real_reqs=self.num_real,
            item_size_bytes=self.pools.row_bytes, miss_src=self.miss_src[:B],
            miss_dst=self.miss_dst[:B], miss_count=self.miss_count[:B], skip_io=skip_io)
        self.last_selection = topk_indices
        return out

    def last_counts(self) -> Dict[str, torch.Tensor]:
        """``hits`` and ``misses`` (int64 ``[B]``) of the latest call, derived as ours counts
        them: misses = upstream's miss count, hits = distinct valid selections - misses (the
        latest selection met the contract, so its entries >= 0 are distinct and valid)."""
        B = self.last_selection.shape[0]
        misses = self.miss_count[:B].to(torch.int64)
        distinct = (self.last_selection >= 0).sum(dim=1).to(torch.int64)
        return dict(hits=distinct - misses, misses=misses,
                    tokens_loaded=misses, bytes_h2d=misses * self.pools.row_bytes)


def compare_step(ours, peer: SGLangHiSparsePeer, req_pool_indices: torch.Tensor,
                 seq_lens: torch.Tensor, topk_indices: torch.Tensor, layer_id: int
                 ) -> Dict[str, object]:
    """One lockstep step: the peer takes our state for this layer, both swap in, and the report
    says what agrees. ``ours`` and ``peer.pools`` must hold identical pools (same config, seed,
    host KV, prefill and begin_step). Upstream is also checked against ``UpstreamHotBuffer``.

    Keys: ``slots`` (output tables equal), ``slot_map`` (slot -> position equal), ``lru_prefix``
    (non-hit part of the LRU equal), ``lru_hit_set`` (same hit slots at the MRU end),
    ``lru_exact``, ``misses``, ``hits`` (counts equal), ``pool`` (the layer's device rows equal
    byte for byte), ``model`` (upstream equals the pure-Python model of upstream), and
    ``n_hits``/``n_misses`` totals.
    """
    peer.sync_from(ours, layers=[layer_id])
    old_tokens = peer.tokens[layer_id].cpu().numpy().copy()    # .cpu() aliases CPU tensors
    old_lru = peer.lru_slots[layer_id].cpu().numpy().copy()
    out_ours = ours.swap_in_selected_pages(req_pool_indices, seq_lens, topk_indices, layer_id)
    out_peer = peer.swap_in(req_pool_indices, seq_lens, topk_indices, layer_id)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    c_ours = {k: v.cpu() for k, v in ours.layer_counts(layer_id).items()}
    c_peer = {k: v.cpu() for k, v in peer.last_counts().items()}
    su_o, lru_o = ours.slot_unit[layer_id].cpu(), ours.lru[layer_id].cpu()
    su_p, lru_p = (t.cpu() for t in peer.state(layer_id))
    reqs = req_pool_indices.cpu().numpy().astype(np.int64)
    seqs = seq_lens.cpu().numpy().astype(np.int64)
    canon = peer.last_selection.cpu().numpy()
    rep = dict(slots=torch.equal(out_ours.cpu(), out_peer.cpu()),
               slot_map=torch.equal(su_o[reqs], su_p[reqs]),
               misses=torch.equal(c_ours["misses"], c_peer["misses"]),
               hits=torch.equal(c_ours["hits"], c_peer["hits"]),
               pool=torch.equal(ours.device_kv[layer_id].cpu(),
                                peer.pools.device_kv[layer_id].cpu()),
               lru_exact=torch.equal(lru_o[reqs], lru_p[reqs]),
               n_hits=int(c_peer["hits"].sum()), n_misses=int(c_peer["misses"].sum()))
    prefix_ok, hitset_ok, model_ok = True, True, True
    out_p = peer.out[:len(reqs)].cpu().numpy()
    D = ours.device_buffer_size
    for b, r in enumerate(reqs):
        m = UpstreamHotBuffer(D, old_tokens[r, :D].tolist(), old_lru[r].tolist())
        st = m.step(int(seqs[b]), canon[b].tolist())
        base = r * (D + ours.page_size)
        want = [-1 if o is None or o < 0 else base + o for o in st.offsets]
        model_ok &= (want == out_p[b].tolist() and m.tokens == su_p[r].tolist()
                     and m.lru == lru_p[r].tolist() and st.misses == int(c_peer["misses"][b]))
        if seqs[b] > D:
            n_hit_slots = st.hits - int((canon[b] == seqs[b] - 1).any())
            cut = D - n_hit_slots
            prefix_ok &= lru_o[r, :cut].tolist() == lru_p[r, :cut].tolist()
            hitset_ok &= sorted(lru_o[r, cut:].tolist()) == sorted(lru_p[r, cut:].tolist())
    rep.update(lru_prefix=prefix_ok, lru_hit_set=hitset_ok, model=model_ok)
    return rep


# ================================================================== CLI
def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.kernels.sglang_peer",
                                 description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="stage upstream sources into the build dir")
    s.add_argument("--sglang", help="sglang wheel or directory (default: installed package)")
    s.add_argument("--tvm-ffi", help="apache-tvm-ffi wheel or directory (headers only)")
    b = sub.add_parser("build", help="compile the peer library (needs nvcc, not a GPU)")
    b.add_argument("--top-k", type=int, required=True)
    b.add_argument("--hot", type=int, required=True, help="device_buffer_size")
    b.add_argument("--block", type=int, default=DEFAULT_BLOCK_SIZE)
    b.add_argument("--arch", default=None, help=f"e.g. 90a (default: this GPU, else {DEFAULT_ARCH})")
    b.add_argument("--force", action="store_true")
    sub.add_parser("info", help="staged sources, built libraries, kernel attributes on a GPU")
    for p in (s, b):
        p.add_argument("--build-dir", default=str(DEFAULT_BUILD_DIR))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "stage":
            src = stage_sources(args.sglang, args.tvm_ffi, args.build_dir)
            size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
            print(f"staged {src} ({size / 1e6:.2f} MB)")
            print((src / "SOURCE.json").read_text())
        elif args.cmd == "build":
            cfg = KernelConfig(args.top_k, args.hot, args.block)
            lib = build_library(cfg, arch=args.arch, build_dir=args.build_dir, force=args.force)
            meta = json.loads(lib.with_suffix(".json").read_text())
            print(f"{lib} ({lib.stat().st_size / 1e6:.2f} MB, {meta['nvcc']}), dynamic smem "
                  f"{smem_bytes(cfg.top_k, cfg.hot_buffer_size)} B")
            for k in meta["ptxas"]:
                print(f"  {k['registers']} regs, spills {k['spill_stores']}/{k['spill_loads']} B "
                      f"{k['kernel']}")
        else:
            st = staged_sources()
            print(f"staged: {st.origin if st else None} (sglang {st.version if st else '-'})")
            for lib in sorted(DEFAULT_BUILD_DIR.glob("libsglang_hisparse_*.so")):
                meta = json.loads(lib.with_suffix(".json").read_text())
                print(f"{lib.name}: {meta['config']} sm{meta['arch']} {meta['nvcc']}")
                if torch.cuda.is_available():
                    k = SGLangSwapInKernel(lib, KernelConfig(**meta["config"]))
                    print("  ", k.kernel_attrs())
    except (PeerUnavailable, PeerUnsupported) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
