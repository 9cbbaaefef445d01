"""Keep-set plans: the forward results to keep so that recomputing the others costs least.

Why: on a layered model the cheapest plan at a budget keeps the same few results in
every layer, those that are expensive to recompute *together with what their
recomputation needs*. The H-ILP chooses among a grid of options per cluster, and its
clusters need not align with layers; the density plans (`baselines.density_schedules`)
rank results by their own time per byte and ignore that recomputing a result needs its
inputs. On the 32-layer Llama at 30% of its peak (FLOP costs) the H-ILP, trimmed and
annealed, reached 15.8% overhead; this program's plan alone 12.9% (12.7% once hiremate
has trimmed and annealed it), where `bounds.py` proves that no schedule is below 12.3%.

The program, over the forward nodes (`keep[n]`, `again[n]` binary):

- a result some backward node reads is kept or recomputed;
- a recomputed node's forward inputs are kept or recomputed;
- a view is kept only with every result it views (they share a storage, counted once);
- a node that may not run twice (mutating, non-recomputable, a graph output) is not
  recomputed;
- the kept bytes are at most a cap; the time of the recomputed nodes is least.

Its plan is `sequences.keep_set_schedule` of the kept nodes: the forward once, then each
backward node recomputes on demand what it reads and was not kept, and a recomputed
result lives until its last backward use. That recomputes only nodes the program
recomputes, so the plan's predicted time is at most store-everything's plus the
program's objective. The peak also holds the recomputed results, the gradients made so
far and workspace, which the cap leaves out: the cap is fitted to the simulator's peak
(`next_cap`), each fit a solve of the same program with another cap.
"""

from __future__ import annotations

import mip

from remat_ir.ir import pb

from . import milp
from .base import Deadline, Progress, quiet
from .sequences import keep_set_schedule
from .structure import TrainingGraph

#: Solves of the program per budget (the first under the budget itself, then the caps
#: `next_cap` proposes); on the benchmark's transformers two or three land within 0.25%
#: of the budget.
REPLANS = 5
#: Plans within 1% of the program's bound are as good as proven here: its times are
#: estimates and its memory a proxy; the Llama's solves take 1-2 s at this gap.
GAP = 1e-2


class KeepSetProgram:
    """The program above for one graph, built once and solved under several caps."""

    def __init__(self, tg: TrainingGraph):
        forward = set(tg.forward)
        model = milp.new_model("keep-set")
        model.max_mip_gap = GAP
        keep = {n: model.add_var(var_type=mip.BINARY) for n in tg.forward}
        again = {n: model.add_var(var_type=mip.BINARY, ub=1 if n in tg.recomputable else 0)
                 for n in tg.forward}
        for n in tg.needed_by_backward:
            model += keep[n] + again[n] >= 1
        for n in tg.forward:
            for p in tg.node_inputs(n):
                if p in forward:
                    model += keep[p] + again[p] >= again[n]
            for root in tg.view_roots.get(n, ()):
                if root in forward:
                    model += keep[n] <= keep[root]
        model.objective = mip.xsum(tg.time[n] * again[n] for n in tg.forward if tg.time[n])
        self.cap = model.add_constr(
            mip.xsum(tg.memory[n] * keep[n] for n in tg.forward if tg.memory[n]) <= 0)
        self.model, self.keep = model, keep

    def solve(self, cap_bytes: int, seconds: float, progress: Progress = quiet) -> list[int] | None:
        """Forward nodes to keep within `cap_bytes` of kept results, or None when the
        search finds no keep set in `seconds` (or proves there is none)."""
        self.cap.rhs = cap_bytes
        outcome = milp.optimize(self.model, seconds, progress, "keep-set program")
        if outcome.status not in ("optimal", "feasible"):
            return None
        return [n for n, var in self.keep.items() if var.x is not None and var.x > 0.5]


def keep_set_plans(tg: TrainingGraph, budget: int, deadline: Deadline,
                   progress: Progress = quiet) -> list[pb.Schedule]:
    """Every plan made while fitting the program's cap to `budget` (within it or not: the
    caller picks the fastest that fits and takes the lowest peak as a floor candidate).
    Stops at the deadline."""
    program = KeepSetProgram(tg)
    made: list[pb.Schedule] = []
    tried: list[tuple[int, int]] = []
    cap: int | None = budget
    while cap is not None and len(made) < REPLANS and not deadline.expired():
        kept = program.solve(cap, deadline.remaining(60.0), progress)
        if kept is None:
            break
        made.append(keep_set_schedule(tg, kept, name="keep-set"))
        tried.append((cap, made[-1].predicted_peak_bytes))
        progress(f"keep-set: at most {cap} bytes kept, plan peaks at {tried[-1][1]} bytes "
                 f"(budget {budget})")
        cap = next_cap(tried, budget, step=max(1, budget // 400))
    return made


def next_cap(tried: list[tuple[int, int]], budget: int, step: int) -> int | None:
    """The next cap to try after the (cap, simulated peak) pairs `tried`, or None when the
    caps that fit and those that do not are within `step` bytes of each other.

    The peak is the cap plus what the cap leaves out (recomputed results live in the
    backward, gradients, workspace), which changes with the keep set: where a smaller
    set leaves more recomputed results live, the peak falls by less than the cap and a
    step of the excess creeps towards the budget. So the step follows the slope of the
    last two pairs (a secant), kept between the largest cap that fit and the smallest
    that did not, and halves that bracket when the secant leaves it (the peak is not
    monotone in the cap)."""
    fits = [c for c, peak in tried if peak <= budget]
    over = [c for c, peak in tried if peak > budget]
    low, high = max(fits, default=None), min(over, default=None)
    if low is not None and high is not None and high - low <= step:
        return None
    cap, peak = tried[-1]
    if 0 <= budget - peak <= step:
        return None          # the last plan fits within a step of the budget
    slope = 1.0
    if len(tried) >= 2:
        (c0, p0), (c1, p1) = tried[-2], tried[-1]
        if c0 != c1 and (p1 - p0) / (c1 - c0) > 0:
            slope = min(4.0, max(0.25, (p1 - p0) / (c1 - c0)))
    proposal = round(cap + (budget - peak) / slope)
    if low is not None and high is not None and not low < proposal < high:
        proposal = (low + high) // 2
    elif high is not None and proposal >= high:
        proposal = high - step
    elif low is not None and proposal <= low:
        return None          # the last plan fits with no slack left to use
    return proposal
