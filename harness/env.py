"""Provenance captured with every result row: code version, library versions, machine."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import tempfile
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional

import torch

from backends.kernels.flashmla_peer import flashmla_build
from harness.config import ROOT
from harness.launchers import gpu_slot


def _git(*args: str, root: Path = ROOT, env: Optional[Dict[str, str]] = None,
         stdin: Optional[str] = None) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10, env=env, input=stdin).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


#: what a row's code is (``code_tree_sha``): the project's code and configuration
CODE_PATHS = ("harness", "backends", "conf", "sweeps", "pyproject.toml")


def code_tree_sha(commit: Optional[str] = None, root: Path = ROOT) -> Optional[str]:
    """The git tree id of :data:`CODE_PATHS` under ``root``: as they are on disk (tracked files
    and untracked ones git does not ignore) or, given ``commit``, as committed there. Equal ids
    mean the same code, so a row whose ``git_sha`` is stale (a copied tree with an older
    ``.git``, as on the GPU machine) still names its code: compare with
    ``code_tree_sha("<commit>")``. Built in a temporary index (the repository's own index is
    not touched); None outside a git checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        if commit is None:
            paths = [p for p in CODE_PATHS if (root / p).exists()]
            if paths:
                _git("add", "-A", "--", *paths, root=root, env=env)
        else:
            listing = _git("ls-tree", "-r", "--full-tree", commit, "--", *CODE_PATHS,
                           root=root, env=env)
            if listing:
                _git("update-index", "--index-info", root=root, env=env, stdin=listing + "\n")
        sha = _git("write-tree", root=root, env=env)
    return sha if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha) else None


def host_virtualized(cpuinfo: str = "/proc/cpuinfo") -> Optional[bool]:
    """Whether this machine is a virtual machine (the CPU's ``hypervisor`` flag in ``cpuinfo``;
    None where that cannot be read). In one, the GPU's reads of host memory go
    through the hypervisor's IOMMU translation of guest addresses, which the guest cannot see
    or configure (BENCHMARKS 6v)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return "hypervisor" in line.split()
    except OSError:
        pass
    return None


def provenance(device: str) -> Dict[str, object]:
    """git_sha, git_dirty, code_tree_sha (:func:`code_tree_sha`), torch/triton versions, the FlashMLA build (``flashmla_peer.flashmla_build``: distribution, version, commit or "none"), GPU name and host of this process, whether the host is a virtual machine (:func:`host_virtualized`); the GPU slot
    it runs on under ``hydra/launcher=local_gpus`` (``harness.launchers.gpu_slot``) and its
    ``CUDA_VISIBLE_DEVICES``."""
    return {**_process_provenance(device), "gpu_slot": gpu_slot(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


@lru_cache(maxsize=None)
def _process_provenance(device: str) -> Dict[str, object]:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = "absent"
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else f"cpu ({platform.processor() or platform.machine()})"
    sha = _git("rev-parse", "HEAD")
    if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
        sha = "unknown"  # not a git checkout (e.g. a copied tree on the GPU machine)
    return {
        "git_sha": sha,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")) if sha != "unknown" else None,
        "code_tree_sha": code_tree_sha() if sha != "unknown" else None,
        "torch_version": torch.__version__,
        "triton_version": triton_version,
        "flashmla_build": flashmla_build(),
        "gpu_name": gpu,
        "hostname": socket.gethostname(),
        "host_virtualized": host_virtualized(),
    }


def timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
