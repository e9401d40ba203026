"""Test set-up: without CUDA the Triton kernels run through the interpreter on CPU tensors."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA (GPU test)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The device kernels run on: CUDA when present, else the CPU (Triton interpreter)."""
    return torch.device("cuda" if HAS_CUDA else "cpu")
