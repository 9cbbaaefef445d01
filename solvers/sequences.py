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
from collections.abc import Callable, Iterable, Mapping, Sequence

from remat_ir.ir import SimulationResult, pb, simulated_compute_sequence

from .base import Progress
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
        self.kept = set(kept) | (set(tg.forward) - tg.recomputable)
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


def walk_memory(tg: TrainingGraph, live: set[int], sequence: list[int],
                keep: Iterable[int] | Mapping[int, int], counted_apart: frozenset[int],
                saved: Mapping[int, int] | None = None) -> tuple[int, int]:
    """Peak and final bytes running `sequence` from `live`, freeing results after their
    last use in the sequence unless in `keep` (a local, approximate simulation).
    A view keeps its allocation root alive. Results in `counted_apart` cost nothing
    here (they are held all along).

    The simulator frees per storage, so a node can outlive its last use in part:
    `keep` may map results to the bytes of them that stay (a gradient's node also
    returning a parameter gradient), and `saved` maps results kept for a backward
    to the bytes of them it reads (`tg.bytes_read`), which stay from the start if
    they are live, after their last use in the sequence otherwise."""
    def root(n: int) -> int:
        return tg.view_root.get(n, n)

    def size(n: int) -> int:
        return 0 if n in counted_apart else tg.memory[n]

    saved = {root(n): b for n, b in (saved or {}).items()}
    partly = dict(saved)
    if isinstance(keep, Mapping):
        partly.update((root(n), b) for n, b in keep.items())
        keep = set()
    keep = {root(n) for n in keep}
    last: dict[int, int] = {}
    for i, n in enumerate(sequence):
        for p in tg.node_inputs(n):
            last[root(p)] = i
    holding = {r: min(size(r), saved.get(r, size(r))) for r in map(root, live)}
    current = sum(holding.values())
    peak = current
    for i, n in enumerate(sequence):
        peak = max(peak, current + size(n) + tg.workspace[n])
        if root(n) not in holding:
            holding[root(n)] = size(root(n))
            current += holding[root(n)]
        for p in {root(p) for p in tg.node_inputs(n)} | {root(n)}:
            if p in holding and last.get(p, -1) <= i and p not in keep:
                left = min(holding[p], partly.get(p, 0))
                current -= holding[p] - left
                if left:
                    holding[p] = left
                else:
                    del holding[p]
    return peak, current


def fit_to_budget(plan_at: Callable[[int], pb.Schedule | None], budget: int, *, step: int,
                  replans: int, progress: Progress, label: str) -> pb.Schedule | None:
    """The fastest schedule within `budget` among plans made for memory targets that
    follow what the simulator says of them: a solver whose memory model is
    approximate plans for `budget`, then for the target moved down by a plan's
    excess over the budget or up by the slack of one under it, then bisects
    between a target that fits and one that does not (to within `step` bytes).
    `plan_at(target)` returns None when it finds no plan for that target."""
    best: pb.Schedule | None = None
    fits, over = None, None          # targets known to give a plan within / over the budget
    target, peak = budget, budget
    for _ in range(replans):
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
