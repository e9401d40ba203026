"""The test set-up's choice between the CPU and the GPU suite (tests/conftest.py)."""
import os

import pytest
import torch

from conftest import interpreter_problem, selects_gpu_suite


@pytest.mark.parametrize("markexpr,gpu_suite", [
    ("", False), ("not gpu", False), ("gpu or slow", False), ("slow", False),
    ("gpu", True), (" gpu ", True), ("(gpu)", True), ("gpu and not slow", True),
    ("gpu and slow", True), ("not (not gpu)", True)])
def test_gpu_suite_only_when_the_expression_selects_gpu_tests_alone(markexpr, gpu_suite):
    assert selects_gpu_suite(markexpr) is gpu_suite


def test_cpu_suite_hides_the_gpus_and_interprets(device):
    """This test is not gpu-marked, so it runs in the CPU suite: no CUDA device is visible to the
    process (nor to the CLI sweeps it starts), the kernels go through the interpreter, and the
    tests' device is the CPU, on any machine."""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["TRITON_INTERPRET"] == "1"
    assert not torch.cuda.is_available() and device.type == "cpu"


def test_interpreter_problem_names_versions_and_the_way_out():
    """The CPU suite's interpreter check: the installed Triton runs the probe kernel (this
    suite got here), and a failing interpreter (a stand-in raising as Triton 3.6's did under
    numpy 2.x) gives one line with both versions, the error and what to run instead."""
    import numpy
    import triton
    assert interpreter_problem() is None

    def broken():
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
    why = interpreter_problem(broken)
    assert f"triton {triton.__version__}" in why and f"numpy {numpy.__version__}" in why
    assert "TypeError: only 0-dimensional arrays" in why and "-m gpu" in why
    assert "make setup" in why and "\n" not in why
