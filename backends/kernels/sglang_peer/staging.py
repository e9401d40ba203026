"""Upstream's sources for the peer build: SGLang's HiSparse kernel header, the ``sgl_kernel``
headers it includes and tvm-ffi's headers (``tvm/ffi/*``, ``dlpack``), taken out of the installed
packages or downloaded wheels into ``.peer_build/sglang_hisparse/src`` (an ignored build
directory, never part of this repository), plus the check that the staged kernel still has the
interface our launcher (``launcher.cu``) passes arguments for."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from backends.kernels.flashmla_peer import PeerUnavailable

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_BUILD_DIR = REPO_ROOT / ".peer_build" / "sglang_hisparse"

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
