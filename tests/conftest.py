"""Test set-up: two suites that never mix in one process.

* The CPU suite (every test not marked ``gpu``; ``make test``, what CI runs): the Triton kernels
  run through the interpreter on CPU tensors. On a machine with a GPU the GPUs are hidden from
  the process (``CUDA_VISIBLE_DEVICES=``), because these tests were written for a machine
  without CUDA (CPU tensors handed to kernels, CLI sweeps with ``device=cpu``); with CUDA
  visible, 142 of them failed on the H200 (BENCHMARKS.md 6t).
* The GPU suite (``-m gpu``; ``make test-gpu``): the ``gpu``-marked tests, real kernels on CUDA.

Which one runs follows the ``-m`` expression: the GPU suite when it selects ``gpu``-marked tests
and no others, the CPU suite otherwise (``gpu``-marked tests are then skipped with the reason).
The choice is made in ``pytest_configure``, before any test module imports a kernel or touches
CUDA.
"""
import itertools
import os
import re

import pytest
import torch

#: set by pytest_configure: whether this process runs the GPU suite
GPU_SUITE = False
#: and whether a GPU was there before the CPU suite hid it
HID_GPUS = False


def selects_gpu_suite(markexpr: str) -> bool:
    """Whether a ``-m`` expression selects ``gpu``-marked tests and nothing else (some marking
    with ``gpu`` matches, none without it does): true for ``gpu``, ``gpu and not slow`` or
    ``gpu and slow``, false for ``""``, ``not gpu`` or ``gpu or slow``."""
    names = sorted(set(re.findall(r"[A-Za-z_][\w.:-]*", markexpr)) - {"and", "or", "not"})
    if "gpu" not in names:
        return False
    try:
        from _pytest.mark.expression import Expression
        expr = Expression.compile(markexpr)
        with_gpu, without_gpu = False, False
        for bits in itertools.product((False, True), repeat=len(names)):
            marks = dict(zip(names, bits))
            hit = expr.evaluate(lambda name, *a, **k: marks.get(name, False))
            with_gpu |= hit and marks["gpu"]
            without_gpu |= hit and not marks["gpu"]
        return with_gpu and not without_gpu
    except Exception:       # another pytest's internals: the plain reading
        return markexpr.strip() == "gpu"


def pytest_configure(config):
    global GPU_SUITE, HID_GPUS
    GPU_SUITE = selects_gpu_suite(config.getoption("markexpr", "") or "")
    if not GPU_SUITE:
        HID_GPUS = _driver_sees_a_gpu()
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["TRITON_INTERPRET"] = "1"


def _driver_sees_a_gpu() -> bool:
    """Whether the machine has an NVIDIA device node (for the skip reason only; asking CUDA
    would initialise it in this process before the GPUs are hidden)."""
    return os.path.exists("/dev/nvidiactl")


def pytest_collection_modifyitems(config, items):
    if GPU_SUITE and torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU test: run the GPU suite with -m gpu (make test-gpu); this "
                                   "run hides the GPUs" if HID_GPUS else "needs CUDA (GPU test)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The device kernels run on: CUDA in the GPU suite, else the CPU (Triton interpreter)."""
    return torch.device("cuda" if GPU_SUITE and torch.cuda.is_available() else "cpu")
