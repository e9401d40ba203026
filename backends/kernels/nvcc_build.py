"""Building CUDA shared libraries with nvcc, for the kernels loaded through ctypes (SGLang's
swap-in peer, ``sglang_peer/build.py``; our CUDA resolve, ``swap_in_cuda.py``): finding nvcc,
this GPU's ``-gencode`` arch, a build reused while its key (sources, flags) is unchanged, and the
ptxas report of each kernel."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from backends.kernels.flashmla_peer import PeerUnavailable

DEFAULT_ARCH = "90a"              # H100 / H200


def find_nvcc(nvcc: Optional[str] = None, what: str = "the library") -> str:
    """Path of nvcc: ``nvcc``, else ``$NVCC``, ``PATH``, ``$CUDA_HOME/bin``; PeerUnavailable
    naming ``what`` when there is none."""
    cand = nvcc or os.environ.get("NVCC") or shutil.which("nvcc")
    if cand is None:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        cand = os.path.join(home, "bin", "nvcc")
    if not os.path.isfile(cand):
        raise PeerUnavailable(f"nvcc not found (PATH, NVCC, CUDA_HOME): it builds {what}")
    return cand


def default_arch() -> str:
    """This GPU's arch as nvcc's ``-gencode`` suffix (``90a`` on H100/H200), else
    ``DEFAULT_ARCH``."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}{minor}{'a' if major >= 9 else ''}"
    return DEFAULT_ARCH


def gencode(arch: str) -> str:
    """``-gencode`` flag for ``arch`` (``'90a'``, ``'90'``, ``'100f'``...)."""
    if re.fullmatch(r"\d\d[af]?", arch) is None:
        raise ValueError(f"arch must look like '90a' or '90', got {arch!r}")
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def ptxas_usage(log_text: str, label: Callable[[str], str] = lambda name: name
                ) -> List[Dict[str, object]]:
    """Per kernel instantiation of a ``-Xptxas -v`` log: registers, spills, static smem
    (``label`` names an instance from its mangled name)."""
    out = []
    for m in re.finditer(r"Compiling entry function '(\S+)' for '(\S+)'(.*?)(?=Compiling entry|\Z)",
                         log_text, re.S):
        body = m.group(3)
        regs = re.search(r"Used (\d+) registers", body)
        smem = re.search(r"(\d+) bytes smem", body)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", body)
        out.append(dict(kernel=label(m.group(1)), arch=m.group(2),
                        registers=int(regs.group(1)) if regs else None,
                        static_smem=int(smem.group(1)) if smem else 0,
                        spill_stores=int(spill.group(1)) if spill else None,
                        spill_loads=int(spill.group(2)) if spill else None))
    return out


def build_cached(lib: Path, command: Callable[[str, Path], List[str]], key_parts: list,
                 *, nvcc: Optional[str] = None, force: bool = False, what: str = "the library",
                 label: Callable[[str], str] = lambda name: name, meta: Optional[dict] = None
                 ) -> Path:
    """Builds the shared library ``lib`` unless ``lib`` and its key file (``lib.json``) exist
    with the same key (``key_parts``: sources and flags, JSON-serialisable), which needs no nvcc
    (a library built on another machine and carried). ``command(nvcc, out)`` is the compile
    line writing ``out``; the log goes to ``lib.log``, the key, nvcc's version, ``meta`` and the
    ptxas report to ``lib.json``. PeerUnavailable without nvcc or when nvcc fails (the log's
    tail in the message)."""
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()
    key_file = lib.with_suffix(".json")
    if not force and lib.is_file() and key_file.is_file() and \
            json.loads(key_file.read_text()).get("key") == key:
        return lib
    exe = find_nvcc(nvcc, what)
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(lib.name + f".{os.getpid()}.tmp")
    cmd = command(exe, tmp)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = lib.with_suffix(".log")
    log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise PeerUnavailable(f"nvcc failed ({proc.returncode}) building {lib.name}; log {log}:"
                              f"\n{tail}")
    os.replace(tmp, lib)
    ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    key_file.write_text(json.dumps(dict(key=key, **(meta or {}),
                                        nvcc=ver.splitlines()[-1] if ver else "?",
                                        ptxas=ptxas_usage(log.read_text(), label)), indent=1))
    return lib
