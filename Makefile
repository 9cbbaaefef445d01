# Two commands do the whole set-up on a fresh machine with Python 3.11:
#   make demo   lower GPT-2, validate its schedules, train it through remat-ir next to eager
#   make test   run the test suite (what CI runs)
# Both create .venv if missing and install the package with its pinned dependencies.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test soak gpu-check bench bench-full zoo proto example clean

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

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# Search for bugs the suite's fixed samples miss: every property test (random graphs,
# random schedules, random networks trained next to eager) draws SOAK times its examples,
# new ones at every run. A failure prints its example; .hypothesis/ replays it first on
# the next run. SOAK_TESTS: pytest's arguments (e.g. tests/test_differential.py).
SOAK ?= 10
SOAK_TESTS ?= tests
soak: $(STAMP)
	REMAT_SOAK=$(SOAK) $(BIN)/python -m pytest -q -n auto -m hypothesis $(SOAK_TESTS)

# On a machine with a CUDA GPU: the test suite, whose device-parametrized tests then run
# on CUDA too (GPU_TESTS: pytest's arguments, e.g. GPU_TESTS='-k cuda tests' for those
# alone), the time model with offloading measured on the GPU (results under
# benchmarks/results/time_model/) and the quick benchmark there (training_step/).
# GPU_PYTHON: a Python whose torch has CUDA and where remat-ir is installed
# (`pip install --no-deps -e .`); by default the venv's, which then needs a CUDA torch.
GPU_PYTHON ?= $(BIN)/python
GPU_TESTS ?= tests
gpu-check: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(STAMP))
	$(GPU_PYTHON) -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else "gpu-check needs a CUDA GPU: torch.cuda.is_available() is False")'
	$(GPU_PYTHON) -m pytest -q $(GPU_TESTS)
	$(GPU_PYTHON) benchmarks/time_model.py --device cuda --offload --rounds 30
	$(GPU_PYTHON) benchmarks/training_step.py --mode quick --device cuda

# Speed and memory figures; each benchmark writes its results under benchmarks/results/.
# bench: eager vs torch.utils.checkpoint vs torch.compile's activation budget vs remat-ir,
# quick subset (about 10 minutes on 2 CPU cores). bench-full: every model and the solver
# benchmarks (an hour or more on 2 CPU cores).
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
