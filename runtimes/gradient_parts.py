"""Gradient contributions handed to autograd one by one, in eager's order.

Where a scheduled module reads a tensor (a parameter, an input) more than once, the
joint graph sums its readers' contributions with adds the frontend marks
`accumulates_gradient`, in the order eager's autograd engine adds them. Eager's engine
adds them into one buffer per tensor, which may already hold contributions from outside
the module (a skip connection around it, a second call of the module before one
backward, a weight tied to a layer outside): ((B + c1) + c2). The graph's own sum,
handed over as one gradient, makes B + (c1 + c2), which rounds otherwise (bfloat16
weights of a module called twice were 1.2e-2 off eager's).

So the runtime runs no such chain of adds that ends in a gradient output. At the step
where the graph would run an add, the backward segment yields the contributions that
add would take (`Handovers.at`), and autograd's buffer adds them in the same order as
eager. Memory is the graph's: the buffer holds the running sum the add would have made,
and the contributions are freed where the schedule frees them. The gradient's own slot
is still handed over (as None) where the plain gradient would leave, so that autograd
finishes the tensor's gradient (hooks, an optimizer step in a post-accumulate hook)
only once the backward no longer reads the tensor (`codegen.release_points`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from remat_ir.ir import Graph, pb
from remat_ir.ir.gradient_sums import gradient_chains


@dataclass
class Handovers:
    """What the backward segment hands over instead of running gradient sums."""
    #: Step index -> [(resident slot, contribution value)] yielded after that step, in order.
    at: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    #: Steps of the adds that do not run (their sums are autograd's).
    skipped: set[int] = field(default_factory=set)
    #: Values never made: the running sums and the gradients they end in. Free steps of
    #: them are skipped.
    unmade: set[int] = field(default_factory=set)
    #: Resident slots whose gradient leaves in parts (their own hand-over yields None).
    slots: set[int] = field(default_factory=set)


def handovers(graph: Graph, schedule: pb.Schedule, grads: list[int | None]) -> Handovers:
    """The hand-overs for `schedule` (`grads`: per resident slot, its gradient output
    value or None). A chain is handed over in parts only where the schedule computes
    each of its sums once in the backward and only frees (never moves) their results,
    and nothing else reads them; otherwise its gradient leaves whole, as computed."""
    result = Handovers()
    outputs = graph.output_value_ids
    steps = schedule.steps
    computed: dict[int, list[int]] = {}
    touched: dict[int, list[str]] = {}
    for k, s in enumerate(steps):
        action = s.WhichOneof("action")
        if action == "compute":
            computed.setdefault(s.compute, []).append(k)
        else:
            touched.setdefault(getattr(s, action), []).append(action)
    chains = gradient_chains(graph)
    for slot, gradient in enumerate(grads):
        if gradient not in chains:
            continue
        nodes, parts = chains[gradient]
        sums = [graph.node(n).outputs[0] for n in nodes]
        where = [computed.get(n, []) for n in nodes]
        if (any(len(w) != 1 or w[0] < schedule.backward_start for w in where)
                or any(a != "free" for v in sums for a in touched.get(v, []))
                or any(v in outputs for v in sums[:-1])):
            continue
        result.slots.add(slot)
        result.unmade.update(sums)
        for i, (k,) in enumerate(where):
            result.skipped.add(k)
            arriving = parts[: 2] if i == 0 else [parts[i + 1]]
            result.at.setdefault(k, []).extend((slot, v) for v in arriving)
    return result
