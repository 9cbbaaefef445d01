"""From a solver's decisions to a checked schedule.

Most solvers decide *what to keep* or *in which order to compute*; the frees
then follow (each value is freed after its last use), which is what
`remat_ir.ir.from_compute_sequence` does. This module adds the two steps
every solver needs around it: completing a keep decision into a compute
sequence (recomputing on demand what backward needs and was not kept), and
marking the schedule for RNG replay when a random node runs twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from remat_ir.ir import SimulationResult, pb, simulated_compute_sequence

from .base import Deadline, Progress
from .structure import TrainingGraph


def to_schedule(tg: TrainingGraph, sequence: Sequence[int], forward_length: int, *,
                name: str, status: int = pb.HEURISTIC) -> pb.Schedule:
    """The checked schedule computing `sequence` (frees after last uses)."""
    return simulated_schedule(tg, sequence, forward_length, name=name, status=status)[0]


def simulated_schedule(tg: TrainingGraph, sequence: Sequence[int], forward_length: int, *,
                       name: str, status: int = pb.HEURISTIC) -> tuple[pb.Schedule, SimulationResult]:
    """`to_schedule`, with the simulation that checked it."""
    counts = Counter(sequence)
    replay = any(counts[n] > 1 and tg.graph.node(n).random for n in counts)
    schedule, result = simulated_compute_sequence(tg.graph, sequence, forward_length, name=name,
                                                  solver=name, rng_replay=replay)
    schedule.status = status
    return schedule, result


class OnDemand:
    """Appends nodes to a compute sequence, recomputing first the forward results
    they read that are not available.

    A forward node's results are available when the node is in `kept` (its
    results stay live from the forward pass), cannot be recomputed, or was
    recomputed since the last `forget`.
    """

    def __init__(self, tg: TrainingGraph, kept: Iterable[int], sequence: list[int]):
        self.tg = tg
        self.kept = set(kept) | tg.run_once
        self.fresh: set[int] = set()
        self.sequence = sequence
        self.is_forward = set(tg.forward)

    def available(self, n: int) -> bool:
        return n in self.kept or n in self.fresh

    def forget(self, nodes: Iterable[int]) -> None:
        """Treat these recomputed results as gone: the next reader recomputes them."""
        self.fresh.difference_update(nodes)

    def ensure(self, n: int) -> None:
        """Recompute forward node `n` (and what it needs) unless its results are available."""
        if self.available(n):
            return
        stack = [(n, False)]
        while stack:
            node, expanded = stack.pop()
            if self.available(node):
                continue
            if expanded:
                self.sequence.append(node)
                self.fresh.add(node)
                continue
            stack.append((node, True))
            for p in reversed(self.tg.node_inputs(node)):
                if p in self.is_forward and not self.available(p):
                    stack.append((p, False))

    def run(self, n: int) -> None:
        """Append node `n` after recomputing the forward results it reads."""
        for p in self.tg.node_inputs(n):
            if p in self.is_forward:
                self.ensure(p)
        self.sequence.append(n)


def keep_set_schedule(tg: TrainingGraph, kept: Iterable[int], *, name: str,
                      forget_each_step: bool = False) -> pb.Schedule:
    """Forward once keeping only `kept` nodes' results for backward; backward recomputes
    the rest on demand. A recomputed result lives until its last backward use, or,
    with `forget_each_step`, only until the backward node that needed it has run
    (the least memory, at the price of recomputing for every backward node)."""
    sequence = list(tg.forward)
    builder = OnDemand(tg, kept, sequence)
    for b in tg.backward:
        builder.run(b)
        if forget_each_step:
            builder.forget(list(builder.fresh))
    return to_schedule(tg, sequence, len(tg.forward), name=name)


def fit_to_budget(plan_at: Callable[[int], pb.Schedule | None], budget: int, *, step: int,
                  replans: int, progress: Progress, label: str,
                  deadline: Deadline | None = None) -> pb.Schedule | None:
    """The fastest schedule within `budget` among plans made for memory targets that
    follow what the simulator says of them: a solver whose memory model is
    approximate plans for `budget`, then for the target moved down by a plan's
    excess over the budget or up by the slack of one under it, then bisects
    between a target that fits and one that does not (to within `step` bytes).
    `plan_at(target)` returns None when it finds no plan for that target. Once
    `deadline` has passed, the first plan within the budget ends the search: each plan
    may take a solver's least time (hiremate's top H-ILP, about 0.4 s on the quick
    GPT-2), and six of them made a time limit of 0.5 s take 2.8 s."""
    best: pb.Schedule | None = None
    fits, over = None, None          # targets known to give a plan within / over the budget
    target, peak = budget, budget
    for _ in range(replans):
        if best is not None and deadline is not None and deadline.expired():
            break
        schedule = plan_at(target)
        if schedule is None:
            if fits is None:
                break                    # lower targets are infeasible too
            over = target
        else:
            peak = schedule.predicted_peak_bytes
            if peak <= budget:
                fits = target
                if best is None or schedule.predicted_time_s < best.predicted_time_s:
                    best = schedule
            else:
                over = target
                progress(f"{label}: plan peaks at {peak} bytes, over the budget; re-planning with less")
        if fits is not None and over is not None:
            if over - fits <= max(step, budget // 200):
                break
            target = (fits + over) // 2
        elif fits is not None:
            target = fits + max(step, budget - peak)
        else:
            target -= peak - budget + step
            if target <= 0:
                break
    return best
