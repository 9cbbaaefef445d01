"""The memory model (`remat_ir.ir.memory`) is the one place the rules of memory
live: its sub-sequence measure agrees with the simulator step for step, its
node-level model accounts for every allocated byte, and no other module
derives "does this node allocate?" again."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from strategies import search, training_graphs

from remat_ir import ir
from remat_ir.ir import memory, pb
from remat_ir.solvers.sequences import keep_set_schedule
from remat_ir.solvers.structure import TrainingGraph

SETTINGS = search(60)
ROOT = Path(__file__).resolve().parents[1]


def _compute_positions(schedule: pb.Schedule) -> list[int]:
    return [k for k, s in enumerate(schedule.steps) if s.HasField("compute")]


@SETTINGS
@given(training_graphs())
def test_the_whole_step_measured_as_a_sequence_is_the_simulators_peak(g):
    schedule = ir.recompute_all(g) if g.node(0).random else ir.store_all(g)
    result = ir.simulate(g, schedule)
    sequence = [s.compute for s in schedule.steps if s.HasField("compute")]
    peak, final = memory.measure_sequence(g, sequence)
    assert (peak, final) == (result.peak_bytes, result.memory_after[-1])


@SETTINGS
@given(training_graphs())
def test_the_backward_measured_from_the_live_values_matches_the_simulator(g):
    """Sub-sequence mode: starting from what is live when backward starts, the
    backward's peak is the simulator's peak over the backward steps."""
    schedule = ir.recompute_all(g)
    result = ir.simulate(g, schedule)
    bs = schedule.backward_start
    live = set(result.saved_value_ids) | {o.value_id for o in g.proto.outputs
                                          if o.role == pb.USER_OUTPUT}
    backward = [s.compute for s in schedule.steps[bs:] if s.HasField("compute")]
    peak, final = memory.measure_sequence(g, backward, live=live)
    during = [result.memory_during[k] for k in _compute_positions(schedule) if k >= bs]
    assert peak == max([result.memory_after[bs - 1] if bs else 0, *during])
    assert final == result.memory_after[-1]


@SETTINGS
@given(training_graphs())
def test_the_node_level_model_accounts_for_every_allocated_byte(g):
    tg = TrainingGraph(g)
    allocated = sum(memory.allocated_bytes(g, g.node(n)) for n in tg.order)
    workspace = sum(g.node(n).cost.workspace_bytes for n in tg.order)
    assert sum(tg.memory.values()) + sum(tg.workspace.values()) - workspace == allocated
    for n in tg.order:
        assert memory.is_view(g, g.node(n)) == (memory.allocated_bytes(g, g.node(n)) == 0)
        if n in tg.view_root:
            assert memory.is_view(g, g.node(n)) or len(g.node(n).outputs) > 1


@SETTINGS
@given(training_graphs(single_outputs=True), st.data())
def test_the_node_level_walk_matches_the_simulator_through_recomputations(g, data):
    """Where a node is one allocation (one output, no view) the node-level walk is exact,
    also for sequences that recompute a node several times: each computation starts a new
    life of its result (the walk held the first life until the last use of any)."""
    tg = TrainingGraph(g)
    kept = data.draw(st.sets(st.sampled_from(tg.forward)))
    schedule = keep_set_schedule(tg, kept, name="random", forget_each_step=data.draw(st.booleans()))
    sequence = [s.compute for s in schedule.steps if s.HasField("compute")]
    peak, final = tg.walk(set(), sequence, tg.output_nodes, frozenset())
    result = ir.simulate(g, schedule)
    assert (peak, final) == (result.peak_bytes, result.memory_after[-1])


def test_no_module_but_the_memory_model_decides_what_a_node_allocates():
    """The derivation is a comparison of a node's output storages with its input
    storages; it is written once, in ir/memory.py."""
    derivation = re.compile(r"storage_id\s+for\s+\w+\s+in\s+[\w.()]*\.inputs")
    found = []
    for folder in ("ir", "frontends", "solvers", "runtimes", "remat_ir"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "ir" / "memory.py" or path.name.endswith("_pb2.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if derivation.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "derive it from remat_ir.ir.memory instead:\n" + "\n".join(found)
