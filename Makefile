# hetgmp developer entry points. Every target installs what it needs, idempotently.
#   make demo   generate a data set, partition it, train on CPU ranks under mpirun
#   make test   lint (ruff, mypy), then the test suite (what CI runs)
#   make lint   ruff on the sources, mypy on hetgmp/
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
NP ?= 4
DEMO_DIR ?= runs/demo
# Open MPI refuses to run as root unless told; containers and CI run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install demo test test-all lint bench clean

$(VENV)/.deps-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch 2.13.0 lies on local disk; asking for it first keeps pip from
	# fetching a multi-GB CUDA build to satisfy the range in pyproject.toml.
	$(PIP) install -q torch==2.13.0 || $(PIP) install -q "torch>=2.4,<2.15"
	$(PIP) install -q setuptools wheel "pybind11>=2.12" "cmake>=3.18" ninja
	# test: the tools; plots: the experiments' PNGs (their tests make them); gpu: triton,
	# whose kernels the tests also run in its interpreter on CPU; async: pyzmq (--sync async)
	$(PIP) install -q --no-build-isolation -e ".[test,mpi,plots,gpu,async]"
	touch $@

$(VENV)/.native-stamp: $(VENV)/.deps-stamp CMakeLists.txt setup.py $(wildcard src/*.cpp src/*.h)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PY) -c "from hetgmp.native import native; native()"
	touch $@

install: $(VENV)/.native-stamp

demo: install
	$(PY) -m hetgmp.demo --out $(DEMO_DIR) --np $(NP)

# Two pytest workers: most tests wait on spawned ranks and process start-up, not on a core
# (2-core box, 2026-11-26: 8 min 04 s with one worker, 6 min 08-28 s with two; after issue 35
# 3 min 47 s + 10 s of lint at load 3: docs/testing.md; TEST_WORKERS=0 runs in one process).
TEST_WORKERS ?= 2
# lint first: CI runs `make test` alone (.ci/run), and a type error fails it in seconds
test: install lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow and not gpu" tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# everything but the GPU tests: the slow scale tests too
test-all: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not gpu" tests

lint: install
	$(VENV)/bin/ruff check hetgmp tests bench examples partition datasets
	$(VENV)/bin/ruff format --check hetgmp tests bench examples partition datasets
	# types of hetgmp/ (what and how: [tool.mypy] in pyproject.toml)
	$(VENV)/bin/mypy

clean:
	rm -rf build *.egg-info hetgmp/_native*.so $(VENV)/.native-stamp
