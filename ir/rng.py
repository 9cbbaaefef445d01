"""Random nodes under any schedule: which run draws, which replays, which is skipped.

Eager execution draws from the generator once per random node, in graph order
(forward nodes in file order, then backward nodes). A schedule may run random
nodes in another order (a solver moved an independent dropout earlier), run
one again (a recomputation), or run one first in the backward segment. For
every run to see eager's numbers, and for the generator to end the step where
eager leaves it, the runtime follows one cursor over graph order:

- The first run of the node under the cursor (or past it) *draws*: the nodes
  before it that have not drawn yet are first *skipped* (the state is saved,
  then the generator is advanced by running the op on placeholder inputs,
  and the result thrown away), so that it draws from eager's state.
- Any later run, and any run of a skipped node, *replays* from the state
  saved for the node, and leaves the generator where it was.
- At the end of the forward segment every forward random node that has not
  drawn is skipped (so code between forward and backward sees eager's
  generator), and at the end of the step every backward one.

Skipping needs `Node.rng_shape_only`: the numbers drawn must depend on shapes,
not values. The simulator refuses a schedule that would skip another random
node (violation `random_order`). The simulator counts a skip's memory (placeholders for
inputs not live at that point, its outputs, its workspace) and time, so that
a plan that reorders random nodes is priced and checked like any other.

This module is the one definition of these rules; the simulator and every
runtime read them from `plan_rng`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import remat_ir_pb2 as pb
from .dtypes import ITEMSIZE
from .graph import Graph
from .memory import allocated_bytes


#: Random ops whose draws from the generator depend only on shapes, dtypes, strides and
#: non-tensor arguments (by the op's name without namespace and overload), which the torch
#: frontend marks `Node.rng_shape_only`: the runtime may advance the generator past them
#: with a run on placeholder inputs. Checked op by op in tests/test_rng.py, and the mark
#: on any other op refused (`runtimes/op_checks.check_claims`: a file marking poisson so
#: trained on other numbers than eager's, found by a review). Left out: multinomial,
#: poisson, _standard_gamma, rrelu_with_noise (draws depend on values).
SHAPE_ONLY_RANDOM_OPS = frozenset({
    "native_dropout", "_fused_dropout", "bernoulli", "rand", "rand_like", "randn",
    "randn_like", "randint", "randint_like", "randperm", "normal", "uniform", "exponential",
    "cauchy", "log_normal", "geometric", "draw_in_layout", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
    "_efficient_attention_forward",
})


@dataclass
class RngPlan:
    """What each run of a random node does with the generator.

    `skips[k]`: random nodes to skip right before step `k` runs, in its
    segment; `forward_end` and `step_end`: those to skip at the end of the
    forward segment and after the last step. Each comes with the value ids
    of its inputs that are not available there (placeholders stand in).
    `replays`: step indices whose compute replays a saved state.
    `saved`: nodes whose state is saved (before their drawing run, or at
    their skip), because a replay needs it.
    """
    order: list[int] = field(default_factory=list)
    skips: dict[int, list[tuple[int, tuple[int, ...]]]] = field(default_factory=dict)
    forward_end: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    step_end: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    replays: set[int] = field(default_factory=set)
    saved: set[int] = field(default_factory=set)


def graph_order(graph: Graph) -> list[int]:
    """Random nodes in the order eager execution runs them (cached with the structure:
    the simulator asks at every simulation)."""
    known = graph.derived.get("random_order")
    if known is None:
        nodes = graph.proto.nodes
        known = graph.derived["random_order"] = (
            [n.id for n in nodes if n.random and n.phase != pb.BACKWARD]
            + [n.id for n in nodes if n.random and n.phase == pb.BACKWARD])
    return list(known)


def placeholder_bytes(value: pb.Value) -> int:
    """Bytes a placeholder with the value's shape and strides allocates."""
    if any(d == 0 for d in value.shape):
        return 0
    strides = list(value.stride) or contiguous_strides(list(value.shape))
    extent = 1 + sum((d - 1) * s for d, s in zip(value.shape, strides))
    return extent * ITEMSIZE[value.dtype]


def contiguous_strides(shape) -> list[int]:
    """The strides of a contiguous (row-major) tensor of `shape`, in elements."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return strides[::-1]


def plan_rng(graph: Graph, schedule: pb.Schedule) -> RngPlan:
    """The `RngPlan` of `schedule` (see the module docstring); steps that are not valid
    otherwise are left for the simulator to report."""
    order = graph_order(graph)
    plan = RngPlan(order=order)
    if not order:
        return plan
    position = {n: i for i, n in enumerate(order)}
    forward_count = sum(1 for n in order if graph.node(n).phase != pb.BACKWARD)
    steps = schedule.steps
    bs = schedule.backward_start
    resident = graph.resident_value_ids
    live: set[int] = set()
    drawn: set[int] = set()
    cursor = 0
    later_runs: dict[int, int] = {}  # node -> runs still to come
    for s in steps:
        if s.HasField("compute") and s.compute in position:
            later_runs[s.compute] = later_runs.get(s.compute, 0) + 1

    def skip_up_to(k: int, end: int, available: set[int], into: list) -> None:
        nonlocal cursor
        for n in order[cursor:end]:
            if n in drawn:
                continue
            node = graph.node(n)
            missing = tuple(v for v in node.inputs if v not in resident and v not in available)
            into.append((n, missing))
            drawn.add(n)
            if later_runs.get(n):
                plan.saved.add(n)
        cursor = max(cursor, end)

    for k, s in enumerate(steps):
        if k == bs:
            skip_up_to(k, forward_count, live, plan.forward_end)
            live = set()  # the backward segment sees only what it is handed: placeholders
        action = s.WhichOneof("action")
        if action == "compute":
            n = s.compute
            if n in position:
                later_runs[n] -= 1
                if n in drawn:
                    plan.replays.add(k)
                else:
                    skip_up_to(k, position[n], live if k < bs else set(), plan.skips.setdefault(k, []))
                    drawn.add(n)
                    cursor = max(cursor, position[n] + 1)
                    if later_runs[n]:
                        plan.saved.add(n)
            if k < bs and n in graph.nodes:
                live.update(graph.node(n).outputs)
        elif k < bs and action == "free":
            live.discard(s.free)
        elif k < bs and action == "prefetch":
            live.add(s.prefetch)
    if bs >= len(steps):
        skip_up_to(len(steps), forward_count, live, plan.forward_end)
    skip_up_to(len(steps), len(order), set(), plan.step_end)
    plan.skips = {k: v for k, v in plan.skips.items() if v}
    return plan


def skip_bytes(graph: Graph, node_id: int, missing: tuple[int, ...]) -> int:
    """Memory a skip of the node allocates while it runs: placeholders for `missing`
    inputs, the storages of outputs that are not views of an input, workspace."""
    node = graph.node(node_id)
    return (sum(placeholder_bytes(graph.value(v)) for v in missing)
            + allocated_bytes(graph, node) + node.cost.workspace_bytes)
