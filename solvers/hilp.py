"""HiRemate's H-ILP: one level of the partition tree as a small Checkmate-style MILP
whose nodes are the level's parts (original nodes and child clusters), each
choosing one of its options.

Stages: one forward stage per part that has forward nodes (in topological
order), then one backward stage per part that has backward nodes (in an order
respecting the backward dependencies, graph order otherwise). Variables:

- `X[k,o]`: part k's backward runs option o's backward, which reads o's saved
  results: kept from the forward stage (which then runs o's forward), or
- `Z[k,o,t]`: made by running k's forward again in backward stage t (k's own,
  or an earlier one that reads its outputs), the first forward keeping only
  its outputs. This is what checkpointing a block does, and it lets a part
  recomputed for a later part's backward serve its own backward too.
- `S[t,p]`: part p's outputs held entering stage t.
- `R[t,p]`: part p's outputs recomputed (only what produces them) in backward
  stage t, before that stage's backward.

Constraints: a forward stage has its inputs held; a recomputation or rerun has
its inputs there before it in the same stage; a backward stage has what its
option reads; outputs are held only if held or computed the stage before.
Memory at each stage: held outputs + saved results of the parts between where
they were made and their backward + gradients alive at that point (a constant:
the backward order is fixed) + what the stage runs: the forward's peak, or the
recomputed and rerun parts' results plus the option's backward peak, in which
the gradients and outputs read for the last time count until freed.
Recomputed outputs count together for the whole stage (cautious). The
objective is the time of the chosen options, recomputations and reruns.

Outputs read outside the level ("exported") stay to the end of the level's
forward and are the parent's to hold during the level's backward. Graph
outputs stay live to the end and count as constants.

The model is an approximation of the simulator (a part's memory is measured
by walking its sequences); callers check the assembled schedule in the
simulator and move the memory limit by the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import mip
import networkx as nx

from . import milp
from .base import Deadline, SolverError, quiet
from .options import PartOption, PartShape
from .structure import TrainingGraph

#: The largest memory coefficient of a level's model (or its limit) in the MILP's unit.
MEMORY_SCALE = 1e4
#: The level's time (every part's slowest option once) in the MILP's time unit.
TIME_SCALE = 1e4


@dataclass
class Part:
    """A node or a child cluster of a level, with its options."""
    shape: PartShape
    options: list[PartOption]
    out_bytes: int = 0          # bytes of its outputs (graph outputs excepted)
    pinned_bytes: int = 0       # bytes of graph outputs it computes (live to the end)
    recompute: tuple[int, ...] = ()   # the forward nodes producing its outputs
    recompute_time: float = 0.0
    recompute_peak: int = 0
    can_recompute: bool = False
    #: Its whole forward may run again in the backward (a cluster of recomputable nodes).
    can_rerun: bool = False
    #: Peak of its forward when it keeps nothing for the backward (only its outputs).
    plain_forward_peak: int = 0

    @classmethod
    def of(cls, tg: TrainingGraph, shape: PartShape, options: list[PartOption]) -> Part:
        root = shape.root
        pinned = shape.outputs & tg.held_outputs
        roots = {root(n) for n in shape.outputs - pinned if root(n) in shape.own}
        # A recomputable graph-output producer (BatchNorm) holds only its graph outputs
        # (the running statistics) to the end; its other results come and go like any.
        part = cls(shape, options, sum(tg.memory[r] for r in roots),
                   sum(tg.memory[n] for n in pinned)
                   + sum(tg.output_bytes[n] for n in shape.own & tg.output_nodes if n not in pinned))
        needed, stack = set(), list(shape.outputs - pinned)
        while stack:
            n = stack.pop()
            if n in needed:
                continue
            needed.add(n)
            stack.extend(p for p in tg.node_inputs(n) if p in shape.own)
        part.recompute = tuple(n for n in shape.forward if n in needed)
        part.recompute_time = sum(tg.time[n] for n in part.recompute)
        part.can_recompute = bool(part.recompute) and all(n in tg.recomputable for n in part.recompute)
        if part.can_recompute:
            part.recompute_peak = tg.walk(set(), list(part.recompute), set(shape.outputs),
                                      shape.outside)[0]
        part.can_rerun = (len(shape.forward) > 1 and bool(shape.backward)
                          and all(n in tg.recomputable for n in shape.forward))
        part.plain_forward_peak = tg.walk(set(), list(shape.forward), set(shape.outputs),
                                      shape.outside)[0]
        return part


class Level:
    """The parts of one cluster, their stage order and the constant memory per stage."""

    def __init__(self, tg: TrainingGraph, parts: list[Part], exported: frozenset[int] = frozenset()):
        self.tg, self.parts = tg, parts
        self.part_of = {n: k for k, p in enumerate(parts) for n in p.shape.forward}
        backward_of = {b: k for k, p in enumerate(parts) for b in p.shape.backward}
        #: Parts whose outputs are read outside the level.
        self.exported = {self.part_of[n] for n in exported}
        self.forward_order = self._order(
            [k for k, p in enumerate(parts) if p.shape.forward],
            lambda k: {self.part_of[i] for n in parts[k].shape.forward
                       for i in tg.node_inputs(n) if i in self.part_of} - {k},
            lambda k: tg.position[parts[k].shape.forward[0]])
        self.backward_order = self._order(
            [k for k, p in enumerate(parts) if p.shape.backward],
            lambda k: {backward_of[i] for b in parts[k].shape.backward
                       for i in tg.node_inputs(b) if i in backward_of} - {k},
            lambda k: min(tg.position[b] for b in parts[k].shape.backward))
        self.stages = ([("forward", k) for k in self.forward_order]
                       + [("backward", k) for k in self.backward_order])
        self.first_backward = len(self.forward_order)
        #: Stage index of each part's forward and of its backward.
        self.forward_stage = {k: t for t, (kind, k) in enumerate(self.stages) if kind == "forward"}
        self.backward_stage = {k: t for t, (kind, k) in enumerate(self.stages) if kind == "backward"}
        self.reads = [[{self.part_of[n] for n in o.reads if n in self.part_of} for o in p.options]
                      for p in parts]
        #: Parts whose forward may run again in a backward stage for their own backward.
        self.rerun = {k for k, p in enumerate(parts) if p.can_rerun and k not in self.exported}
        self.base = self._constant_memory(backward_of)
        self.need = self._need()
        self.backward_peaks = self._backward_peaks()
        #: Where a part's forward may run again: its own backward stage, or an earlier
        #: one whose backward reads its outputs (it then serves both).
        self.rerun_stages = {k: sorted({self.backward_stage[k]} | {
            self.backward_stage[q] for q in self.backward_stage if self.first_backward <= self.backward_stage[q] < self.backward_stage[k]
            and any(k in r for r in self.reads[q])}) for k in self.rerun}

    @staticmethod
    def _order(items: list[int], depends_on, key) -> list[int]:
        graph = nx.DiGraph()
        graph.add_nodes_from(items)
        graph.add_edges_from((d, k) for k in items for d in depends_on(k))
        try:
            return list(nx.lexicographical_topological_sort(graph, key=key))
        except nx.NetworkXUnfeasible:
            raise SolverError("hiremate: the parts of a level depend on each other both ways; "
                              "the partition is not convex (please report this graph)") from None

    def _constant_memory(self, backward_of: dict[int, int]) -> list[int]:
        """Per stage: graph outputs already computed, and gradients produced by earlier
        backward stages that a later stage (or something outside the level) still reads.

        Node-level (`NodeMemory`): a gradient's bytes are its root's `memory`, the
        graph-output part of them (`output_bytes`) held to the end and the rest
        until the stage of its last reader, where the simulator frees per value."""
        tg, T = self.tg, len(self.stages)
        base = [0] * T
        for k, p in enumerate(self.parts):
            if p.pinned_bytes and k in self.forward_stage:
                for t in range(self.forward_stage[k] + 1, T):
                    base[t] += p.pinned_bytes
        root = tg.root
        last: dict[int, int] = {}
        for b, k in backward_of.items():
            r = root(b)
            if r not in backward_of:
                continue
            if any(u not in backward_of for u in tg.node_users[b]):
                last[r] = T
            for u in tg.node_users[b]:
                if u in backward_of:
                    last[r] = max(last.get(r, -1), self.backward_stage[backward_of[u]])
        #: Gradients whose last reader in the level is a backward stage, by stage.
        self.consumed: dict[int, set[int]] = {}
        for r, t in last.items():
            if t < T and tg.output_bytes[r] == 0:
                self.consumed.setdefault(t, set()).add(r)
        for r, k in backward_of.items():
            # Parameter gradients (graph outputs) stay to the end; the node's other
            # results (the gradient passed on) until their last reader's stage.
            until = [(T - 1, tg.output_bytes[r]),
                     (min(last.get(r, -1), T - 1), tg.memory[r] - tg.output_bytes[r])]
            for end, nbytes in until:
                for t in range(self.backward_stage[k] + 1, end + 1):
                    base[t] += nbytes
        return base

    def _backward_peaks(self) -> dict[int, list[int]]:
        """Per backward part, each option's backward peak beyond its saved results,
        given what the stage frees as it goes: the gradients it reads for the last
        time and the outputs (its own or others') nothing later needs. These are in
        the stage's held bytes, so they count until freed rather than all along."""
        tg, peaks = self.tg, {}
        last_needed: dict[int, set[int]] = {}
        for p, t in self.need.items():
            if p not in self.exported and t >= self.first_backward:
                shape = self.parts[p].shape
                last_needed.setdefault(t, set()).update(
                    shape.root(n) for n in shape.outputs - tg.held_outputs
                    if shape.root(n) in shape.own)
        for k in self.backward_stage:
            part = self.parts[k]
            dying = self.consumed.get(self.backward_stage[k], set()) | last_needed.get(self.backward_stage[k], set())
            peaks[k] = [max(0, part.shape.backward_peak(o.backward, dict(o.saved_roots),
                                                        frozenset(dying)) - o.saved)
                        if dying else o.backward_peak for o in part.options]
        return peaks

    def _need(self) -> dict[int, int]:
        """The last stage at which each part's outputs may be read (directly, or to
        recompute a part that reads them)."""
        tg, need = self.tg, {}
        readers: dict[int, set[int]] = {k: set() for k in range(len(self.parts))}
        for k, p in enumerate(self.parts):
            for n in p.shape.forward:
                for i in tg.node_inputs(n):
                    if i in self.part_of and self.part_of[i] != k:
                        readers[self.part_of[i]].add(k)
        for k in reversed(self.forward_order):
            stages = [self.forward_stage[q] for q in readers[k]]
            stages += [self.backward_stage[q] for q in range(len(self.parts)) if q in self.backward_stage
                       and any(k in r for r in self.reads[q])]
            stages += [need[q] for q in readers[k] if self.parts[q].can_recompute and q in need]
            stages += [self.backward_stage[q] for q in readers[k] if q in self.rerun]
            if k in self.exported:
                stages.append(self.first_backward - 1)
            need[k] = max(stages, default=self.forward_stage[k])
        return need


class LevelModel:
    """The H-ILP of one level under a peak limit (and optionally a limit on the bytes
    held when the backward starts, for a cluster's options)."""

    def __init__(self, level: Level, peak: int | None, saved: int | None = None,
                 least_memory: bool = False):
        self.level = level
        self.model = milp.new_model("h-ilp")
        m, L = self.model, level
        # Memory and time are scaled to units keeping the coefficients near 1..1e4, as in
        # `CheckmateModel`: raw bytes (up to 1e10) and seconds defeat the solvers'
        # absolute tolerances and slow CBC down.
        sizes = [peak or 0, saved or 0, max(L.base, default=0)]
        for k, p in enumerate(L.parts):
            sizes += [p.out_bytes, p.recompute_peak, p.plain_forward_peak]
            sizes += [max(o.saved, o.forward_peak) for o in p.options]
            sizes += L.backward_peaks.get(k, [])
        self.unit = max(1.0, max(sizes) / MEMORY_SCALE)
        total = sum(max(o.time for o in p.options) for p in L.parts if p.options)
        self.time_unit = total / TIME_SCALE if total > 0 else 1.0
        self.X: dict[tuple[int, int], mip.Var] = {}
        for k, p in enumerate(L.parts):
            if len(p.options) > 1:
                xs = [m.add_var(var_type=mip.BINARY) for _ in p.options]
                self.X.update(((k, o), x) for o, x in enumerate(xs))
                m.add_constr(mip.xsum(xs) == 1)
        self.S: dict[tuple[int, int], mip.Var] = {}
        self.R: dict[tuple[int, int], mip.Var] = {}
        for k in L.forward_order:
            last = L.need[k] if k not in L.exported else min(L.need[k], L.first_backward - 1)
            for t in range(L.forward_stage[k] + 1, last + 1):
                self.S[t, k] = m.add_var(var_type=mip.BINARY)
            if L.parts[k].can_recompute and k not in L.exported:
                for t in range(L.first_backward, L.need[k] + 1):
                    self.R[t, k] = m.add_var(var_type=mip.BINARY)
        #: Z[k,o,t]: part k's forward runs again in backward stage t for its backward
        #: (option o), which then keeps o's saved results from t instead of from the forward.
        self.Z: dict[tuple[int, int, int], mip.Var] = {}
        for k in sorted(L.rerun):
            for o in range(len(L.parts[k].options)):
                zs = [m.add_var(var_type=mip.BINARY) for _ in L.rerun_stages[k]]
                self.Z.update(((k, o, t), z) for t, z in zip(L.rerun_stages[k], zs))
                self._require(mip.xsum(zs), self.x(k, o))
        self._dependencies()
        if least_memory:
            self.peak = m.add_var(lb=0.0)
            m.objective = mip.minimize(self.peak)
        else:
            self.peak = None if peak is None else peak / self.unit
            m.objective = mip.minimize(
                mip.xsum(L.parts[k].options[o].time / self.time_unit * x
                         for (k, o), x in self.X.items())
                + mip.xsum(L.parts[k].recompute_time / self.time_unit * r
                           for (t, k), r in self.R.items())
                + mip.xsum(L.parts[k].options[o].forward_time / self.time_unit * z
                           for (k, o, t), z in self.Z.items()))
        if self.peak is not None:
            self._memory()
        if saved is not None and L.backward_order:
            t = L.first_backward
            m.add_constr(self.held(t) - L.base[t] / self.unit <= saved / self.unit)

    # ------------------------------------------------------------ helpers

    def x(self, k: int, o: int):
        return self.X.get((k, o), 1)

    def s(self, t: int, k: int):
        """Outputs of k held entering stage t: a variable, or the constant it is."""
        L = self.level
        if (t, k) in self.S:
            return self.S[t, k]
        return 1 if k in L.exported and t >= L.first_backward else 0

    def reruns(self, k: int, stages, option: int | None = None) -> list:
        """The Z variables of part k's forward running again in one of `stages`
        (for `option`, or for any)."""
        options = range(len(self.level.parts[k].options)) if option is None else [option]
        return [z for t in stages for o in options if (z := self.Z.get((k, o, t))) is not None]

    def have(self, t: int, k: int):
        """k's outputs are there in stage t (held, or recomputed or rerun earlier in it)."""
        return self.s(t, k) + self.R.get((t, k), 0) + mip.xsum(self.reruns(k, [t]))

    def _dependencies(self) -> None:
        m, L = self.model, self.level
        add = m.add_constr
        for (t, k), var in self.S.items():
            if t > L.forward_stage[k] + 1:
                add(var <= self.have(t - 1, k))
        for t, (kind, k) in enumerate(L.stages):
            if kind == "forward":
                for n in L.parts[k].shape.forward:
                    for i in L.tg.node_inputs(n):
                        p = L.part_of.get(i)
                        if p is not None and p != k:
                            self._require(1, self.s(t, p))
            else:
                for o, reads in enumerate(L.reads[k]):
                    for p in reads:
                        self._require(self.x(k, o), self.have(t, p))
        for (t, q), r in self.R.items():
            for p in self._inputs(L.parts[q].recompute, q):
                self._require(r, self.have(t, p))
        for q in L.rerun:
            for t in L.rerun_stages[q]:
                for p in self._inputs(L.parts[q].shape.forward, q):
                    self._require(mip.xsum(self.reruns(q, [t])), self.have(t, p))

    def _inputs(self, nodes, q: int) -> set[int]:
        """The other parts whose outputs `nodes` (of part q) read."""
        L = self.level
        return {L.part_of[i] for n in nodes for i in L.tg.node_inputs(n) if i in L.part_of} - {q}

    def _require(self, lhs, rhs) -> None:
        """lhs <= rhs, either side possibly a constant."""
        if isinstance(lhs, int) and isinstance(rhs, int):
            if lhs > rhs:
                raise SolverError("hiremate: a level's model requires a result no stage can "
                                  "provide (please report this graph)")
            return
        self.model.add_constr(lhs <= rhs)

    def held(self, t: int):
        """Bytes held entering stage t, in the model's unit (`self.unit` bytes)."""
        L, u = self.level, self.unit
        terms = [L.parts[k].out_bytes / u * self.s(t, k) for k in L.forward_order
                 if k not in L.exported or t < L.first_backward]
        for k in L.forward_stage:
            if L.forward_stage[k] < t <= L.backward_stage.get(k, -1):
                # Saved results kept from the forward or from a rerun before t.
                later = range(t, L.backward_stage[k] + 1)
                terms += [o.saved / u * (self.x(k, i) - mip.xsum(self.reruns(k, later, i)))
                          for i, o in enumerate(L.parts[k].options)]
        return mip.xsum(terms) + L.base[t] / u

    def _memory(self) -> None:
        m, L, u = self.model, self.level, self.unit
        add = m.add_constr
        for t, (kind, k) in enumerate(L.stages):
            options = L.parts[k].options
            if kind == "forward":
                # Keeping option i's saved results, or only the outputs when a rerun will.
                later = [mip.xsum(self.reruns(k, L.rerun_stages.get(k, ()), i))
                         for i in range(len(options))]
                add(self.held(t) + mip.xsum(o.forward_peak / u * (self.x(k, i) - later[i])
                                            + L.parts[k].plain_forward_peak / u * later[i]
                                            for i, o in enumerate(options)) <= self.peak)
                continue
            recomputed = [(p, r) for (s, p), r in self.R.items() if s == t]
            extra = mip.xsum(L.parts[p].out_bytes / u * r for p, r in recomputed)
            if recomputed:
                during = m.add_var(lb=0.0)
                for p, r in recomputed:
                    add(during >= max(0, L.parts[p].recompute_peak - L.parts[p].out_bytes) / u * r)
                add(self.held(t) + extra + during <= self.peak)
            reruns = [(L.parts[q], L.parts[q].options[i], z)
                      for (q, i, stage), z in self.Z.items() if stage == t]
            if reruns:
                add(self.held(t) + extra + mip.xsum(o.forward_peak / u * z for _, o, z in reruns)
                    <= self.peak)
            produced = mip.xsum((p.out_bytes + o.saved) / u * z for p, o, z in reruns)
            add(self.held(t) + extra + produced
                + mip.xsum(peak / u * self.x(k, i) for i, peak in enumerate(L.backward_peaks[k]))
                <= self.peak)

    # ------------------------------------------------------------ solving

    def solve(self, seconds: float, progress=quiet, label: str = "h-ilp") -> tuple[list[int], list[int]] | None:
        """The forward and backward sequences of the best solution found, or None."""
        outcome = milp.optimize(self.model, seconds, progress, label)
        if outcome.status not in ("optimal", "feasible"):
            return None
        return self.sequences()

    def variables(self) -> dict[tuple, mip.Var]:
        """The binaries by name, the same for every model of a level."""
        named: dict[tuple, mip.Var] = {}
        for prefix, table in (("X", self.X), ("S", self.S), ("R", self.R), ("Z", self.Z)):
            named.update(((prefix, *key), var) for key, var in table.items())
        return named

    def solution(self) -> dict[tuple, float]:
        """The values of the binaries in the solution found (to start another model)."""
        return {key: round(var.x or 0.0) for key, var in self.variables().items()}

    def start_from(self, values: dict[tuple, float]) -> None:
        """Warm start from another model's solution of the same level."""
        named = self.variables()
        self.model.start = [(var, values.get(key, 0.0)) for key, var in named.items()]

    def sequences(self) -> tuple[list[int], list[int]]:
        L = self.level
        chosen = {}
        for k, p in enumerate(L.parts):
            chosen[k] = 0 if len(p.options) == 1 else max(
                range(len(p.options)), key=lambda o: self.X[k, o].x or 0.0)
        forward: list[int] = []
        backward: list[int] = []
        for t, (kind, k) in enumerate(L.stages):
            option = L.parts[k].options[chosen[k]]
            if kind == "forward":
                forward.extend(option.forward)
                continue
            for p in L.forward_order:
                if (t, p) in self.R and (self.R[t, p].x or 0.0) >= 0.5:
                    backward.extend(L.parts[p].recompute)
                if any((z.x or 0.0) >= 0.5 for z in self.reruns(p, [t])):
                    backward.extend(L.parts[p].options[chosen[p]].forward)
            backward.extend(option.backward)
        return forward, backward


def solve_level(level: Level, peak: int | None, saved: int | None, deadline: Deadline,
                seconds: float, progress=quiet, label: str = "h-ilp", least_memory: bool = False,
                solved: list[tuple[int, dict]] | None = None):
    """Sequences of the level's best plan within the limits, or None (none found in time).
    `solved` lists (peak limit, solution) of earlier solves of the level: the search
    starts from the solution found under the highest limit at most `peak` (one within
    `peak` in the model), and the new solution joins the list."""
    model = LevelModel(level, peak, saved, least_memory)
    if solved and peak is not None:
        below = [(limit, values) for limit, values in solved if limit <= peak]
        if below:
            model.start_from(max(below, key=lambda s: s[0])[1])
    found = model.solve(max(0.5, min(seconds, deadline.remaining(seconds))), progress, label)
    if found is not None and solved is not None and peak is not None:
        solved.append((peak, model.solution()))
    return found
