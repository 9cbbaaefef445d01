"""`checkmate`: the exact MILP of Jain et al. (MLSys 2020), in python-mip.

Stage t computes node t of the fixed order (forward then backward) for the
first time, after recomputing whatever it chooses. Variables: R[t,i] (node i
computed in stage t), S[t,i] (node i's results kept entering stage t),
FREE[t,i,k] (i's results released right after computing k in stage t) and
U (memory after each computation), as in the paper; what this version
adds, to stay small and to match the simulator:

- Only forward nodes that may be recomputed get R variables; backward nodes,
  graph outputs and non-recomputable nodes have constant R and S (a node's
  results are kept exactly while something may still need them), and no
  variable exists for a stage after a node's last possible use.
- Views allocate nothing: keeping a view keeps the node that allocated its
  storage (S[t,view] <= S[t,root]), and the root is not freed while a user
  of the view may still run. Workspace counts while its node runs.
- FREE is continuous: it is bounded above by the conditions for freeing, and
  the memory constraints make the solver raise it wherever allowed.
- The search starts from the fastest heuristic schedule that fits (autograd,
  sqrt, recompute-all, rotor, Fast SA: a warm start), so a time limit always returns
  the best schedule found so far.
- Memory is modelled per node: a node's results are kept or freed together
  (exact when each node returns one tensor, as in Checkmate; cautious for
  nodes whose outputs die at different times, where the simulator may find
  less memory than the model assumed).

`mode="lp"` solves the LP relaxation instead and rounds which forward results
are kept at thresholds 0.1 to 0.9, recomputing the rest on demand
(Checkmate's approximation, for graphs too large for the exact search).
"""

from __future__ import annotations

from collections import defaultdict

import mip

from remat_ir.ir import Graph, compute_sequence, pb

from . import milp
from .base import BadRequest, Deadline, InfeasibleBudget, quiet
from .baselines import recompute_everything, sqrt_schedule
from .sequences import keep_set_schedule, to_schedule
from .structure import TrainingGraph

DEFAULT_TIME_LIMIT_S = 60.0
#: The largest node's bytes (results and workspace) in the MILP's memory unit.
MEMORY_SCALE = 1e3
#: A training step's time (every node once) in the MILP's time unit.
TIME_SCALE = 1e4
ROUNDING_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


class CheckmateModel:
    """The MILP for one graph and budget (budget None: minimise the peak instead)."""

    def __init__(self, tg: TrainingGraph, budget: int | None):
        self.tg = tg
        self.T = len(tg.order)
        self.model = milp.new_model("checkmate")
        self._ranges()
        self._variables()
        self._constraints(budget)

    # ----------------------------------------------------------- structure

    def _ranges(self) -> None:
        tg, pos = self.tg, self.tg.position
        self.users, self.recomputable, self.kept_from, self.need = _ranges(tg)
        # Graph outputs stay live to the end: their bytes are a constant from their stage
        # on; the rest of a node's memory follows its uses.
        # Memory and time are scaled to units keeping the coefficients near 1..1e4:
        # raw bytes (up to 1e11) and seconds (down to 1e-9) defeat the solvers' absolute
        # tolerances (HiGHS called a feasible model infeasible on vgg19 at batch 1024).
        bytes_ = [tg.memory[n] + tg.workspace[n] for n in tg.order]
        self.unit = max(1.0, max(bytes_, default=1) / MEMORY_SCALE)
        self.output_bytes = [tg.output_bytes[n] / self.unit for n in tg.order]
        self.memory = [(tg.memory[n] - tg.output_bytes[n]) / self.unit for n in tg.order]
        self.workspace = [tg.workspace[n] / self.unit for n in tg.order]
        total = sum(tg.time[n] for n in tg.order)
        self.time_unit = total / TIME_SCALE if total > 0 else 1.0
        self.cost = [tg.time[n] / self.time_unit for n in tg.order]
        self.deps = [[pos[p] for p in tg.node_inputs(n)] for n in tg.order]
        self.roots = {pos[v]: sorted(pos[r] for r in rs) for v, rs in tg.view_roots.items()}

    def _variables(self) -> None:
        add = self.model.add_var
        self.R: dict[tuple[int, int], mip.Var] = {}
        self.S: dict[tuple[int, int], mip.Var] = {}
        first_backward = len(self.tg.forward)
        for i in range(self.T):
            for t in range(i + 1, min(self.need[i], self.T - 1) + 1):
                if i in self.recomputable:
                    if t >= first_backward:
                        self.R[t, i] = add(var_type=mip.BINARY, name=f"R_{t}_{i}")
                    self.S[t, i] = add(var_type=mip.BINARY, name=f"S_{t}_{i}")
        self.points: dict[int, list[int]] = defaultdict(list)  # stage -> nodes it may compute
        for t, i in self.R:
            self.points[t].append(i)
        for t in range(self.T):
            self.points[t] = sorted(self.points[t]) + [t]

    def r(self, t: int, i: int):
        """R[t,i]: a variable, or the constant it is."""
        return 1 if i == t else self.R.get((t, i), 0)

    def s(self, t: int, i: int):
        """S[t,i]: a variable, or the constant it is (kept while needed when not recomputable)."""
        if (t, i) in self.S:
            return self.S[t, i]
        if t >= self.T:
            return 1 if i in self.kept_from else 0
        return 1 if i < t <= self.need[i] and i not in self.recomputable else 0

    def _constraints(self, budget: int | None) -> None:
        m, T, add = self.model, self.T, self.model.add_constr
        xsum = mip.xsum
        for (t, i), s_var in self.S.items():
            add(s_var <= self.s(t - 1, i) + self.r(t - 1, i), name=f"keep_{t}_{i}")
            if i in self.kept_from and t > self.kept_from[i]:
                add(s_var >= 1, name=f"output_view_{t}_{i}")
            for r in self.roots.get(i, ()):
                root = self.s(t, r)
                if not isinstance(root, int) or root == 0:
                    add(s_var <= root, name=f"view_{t}_{i}_{r}")
        for t in range(T):
            for k in self.points[t]:
                for i in self.deps[k]:
                    have = self.r(t, i), self.s(t, i)
                    if all(isinstance(x, int) for x in have) and sum(have) >= 1:
                        continue
                    add(self.r(t, k) <= have[0] + have[1], name=f"dep_{t}_{k}_{i}")
        self.peak = m.add_var(name="peak", lb=0.0) if budget is None else None
        limit = self.peak if budget is None else budget / self.unit
        self.free: dict[tuple[int, int, int], mip.Var] = {}
        for t in range(T):
            points = self.points[t]
            kept = xsum(self.memory[i] * self.s(t, i) for i in range(t) if self.memory[i]
                        and not (isinstance(self.s(t, i), int) and self.s(t, i) == 0))
            kept = kept + sum(self.output_bytes[i] for i in range(t))
            previous = None
            for k in points:
                u = m.add_var(name=f"U_{t}_{k}", lb=0.0)
                allocated = (self.memory[k] + self.output_bytes[k]) * self.r(t, k)
                if previous is None:
                    add(u == kept + allocated, name=f"mem_{t}_{k}")
                else:
                    prev_u, freed = previous
                    add(u == prev_u - freed + allocated, name=f"mem_{t}_{k}")
                add(u + self.workspace[k] * self.r(t, k) <= limit, name=f"budget_{t}_{k}")
                previous = (u, self._freed(t, k))

        objective = xsum(self.cost[i] * var for (t, i), var in self.R.items())
        m.objective = mip.minimize(self.peak if budget is None else objective)

    def _freed(self, t: int, k: int):
        """Bytes released right after computing k in stage t (an expression)."""
        terms = []
        for i in [k] + self.deps[k] + [d for d in self._roots_read_through_views(k)]:
            if not self.memory[i] or (t, i, k) in self.free or (
                    i in self.kept_from and t >= self.kept_from[i]):
                continue
            after = self.s(t + 1, i)
            if isinstance(after, int) and after == 1:
                continue
            later = [j for j in self.users[i] if k < j <= t]
            if t in later or i > k:
                continue
            later = [j for j in later if not isinstance(self.r(t, j), int)]
            var = self.model.add_var(name=f"FREE_{t}_{i}_{k}", lb=0.0, ub=1.0)
            self.free[t, i, k] = var
            if not isinstance(self.r(t, k), int):
                self.model.add_constr(var <= self.r(t, k))
            if not isinstance(after, int):
                self.model.add_constr(var <= 1 - after)
            for j in later:
                self.model.add_constr(var <= 1 - self.r(t, j))
            terms.append(self.memory[i] * var)
        return mip.xsum(terms)

    def _roots_read_through_views(self, k: int) -> list[int]:
        """Allocating nodes whose storage k reads through a view (k may be their last user)."""
        return [r for i in self.deps[k] for r in self.roots.get(i, ())]

    # ------------------------------------------------------- to and from sequences

    def start_from(self, sequence: list[int]) -> bool:
        """Warm start from a compute sequence whose first computations follow the stage order."""
        pos = self.tg.position
        stage_of_first: list[int] = []
        R_on: set[tuple[int, int]] = set()
        block: list[int] = []
        seen: set[int] = set()
        for n in sequence:
            i = pos[n]
            if i in seen:
                block.append(i)
                continue
            t = len(stage_of_first)
            if i != t or len(set(block)) != len(block) or any((t, j) not in self.R for j in block):
                return False
            R_on.update((t, j) for j in block)
            stage_of_first.append(i)
            seen.add(i)
            block = []
        if len(stage_of_first) != self.T or block:
            return False
        # S: a result is kept entering stage t if it was computed before and is read in
        # stage t or later before being computed again.
        S_on: set[tuple[int, int]] = set()
        events: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for t in range(self.T):
            for k in sorted(j for (s, j) in R_on if s == t) + [t]:
                for d in self.deps[k]:
                    events[d].append((t, "use"))
                events[k].append((t, "compute"))
        for (t, i) in self.S:
            computed_before = [s for s, e in events[i] if e == "compute" and s < t]
            if not computed_before:
                continue
            nxt = [(s, e) for s, e in events[i] if s >= t]
            for s, e in nxt:
                if e == "compute":
                    break
                if e == "use":
                    S_on.add((t, i))
                    break
        for (t, i) in list(S_on):
            S_on.update((t, r) for r in self.roots.get(i, ()) if (t, r) in self.S)
        self.model.start = ([(v, 1.0 if key in R_on else 0.0) for key, v in self.R.items()]
                            + [(v, 1.0 if key in S_on else 0.0) for key, v in self.S.items()])
        return True

    def sequence(self) -> tuple[list[int], int]:
        """The compute sequence of the solution and how many of its steps are forward."""
        order, F = self.tg.order, len(self.tg.forward)
        sequence, forward_length = [], 0
        for t in range(self.T):
            for k in self.points[t]:
                if k == t or self.R[t, k].x >= 0.5:
                    sequence.append(order[k])
            if t == F - 1:
                forward_length = len(sequence)
        return sequence, forward_length

    def kept_scores(self) -> dict[int, float]:
        """How strongly the (relaxed) solution keeps each forward result into backward."""
        F, scores = len(self.tg.forward), {}
        for (t, i), var in self.S.items():
            if t >= F:
                scores[self.tg.order[i]] = max(scores.get(self.tg.order[i], 0.0), var.x or 0.0)
        return scores


def _ranges(tg: TrainingGraph):
    """Stage positions: each node's users, the recomputable nodes, the allocations a
    graph-output view keeps from its stage on, and need[i], the last stage that may
    read i's results (directly, through a view, or to recompute a user)."""
    pos, T = tg.position, len(tg.order)
    users: dict[int, set[int]] = {n: set(tg.node_users[n]) for n in tg.order}
    for view, roots in tg.view_roots.items():
        for root in roots:
            users[root] |= users[view] | {view}
    users_at = {pos[n]: sorted(pos[u] for u in us) for n, us in users.items()}
    recomputable = {pos[n] for n in tg.recomputable}
    need: dict[int, int] = {}
    for i in reversed(range(T)):
        need[i] = max([i] + [max(u, need[u]) if u in recomputable else u for u in users_at[i]])
    # An allocation a graph-output view holds is kept from that view's stage to the end.
    kept_from = {pos[r]: pos[v] for r, v in tg.kept_by_output_view.items()}
    for r in kept_from:
        need[r] = T - 1
    return users_at, recomputable, kept_from, need


def binaries(tg: TrainingGraph) -> int:
    """How many binary variables (R and S) the exact MILP for `tg` has, without building it:
    a measure of whether it is small enough to solve (bvlc_alexnet's 140 nodes: 6,000)."""
    _, recomputable, _, need = _ranges(tg)
    T, first_backward = len(tg.order), len(tg.forward)
    count = 0
    for i in recomputable:
        last = min(need[i], T - 1)
        count += max(0, last - i) + max(0, last - max(i + 1, first_backward) + 1)
    return count


#: Share of checkmate's remaining time its Fast SA start may take.
FASTSA_SHARE = 0.1


def _baselines(tg: TrainingGraph, budget: int | None, deadline: Deadline | None = None
               ) -> list[pb.Schedule]:
    """Heuristic schedules: warm starts for the search, and fallbacks when it finds nothing.

    With a budget, Fast SA's plan is one of them: the MILP counts the memory of a node
    whose outputs die at different times cautiously, so it may find no schedule where the
    simulator fits one, and the fastest fitting heuristic is returned. Without Fast SA that
    was recompute-all where autograd, sqrt and rotor did not fit: the quick CNN at 50% got
    a plan predicted at 17x the store-everything step (4,079 recomputations) where Fast SA
    finds 1.11x in under a second (`tests/test_solvers.py`)."""
    from remat_ir.ir import store_all

    from .fastsa import fastsa
    from .rotor import rotor
    found = [store_all(tg.graph), sqrt_schedule(tg), recompute_everything(tg)]
    if budget is not None:
        try:
            found.append(rotor(tg.graph, budget))
        except InfeasibleBudget:
            pass
        limit = (deadline.remaining() * FASTSA_SHARE
                 if deadline is not None and deadline.seconds is not None else None)
        try:
            found.append(fastsa(tg.graph, budget, time_limit_s=limit))
        except InfeasibleBudget as refused:
            if refused.schedule is not None:
                found.append(refused.schedule)
    return found


def checkmate(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
              progress=quiet, mode: str = "exact") -> pb.Schedule:
    """Exact MILP (Checkmate) in python-mip; mode='lp' rounds the LP relaxation."""
    if mode not in ("exact", "lp"):
        raise BadRequest(f"checkmate mode must be 'exact' or 'lp', got {mode!r}")
    deadline = Deadline(DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
    tg = TrainingGraph(graph)
    if budget is None:  # nothing to trade: storing everything is fastest
        return _baselines(tg, None)[0]
    if mode == "lp":
        baselines = _baselines(tg, budget, deadline)
        progress(f"checkmate: building the lp model for {len(tg.order)} nodes")
        model = CheckmateModel(tg, budget)
        progress(f"checkmate: {model.model.num_cols} variables, {model.model.num_rows} constraints")
        return _rounded(tg, model, budget, baselines, deadline, progress)
    return solve_exact(tg, budget, deadline, progress)


def solve_exact(tg: TrainingGraph, budget: int, deadline: Deadline, progress=quiet,
                known: list[pb.Schedule] | tuple = ()) -> pb.Schedule:
    """The fastest schedule within `budget` by the exact MILP, warm-started from the fastest
    fitting schedule among the heuristics' and `known` (a caller's own plans). When none
    fits, InfeasibleBudget carries the least-memory schedule found (`.schedule`): the
    min-peak MILP's, started from the lowest-peak schedule known, so never above it."""
    baselines = _baselines(tg, budget, deadline)
    candidates = baselines + list(known)
    fitting = sorted((s for s in candidates if s.predicted_peak_bytes <= budget),
                     key=lambda s: s.predicted_time_s)
    progress(f"checkmate: building the exact model for {len(tg.order)} nodes")
    model = CheckmateModel(tg, budget)
    progress(f"checkmate: {model.model.num_cols} variables, {model.model.num_rows} constraints")
    best_start = fitting[0] if fitting else None
    for start in fitting:  # the fastest that the model can take as a start
        if model.start_from(compute_sequence(start)):
            break
    outcome = milp.optimize(model.model, deadline.remaining(), progress, "checkmate")
    if outcome.status in ("optimal", "feasible"):
        sequence, forward_length = model.sequence()
        status = pb.OPTIMAL if outcome.status == "optimal" else pb.FEASIBLE
        schedule = to_schedule(tg, sequence, forward_length, name="checkmate", status=status)
        if schedule.predicted_peak_bytes <= budget and (
                best_start is None or schedule.predicted_time_s <= best_start.predicted_time_s):
            return schedule
    if best_start is not None:  # the MILP did not improve on the warm start in time
        best = type(best_start)()
        best.CopyFrom(best_start)
        best.status = pb.FEASIBLE
        best.name = "checkmate"
        return best
    frugal = _least_memory(tg, candidates, deadline, progress)
    if outcome.status == "none" and deadline.expired():
        # Out of time with nothing within the budget: refused with the lowest plan known
        # (the heuristics'), so that a caller asking for that floor gets it (the facade
        # remembers it) rather than the MILP running out of time again.
        raise InfeasibleBudget(budget, frugal.predicted_peak_bytes,
                               f" (by checkmate's starts: its MILP found no schedule within the "
                               f"budget in {outcome.seconds:.0f} s; more time (time_limit_s), or "
                               f"mode='lp' on graphs of this size ({len(tg.order)} nodes), may "
                               f"find one)", schedule=frugal)
    if frugal.predicted_peak_bytes <= budget:  # the MILP counts some memory cautiously
        return frugal
    raise InfeasibleBudget(budget, frugal.predicted_peak_bytes, " (by the checkmate MILP)",
                           schedule=frugal)


def _least_memory(tg: TrainingGraph, candidates, deadline: Deadline, progress) -> pb.Schedule:
    """The lowest-peak schedule: the min-peak MILP's, warm-started from the lowest-peak
    candidate, when it finds one in time; the fastest of those that reach the lowest peak."""
    candidates = list(candidates)
    if not deadline.expired():
        model = CheckmateModel(tg, None)
        for start in sorted(candidates, key=lambda s: (s.predicted_peak_bytes, s.predicted_time_s)):
            if model.start_from(compute_sequence(start)):
                break
        outcome = milp.optimize(model.model, deadline.remaining(), progress, "checkmate (min peak)")
        if outcome.status in ("optimal", "feasible"):
            sequence, forward_length = model.sequence()
            candidates.append(to_schedule(tg, sequence, forward_length, name="checkmate",
                                          status=pb.FEASIBLE))
    lowest = min(s.predicted_peak_bytes for s in candidates)
    found = min((s for s in candidates if s.predicted_peak_bytes == lowest),
                key=lambda s: s.predicted_time_s)
    best = type(found)()
    best.CopyFrom(found)
    best.name = "checkmate"
    return best


def _rounded(tg: TrainingGraph, model: CheckmateModel, budget: int, baselines,
             deadline: Deadline, progress) -> pb.Schedule:
    outcome = milp.optimize(model.model, deadline.remaining(), progress, "checkmate LP", relax=True)
    candidates = list(baselines)
    if outcome.status in ("optimal", "feasible"):
        scores = model.kept_scores()
        seen: set[frozenset] = set()
        for threshold in ROUNDING_THRESHOLDS:
            kept = frozenset(n for n, score in scores.items() if score >= threshold)
            if kept not in seen:
                seen.add(kept)
                candidates.append(keep_set_schedule(tg, kept, name="checkmate"))
    fitting = [s for s in candidates if s.predicted_peak_bytes <= budget]
    if not fitting:
        frugal = min(candidates, key=lambda s: s.predicted_peak_bytes)
        raise InfeasibleBudget(budget, frugal.predicted_peak_bytes,
                               " (by LP rounding; mode='exact' may find lower)", schedule=frugal)
    best = min(fitting, key=lambda s: s.predicted_time_s)
    best.name, best.status = "checkmate", pb.HEURISTIC
    return best
