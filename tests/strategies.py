"""Hypothesis strategies for random training graphs, shared by the property tests
of the simulator, the partition and the solvers, and the settings every property
test runs under (`search`)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from remat_ir import ir
from remat_ir.ir import pb

def _soak_factor(raw: str | None) -> int:
    """REMAT_SOAK's value: how many times its examples each property test draws (0: unset)."""
    if not raw:
        return 0
    if not raw.strip().isdigit():
        raise ValueError(f"REMAT_SOAK must be a whole number of times each property test draws its "
                         f"examples (as in `make soak SOAK=10`), not {raw!r}")
    return int(raw)


#: `make soak` (REMAT_SOAK=k): every property test draws k times its examples.
SOAK = _soak_factor(os.environ.get("REMAT_SOAK"))
#: REMAT_NO_SHRINK=1 (`make gpu-lease`): a failing example is reported as found, not
#: shrunk first. On a lent GPU a CUDA property test ran past its call's 225 s and said
#: nothing (2026-11-30): shrinking an example that trains a model can take that long.
NO_SHRINK = os.environ.get("REMAT_NO_SHRINK") == "1"


def search(max_examples: int, *, derandomize: bool = False) -> settings:
    """Settings of a property test: `max_examples` examples, no deadline (a draw may lower
    and train a model). `derandomize`: the same examples at every run, for tests too slow
    to draw more than a handful each (end-to-end training, compiling); the suite then
    checks a fixed sample and cannot fail at random. Under `make soak` (REMAT_SOAK=k)
    every test draws k times as many examples, afresh at each run (never derandomized),
    so that soaking searches cases no CI run has tried; hypothesis prints the failing
    example and keeps it in .hypothesis/ to be replayed first."""
    return settings(max_examples=max_examples * max(1, SOAK), deadline=None,
                    derandomize=derandomize and not SOAK,
                    phases=[phase for phase in Phase if not (NO_SHRINK and phase is Phase.shrink)],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@st.composite
def training_graphs(draw, single_outputs: bool = False, view_odds: int = 5,
                    random_nodes: bool = False, once_nodes: bool = False) -> ir.Graph:
    """A random joint graph: resident inputs, forward nodes, an output gradient, backward nodes.

    `single_outputs`: every node returns one new tensor (no views, no second
    output), the setting in which Checkmate's node-level model is exact. Otherwise one
    output in `view_odds` views one of its node's inputs (2: half of them, so that nodes
    viewing two inputs' allocations are common). `random_nodes`: about one forward node
    in three draws random numbers, half of them numbers that depend on their inputs'
    values (a custom Function's draws), which no schedule may run out of eager's order.
    `once_nodes`: about one forward node in four may run only once per step
    (`non_recomputable`: a SpecAugment mask drawn from NumPy's generator)."""
    g = ir.Graph(name="random")
    forward_pool = []
    for i in range(draw(st.integers(1, 3))):
        v = g.add_value(f"in{i}", "float32", (draw(st.integers(1, 64)),),
                        kind=draw(st.sampled_from(["user_input", "parameter"])))
        g.add_input(v)
        forward_pool.append(v)
    computed = []

    def add_nodes(count, phase, pool, first_reads=None):
        for i in range(count):
            k = draw(st.integers(1, min(3, len(pool))))
            inputs = draw(st.lists(st.sampled_from(pool), min_size=k, max_size=k, unique=True))
            if first_reads is not None and i == 0 and first_reads not in inputs:
                inputs.append(first_reads)
            outputs = []
            for j in range(1 if single_outputs else draw(st.integers(1, 2))):
                base = (draw(st.sampled_from(inputs))
                        if not single_outputs and draw(st.integers(1, view_odds)) == 1 else None)
                if base is not None:  # a view of one of its inputs
                    v = g.add_value(f"{phase[0]}{len(computed)}_{j}", "float32", g.value(base).shape,
                                    alias_of=base)
                else:
                    v = g.add_value(f"{phase[0]}{len(computed)}_{j}", "float32",
                                    (draw(st.integers(1, 256)),))
                outputs.append(v)
            draws = (draw(st.sampled_from(["no", "no", "no", "no", "shape", "values"]))
                     if random_nodes and phase == "forward" else "no")
            once = once_nodes and phase == "forward" and draw(st.integers(1, 4)) == 1
            g.add_node("test.op", inputs, outputs, phase=phase, time_s=draw(st.integers(1, 9)) / 8,
                       workspace_bytes=draw(st.sampled_from([0, 0, 0, 16, 1000])),
                       random=draws != "no", rng_shape_only=draws == "shape", non_recomputable=once)
            pool.extend(outputs)
            computed.extend(outputs)

    add_nodes(draw(st.integers(1, 10)), "forward", forward_pool)
    forward_out = forward_pool[-1]
    g.value(forward_out).kind = pb.OUTPUT
    g.add_output(forward_out, "user_output", "out")
    tangent = g.add_value("tangent", "float32", g.value(forward_out).shape, kind="gradient")
    g.add_input(tangent, gradient_of=forward_out)
    backward_pool = forward_pool + [tangent]
    add_nodes(draw(st.integers(1, 10)), "backward", backward_pool, first_reads=tangent)
    g.add_output(backward_pool[-1], "parameter_gradient", "in0")
    for v in draw(st.lists(st.sampled_from(computed), max_size=2, unique=True)):
        if v not in g.output_value_ids and g.producer(v) is not None \
                and g.node(g.producer(v)).phase == pb.BACKWARD:
            g.add_output(v, "input_gradient", g.value(v).name)
    ir.validate(g)
    return g


@st.composite
def repeated_block_graphs(draw) -> ir.Graph:
    """A random block repeated 2-4 times, as a transformer's layers are: the same
    forward and backward wiring, shapes and parameters in every copy, each copy's
    nodes with times of their own (profiled times differ from block to block), so
    that hiremate reuses one copy's options for the others (`hiremate._mapped`)."""
    width = draw(st.integers(1, 64))
    forward = []        # (local inputs: -1 is the block's input, -2 its parameter, j node j; size)
    for j in range(draw(st.integers(2, 6))):
        pool = [-1, -2] + list(range(j))
        reads = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=min(2, len(pool)), unique=True))
        forward.append((reads, draw(st.integers(1, 256))))
    forward[-1] = ([len(forward) - 2], width)   # the block's output
    backward = []       # (reads: "g" the incoming gradient, j forward node j, ("b", j) backward node j; differentiates)
    for j in range(draw(st.integers(1, 4))):
        pool = ["g"] + list(range(len(forward))) + [("b", i) for i in range(j)]
        reads = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=min(3, len(pool)), unique=True))
        if j == 0 and "g" not in reads:
            reads.append("g")
        backward.append((reads, draw(st.integers(0, len(forward) - 1))))
    g = ir.Graph(name="blocks")
    h = g.add_value("x", "float32", (width,), kind="user_input")
    g.add_input(h)
    blocks = []
    for b in range(draw(st.integers(3, 4))):
        w = g.add_value(f"w{b}", "float32", (width,), kind="parameter")
        g.add_input(w)
        values, nodes = [], []
        for j, (reads, size) in enumerate(forward):
            inputs = [h if r == -1 else w if r == -2 else values[r] for r in reads]
            v = g.add_value(f"f{b}_{j}", "float32", (size,))
            nodes.append(g.add_node("test.op", inputs, [v], phase="forward",
                                    time_s=draw(st.integers(1, 9)) / 8))
            values.append(v)
        blocks.append((h, w, values, nodes))
        h = values[-1]
    g.value(h).kind = pb.OUTPUT
    g.add_output(h, "user_output", "out")
    grad = g.add_value("tangent", "float32", (width,), kind="gradient")
    g.add_input(grad, gradient_of=h)
    for b, (x, w, values, nodes) in reversed(list(enumerate(blocks))):
        made = []
        for j, (reads, of) in enumerate(backward):
            inputs = [grad if r == "g" else made[r[1]] if isinstance(r, tuple) else values[r]
                      for r in reads]
            v = g.add_value(f"b{b}_{j}", "float32", (width,))
            g.add_node("test.op", inputs, [v], phase="backward", forward_node_id=nodes[of],
                       time_s=draw(st.integers(1, 9)) / 8)
            made.append(v)
        g.add_output(made[-1], "parameter_gradient", f"w{b}")
        grad = made[-1]
    ir.validate(g)
    return g
