# Two commands do all set-up on a fresh machine:
#   make run   - creates .venv when missing, installs the project, runs the default sweep and
#                writes results + a report under results/
#   make test  - same set-up, runs the test suite: the CPU suite, the same on every machine
#                (GPUs hidden, kernels through the Triton interpreter: tests/conftest.py; CI)
#   make test-gpu - the gpu-marked tests on this machine's GPU (real kernels; needs CUDA)
# Without an NVIDIA GPU the set-up installs a CPU build of torch (torch==2.13.0, a file on this
# kind of machine's disk) instead of a multi-GB CUDA build, and the runs use the Triton interpreter.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC := $(if $(HAS_GPU),torch,torch==2.13.0)
SWEEP ?= $(if $(HAS_GPU),page_topk,cpu_smoke)
PYTEST_ARGS ?=
# the suite on 2 worker processes (pytest-xdist, in the [test] extra), whole files per worker so
# that module-scoped fixtures (the CLI sweeps several tests share) run once; PYTEST_XDIST= runs it
# in one process
PYTEST_XDIST ?= -n 2 --dist loadfile

.PHONY: run test test-gpu setup clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m harness +sweep=$(SWEEP)

# the CPU suite hides the GPUs itself (tests/conftest.py)
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

# one process: the GPU tests time kernels and share the GPU
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
