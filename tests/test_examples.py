"""The shipped example is what the builder makes, and its schedules hold up."""

from pathlib import Path

from remat_ir import ir
from remat_ir.ir.examples import mlp

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mlp.rir"


def test_shipped_example_is_current():
    assert EXAMPLE.read_bytes() == ir.dumps(mlp()), \
        "examples/mlp.rir is stale: run `python -m remat_ir.ir.examples examples/mlp.rir`"


def test_example_schedules():
    g = ir.load(EXAMPLE)
    store, recompute = (ir.check(g, s) for s in g.schedules)
    act = 256 * 128 * 4
    # Backward reads the relu outputs and dropout masks (bool: a quarter) of the 3 hidden
    # layers, the inputs of layers 1-3 (layer 0 reads x, resident), and the loss input.
    assert store.saved_bytes == 3 * act + 3 * (act // 4) + 3 * act + act
    assert recompute.saved_bytes == 0
    assert recompute.recomputations == 14  # every forward node but the loss
    assert recompute.total_time_s > store.total_time_s
    # Dropout is replayed, so the recompute schedule declares it.
    assert g.schedules[1].rng_replay and not g.schedules[0].rng_replay
