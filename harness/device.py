"""Device choice: the GPU when CUDA is present, else the CPU with Triton's interpreter.

Must run before any Triton kernel module is imported: ``triton.jit`` decides at decoration
time whether a kernel is compiled or interpreted.
"""
from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger("harness")

DEVICES = ("auto", "cuda", "cpu")


def choose_triton_mode(argv) -> None:
    """Sets ``TRITON_INTERPRET=1`` before any kernel module is imported when the run will use the
    CPU: no CUDA on this machine, or ``device=cpu`` among the command-line overrides."""
    if not torch.cuda.is_available() or any(a.split("=", 1)[-1] == "cpu" for a in argv
                                            if a.lstrip("+").startswith("device=")):
        os.environ["TRITON_INTERPRET"] = "1"


def resolve_device(requested: str) -> torch.device:
    """'auto' -> cuda if available else cpu. Sets TRITON_INTERPRET=1 for the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        from harness.validate import ConfigError
        raise ConfigError("device", "cuda", "CUDA is not available on this machine; use device=cpu or auto")
    if requested == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        from harness.validate import ConfigError
        raise ConfigError("device", "cpu", "on a machine with a GPU, give device=cpu on the command line "
                          "(Triton's interpreter is chosen before the kernels are imported)")
    return torch.device(requested)
