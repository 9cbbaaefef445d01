# Two commands do the whole set-up on a fresh machine with Python 3.11:
#   make demo   lower GPT-2, validate its schedules, train it through remat-ir next to eager
#   make test   run the test suite (what CI runs)
# Both create .venv if missing and install the package with its pinned dependencies.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all soak gpu-check gpu-lease gpu-tests gpu-bench gpu-wheels bench bench-full zoo proto example clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11) and "remat-ir needs Python >= 3.11; set PYTHON=/path/to/python3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/remat-ir inspect examples/mlp.rir
	$(BIN)/remat-ir validate examples/mlp.rir
	mkdir -p build
	$(BIN)/remat-ir convert --torch examples.models:gpt2 -o build/gpt2.rir
	$(BIN)/remat-ir validate build/gpt2.rir
	$(BIN)/python examples/train.py

# test: what CI runs: 51 minutes on two AVX2 cores (2026-12-08, 2,538 tests; 26 on an AVX-512 CPU; the aim
# is near ten: the end of the README says where the time goes). test-all adds the tests marked slow
# (bigger models and more families for what test covers; tests/slow.py says which): run
# it before a change to lowering, solvers or the runtime lands.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist load -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist load

# Search for bugs the suite's fixed samples miss: every property test (random graphs,
# random schedules, random networks trained next to eager) draws SOAK times its examples,
# new ones at every run. A failure prints its example; .hypothesis/ replays it first on
# the next run. SOAK_TESTS: pytest's arguments (e.g. tests/test_differential.py).
SOAK ?= 10
SOAK_TESTS ?= tests
soak: $(STAMP)
	REMAT_SOAK=$(SOAK) $(BIN)/python -m pytest -q -n auto -m hypothesis $(SOAK_TESTS)

# On a machine with a CUDA GPU: gpu-check = gpu-tests + gpu-bench.
# gpu-tests: the tests, whose device-parametrized ones then run on CUDA too (GPU_TESTS:
#   pytest's arguments; by default the CUDA ones alone, 24 tests: over 4 minutes on an
#   H200 with 16 cores, one of them past 3 minutes; GPU_TESTS=tests for the whole suite,
#   25 minutes or more).
# gpu-bench: the time model with offloading measured on the GPU (results under
#   benchmarks/results/time_model/; about 4 minutes) and the quick benchmark there
#   (training_step/; torch.compile's three budgets alone take 3 minutes per model on an
#   H100: GPU_MODELS=gpt2, then cnn, where one call must stay under 10 minutes).
# GPU_PYTHON: a Python whose torch has CUDA and where remat-ir is installed
# (`pip install --no-deps -e .`); by default the venv's, which then needs a CUDA torch.
# gpu-wheels: the wheels a CUDA machine without package registries lacks (Python 3.12,
#   the lent machines' image) into .whl/, for `pip install --no-index --target ...`.
GPU_PYTHON ?= $(BIN)/python
GPU_TESTS ?= -n 8 -k cuda tests
# Each test's start, end and failure text as they happen (tests/conftest.py): what a run
# cut off by a lease's limit still tells.
GPU_TEST_LOG ?= build/gpu-tests.log
GPU_MODELS ?= gpt2,cnn
gpu-check: gpu-tests gpu-bench

gpu-tests: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(STAMP))
	$(GPU_PYTHON) -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else "gpu-check needs a CUDA GPU: torch.cuda.is_available() is False")'
	mkdir -p $(dir $(GPU_TEST_LOG)) && rm -f $(GPU_TEST_LOG)
	REMAT_TEST_PROGRESS=$(abspath $(GPU_TEST_LOG)) $(GPU_PYTHON) -m pytest -q -rfE $(GPU_TESTS)

gpu-bench: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(STAMP))
	$(GPU_PYTHON) benchmarks/time_model.py --device cuda --offload --rounds 20 --time-limit 10 --jobs 8
	$(GPU_PYTHON) benchmarks/training_step.py --mode quick --device cuda --rounds 20 --jobs 8 --models $(GPU_MODELS)

# gpu-lease: a lent machine's checks in priority order within one command's limit (the
#   CUDA tests, the quick GPT-2 with and without offloading, the full-size time model with
#   offloading, torch_overhead, recompute_prices, the quick GPT-2
#   benchmark), each step timed out, logs under GPU_OUT as they go: the command for a lease
#   (benchmarks/gpu_lease.sh says why and what it takes; STEPS=bench for the last alone).
GPU_OUT ?= build/gpu-lease
gpu-lease: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(STAMP))
	OUT=$(GPU_OUT) PY=$(GPU_PYTHON) bash benchmarks/gpu_lease.sh

gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl mip==2.0.0 cffi==2.1.1 pycparser highspy==1.15.1 protobuf==7.36.2 diffusers==0.42.1 importlib_metadata==10.2.0

# Speed and memory figures; each benchmark writes its results under benchmarks/results/.
# bench: eager vs torch.utils.checkpoint vs torch.compile's activation budget vs remat-ir,
# quick subset (about 20 minutes on 2 CPU cores the first time: Inductor compiles).
# bench-full: every model and the solver benchmarks (an hour or more on 2 CPU cores).
bench: $(STAMP)
	$(BIN)/python benchmarks/training_step.py --mode quick

bench-full: $(STAMP)
	$(BIN)/python benchmarks/training_step.py --mode full
	$(BIN)/python benchmarks/torch_overhead.py
	$(BIN)/python benchmarks/checkmate_chains.py
	$(BIN)/python benchmarks/hiremate.py
	$(BIN)/python benchmarks/solvers.py
	$(BIN)/python benchmarks/distributed.py

# Exactness over the model zoo at a sweep of budgets (larger configs than the tests').
zoo: $(STAMP)
	$(BIN)/python benchmarks/zoo.py --readme

# Regenerate ir/remat_ir_pb2.py(.pyi) after editing schemas/remat_ir.proto.
proto: $(STAMP)
	$(BIN)/python schemas/generate.py

# Regenerate the shipped example after changing the IR or its builder.
example: $(STAMP)
	$(BIN)/python -m remat_ir.ir.examples examples/mlp.rir

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
