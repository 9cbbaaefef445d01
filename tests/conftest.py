"""Fixtures shared by several test modules (test modules never import each other).

The zoo of model factories lives in benchmarks/ (shared with benchmarks/zoo.py).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


@pytest.fixture(scope="module")
def gpt2_graph():
    """GPT-2 with 3 identical blocks (width 32) lowered with FLOP costs: big enough for a
    partition with repeated clusters, cheap to plan. One lowering per module; tests may
    store a hierarchy or schedules in it."""
    from torch_models import gpt2

    from remat_ir.lowering import lower_torch
    model, args, kwargs, _ = gpt2(n_layer=3, n_embd=32, seq=16, batch=2)
    return lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs a worker per core), each worker's torch takes
    its share of the cores, one thread on a 2-core machine: workers each running torch on
    every core would contend. Bitwise checks then also hold at one intra-op thread (the
    U-Net's did not until upsampling was lowered to eager's kernels). Inductor's compile
    workers likewise: with a worker per core, its pool of compile processes only adds
    their start-up (two compiled tests from a cold cache, one core: 115 s with the pool
    of two, 105 s without)."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
        import torch

        torch.set_num_threads(threads)


def _progress(line: str) -> None:
    """Append `line` to the file `REMAT_TEST_PROGRESS` names, at once. Why: on a lent GPU
    machine the whole run has a hard limit; a run killed there prints no summary, and the
    2026-11-30 lease learned which CUDA tests failed but not why, nor which one hung."""
    import os

    path = os.environ.get("REMAT_TEST_PROGRESS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):   # the controller writes, once
        with open(path, "a") as log:
            log.write(line + "\n")


def pytest_runtest_logstart(nodeid, location):
    _progress(f"start {nodeid}")


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _progress(f"{report.outcome} {report.nodeid} ({report.when}, {report.duration:.1f} s)")
        if report.failed:
            _progress(report.longreprtext)


def _global_state() -> dict:
    """torch's process-wide modes a test could leave changed, and the functions remat-ir's
    tracing patches for its duration. Why: `ScheduledModule` runs the model as it is (no
    plan, no checks) under no-grad, inference mode, export or compile tracing, functorch
    transforms and forward-mode AD; a test that leaked one of them made a later test in
    the same worker see eager's behaviour (CI, 2026-12-03: "DID NOT RAISE" on a check
    that passes alone and in file order)."""
    import torch

    return {"grad mode": torch.is_grad_enabled(),
            "inference mode": torch.is_inference_mode_enabled(),
            "exporting": torch.compiler.is_exporting(),
            "compiling": torch.compiler.is_compiling(),
            "forward-mode AD level": torch.autograd.forward_ad._current_level,
            "functorch transforms": torch._C._are_functorch_transforms_active(),
            "default dtype": torch.get_default_dtype(),
            "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
            "CPU autocast": torch.is_autocast_enabled("cpu"),
            "cuDNN enabled": torch.backends.cudnn.enabled,
            "torch.tensor": torch.tensor, "torch.ctc_loss": torch.ctc_loss}


@pytest.fixture(autouse=True)
def _no_leaked_global_state():
    """Fails the test that leaves torch's modes (`_global_state`) otherwise than it found
    them, naming what changed."""
    before = _global_state()
    yield
    after = _global_state()
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    assert not changed, f"the test left torch's global state changed (before, after): {changed}"
