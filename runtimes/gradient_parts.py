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
only once the backward no longer reads the tensor (`codegen.release_points`).

A parameter's gradient that casts back the gradient of autocast's cached cast
(`Node.autocast_cast_back`) is handed over before that cast: the cast back does not run,
and its input (or the parts of its chain) goes to the node standing for the block's
cached cast (`autocast_anchors`), which casts back once, after every call of the block
has handed its parts, as eager's cache does (`Handovers.casts`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from remat_ir.ir import Graph, pb
from remat_ir.ir.errors import RematIRError
from remat_ir.ir.gradient_sums import cast_backs, chain, gradient_chains, moved_sums


class MovedGradientSum(RematIRError):
    """A schedule that offloads or recomputes a running sum of a gradient the runtime hands
    to autograd in parts. Why refused: handed whole instead, that gradient rounds otherwise
    than eager's wherever its tensor also gets gradient from outside the module (a second
    call before one backward, a penalty on the weight: bfloat16 weights 4.9e-4 off), and
    handed in parts the sum lives in autograd's buffer, where no offload can move it."""


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
    #: Resident slot -> IR dtype of autocast's cast whose gradient its parts are: the
    #: runtime hands them to that cast's node, not to the tensor.
    casts: dict[int, int] = field(default_factory=dict)


def handovers(graph: Graph, schedule: pb.Schedule, grads: list[int | None], *,
              casts: bool = True) -> Handovers:
    """The hand-overs for `schedule` (`grads`: per resident slot, its gradient output
    value or None; `casts`: hand cast backs' inputs over too). A chain is handed over in
    parts where nothing else reads its sums and the schedule computes each of them (and
    the cast back) in the backward; otherwise its gradient leaves whole, as computed. A
    schedule that computes one twice or moves its result is refused (`MovedGradientSum`):
    no built-in solver does, and handed whole, the gradient would round otherwise than
    eager's."""
    result = Handovers()
    outputs = set(graph.output_value_ids)
    computed: dict[int, list[int]] = {}
    for k, s in enumerate(schedule.steps):
        if s.HasField("compute"):
            computed.setdefault(s.compute, []).append(k)
    moved = moved_sums(graph, schedule)

    def once(nodes: list[int], values: list[int], gradient: int) -> list[int] | None:
        """Each node's backward step, if each runs there; refused where the schedule
        moves or recomputes its value (`MovedGradientSum`)."""
        where = [computed.get(n, []) for n in nodes]
        if any(not w or w[0] < schedule.backward_start for w in where):
            return None
        for v in values:
            if v in moved:
                raise _moved(graph, schedule, v, gradient)
        return [w[0] for w in where]

    def hand(slot: int, nodes: list[int], parts: list[int], ks: list[int]) -> None:
        result.slots.add(slot)
        result.unmade.update(graph.node(n).outputs[0] for n in nodes)
        for i, k in enumerate(ks):
            result.skipped.add(k)
            arriving = parts[: 2] if i == 0 else [parts[i + 1]]
            result.at.setdefault(k, []).extend((slot, v) for v in arriving)

    chains = gradient_chains(graph)
    backs = cast_backs(graph) if casts else {}
    for slot, gradient in enumerate(grads):
        if gradient in backs:
            back = backs[gradient]
            low = graph.node(back).args[0].tensor
            nodes, parts = chain(graph, low) or ([], [low])
            sums = [graph.node(n).outputs[0] for n in nodes]
            if graph.users(low) != [back] or outputs & {low, *sums}:
                continue
            ks = once(nodes + [back], sums + [gradient], gradient)
            if ks is None:
                continue
            hand(slot, nodes, parts, ks[:-1])
            result.casts[slot] = graph.value(low).dtype
            result.unmade.add(gradient)
            result.skipped.add(ks[-1])
            if not nodes:   # one reader: its gradient is the cast's, at the cast back's step
                result.at.setdefault(ks[-1], []).append((slot, low))
        elif gradient in chains:
            nodes, parts = chains[gradient]
            sums = [graph.node(n).outputs[0] for n in nodes]
            if outputs & set(sums[:-1]):
                continue
            ks = once(nodes, sums, gradient)
            if ks is None:
                continue
            hand(slot, nodes, parts, ks)
    return result


def _moved(graph: Graph, schedule: pb.Schedule, value: int, gradient: int) -> MovedGradientSum:
    name = next((o.name for o in graph.proto.outputs if o.value_id == gradient), f"value {gradient}")
    offloaded = any(s.HasField("offload") and s.offload == value for s in schedule.steps)
    return MovedGradientSum(
        f"schedule {schedule.name!r} ({schedule.solver or 'no solver named'}) "
        f"{'offloads and prefetches' if offloaded else 'recomputes'} value {value} "
        f"({graph.value(value).name or 'unnamed'}), a running sum of the gradient of {name!r}: "
        "the torch runtime hands such sums to autograd, which adds a tensor's gradient "
        "contributions in eager's order, and cannot move or recompute them. Plan again with "
        "a built-in solver (none moves them; offloading by remat-ir before 2026-12-02 could), "
        "or leave the outputs of `remat_ir.ir.gradient_sums.handed_sums(graph)` in place")
