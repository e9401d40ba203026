"""Device choice: the GPU when CUDA is present, else the CPU with Triton's interpreter.

Must run before any Triton kernel module is imported: ``triton.jit`` decides at decoration
time whether a kernel is compiled or interpreted.
"""
from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger("harness")


def resolve_device(requested: str) -> torch.device:
    """'auto' -> cuda if available else cpu. Sets TRITON_INTERPRET=1 for the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        from harness.validate import ConfigError
        raise ConfigError("device", "cuda", "CUDA is not available on this machine; use device=cpu or auto")
    if requested == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.device(requested)
