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
