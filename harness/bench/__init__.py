"""Kernel micro-benchmarks on one registry: ``python -m harness.bench list`` shows them,
``python -m harness.bench run NAME [--quick]`` runs one (``harness/bench/__main__.py``).

Importing the package selects the Triton interpreter when there is no GPU, before any bench
module imports (and so defines) a Triton kernel.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
