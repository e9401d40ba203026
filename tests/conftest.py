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
        why = interpreter_problem()
        if why is not None:
            pytest.exit(why, returncode=pytest.ExitCode.USAGE_ERROR)


def interpreter_problem(probe=None):
    """Why the installed Triton's interpreter cannot run this project's kernels (one line
    naming the versions and what to do), or None. ``probe`` (default: a kernel with a loop
    bound loaded from memory and ``~`` on uint32, two things every kernel suite here uses)
    runs on the CPU through the interpreter; Triton 3.6's interpreter fails both under
    numpy 2.x (on the GPU machine 239 of the CPU suite's tests failed so, BENCHMARKS.md 6u)."""
    import numpy
    import triton
    try:
        (probe or _interpreter_probe)()
    except Exception as e:      # the interpreter's own error, whatever its type
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return (f"the CPU suite runs the kernels through the Triton interpreter, and that of "
                f"triton {triton.__version__} fails under numpy {numpy.__version__} "
                f"({type(e).__name__}: {first}); run it in the environment `make setup` "
                "builds (what CI runs), or run the GPU suite here: pytest -m gpu")
    return None


def _interpreter_probe():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, n_ptr):
        acc = tl.zeros([4], tl.uint32)
        for i in range(0, tl.load(n_ptr)):
            acc += ~tl.full([4], i, tl.uint32)
        tl.store(out_ptr + tl.arange(0, 4), acc)

    out = torch.zeros(4, dtype=torch.int32)
    probe[(1,)](out, torch.tensor([3], dtype=torch.int32))
    if out.tolist() != [-6] * 4:        # ~0 + ~1 + ~2 = 3 * (2**32 - 1) - 3 wraps to -6
        raise AssertionError(f"probe kernel computed {out.tolist()}, expected [-6] * 4")


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
