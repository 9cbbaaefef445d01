"""`twremat`: divide and conquer over a tree decomposition (TW-remat; Kumar, Purohit,
Svitkina, Vee, Wang, "Efficient Rematerialization for Deep Networks", NeurIPS 2019).

TW-remat computes a node set with little memory by recursion on balanced
separators: take a bag X of a tree decomposition of the graph whose removal
leaves components of at most about half the nodes each, compute X (recursing
into the components for what X reads), keep X, then solve each component with X
held, recomputing in it what it needs, and free X. Memory is bounded by the
separators held along one path of the recursion, O(width x depth), at the price
of recomputing each level's part of the graph once per level.

A training step adds constraints that the paper's formulation does not have:
backward nodes run once each, in an order respecting their dependencies, and
mutating, non-recomputable and output nodes run once in the forward. Here the
recursion is therefore over the *forward* graph and the backward order drives
it:

1. **Separator tree** (`Hierarchy`, built once per graph structure and cached
   in `Graph.derived`). The recomputable forward nodes, as an undirected graph,
   get a tree decomposition (networkx's min-fill-in or min-degree heuristic).
   A region (a connected set of forward nodes, at first each connected
   component) is split by the separator among the decomposition's bags and
   bag intersections (the separators of the decomposition's edges, often a
   single tensor on a chain) that leaves no component with more than 2/3 of
   its nodes and holds the fewest bytes; the components are the child
   regions, down to single nodes. Every forward node is in the separator of
   exactly one region, and what a region's nodes read from outside it lies in
   the separators of its ancestors, held while it is worked on.
2. **A plan** (`Plan`) chooses the *leaf* regions (not divided further; what
   lies below a leaf belongs to it) and the *kept* regions, whose results the
   forward pass keeps (a divided region's separator, a leaf's results). A
   region is *active* from the first backward step that reads a result of it
   to the last. When a region becomes active, a divided region's separator is
   computed unless kept (recomputing on demand what it reads, from the
   ancestors' separators) and held to the end of the region's activity; a
   leaf computes its results on demand when the backward reads them, unless
   kept, and holds them to its end (the sub-problem's plain order). Results
   computed for the moment only, whose region is not active, are forgotten
   after the step that needed them. The components are thus visited in the
   order in which the backward needs them, which respects every backward
   dependency by construction, and the frees follow the last uses
   (`to_schedule`). Every region divided, nothing kept: TW-remat's schedule,
   with the separators along one path of the recursion (and the gradients)
   held, O(log n) of them on a chain, each level recomputed once, O(n log n)
   recomputations; every region a leaf and kept: store-everything.
3. **The budget** is followed by search, every plan judged by the simulator:
   a bisection on a leaf size (a region is a leaf when it holds at most that
   many bytes that the backward reads; the peak grows with it), once with the
   separators recomputed (TW-remat) and once with all of them kept (they are
   then checkpoints, as in Chen et al.'s scheme), the regions active when the
   backward first reads their component kept in both (recomputing them at once
   would gain nothing). Then greedy moves from the finest plan and from the
   bisections' plans: keep a separator or a leaf's results from the forward
   pass, make a divided region a leaf, in order of the recomputation they
   save per byte they add, screened on the current plan's memory curve and
   simulated in batches; and from the bisections' first plans over the
   budget, divide where the simulated peak is until the plan fits. The
   fastest schedule within the budget wins; when none fits, `InfeasibleBudget`
   names the lowest simulated peak found, with its schedule, which a budget
   there gets again. At most `refine` plans are simulated beyond the
   bisections, within the time limit.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
from networkx.algorithms.approximation import treewidth_min_degree, treewidth_min_fill_in

from remat_ir.ir import Graph, pb, store_all

from .base import BadRequest, Deadline, InfeasibleBudget, quiet
from .sequences import simulated_schedule
from .structure import TrainingGraph
from .subgraph import CONTEXT_OPS

#: A separator is balanced when no component it leaves has more than this share of the
#: region's nodes (TW-remat's balanced separators have 1/2 on a tree decomposition's
#: bag; a looser bound lets it pick a smaller tensor among more candidates).
BALANCE = 2 / 3
#: Tree decomposition heuristics (networkx.algorithms.approximation).
HEURISTICS = {"min_fill_in": treewidth_min_fill_in, "min_degree": treewidth_min_degree}
DEFAULT_TIME_LIMIT_S = 30.0
#: Plans simulated beyond the bisections, dividing where the peak is and undoing
#: divisions where the budget allows (about 20 ms each on a 600-node graph).
REFINE_TRIALS = 64
#: Plans kept per hierarchy (compute sequences by choice of leaves; the structure fixes them).
CACHED_PLANS = 128


@dataclass
class Region:
    """A connected set of forward nodes and how it is divided."""
    parent: int                      # index of the parent region, -1 for the root
    depth: int
    nodes: frozenset[int]            # the region's forward nodes (its separator and below)
    separator: tuple[int, ...]       # in forward order; empty for the (virtual) root
    children: list[int] = field(default_factory=list)
    #: Bytes of the region's results that backward reads (distinct allocations).
    weight: int = 0
    #: First and last backward steps (indices into the backward order) reading a result of
    #: the region; None when none does.
    first: int | None = None
    last: int | None = None


class Hierarchy:
    """The separator tree of a training graph's recomputable forward nodes (structure
    only: costs are not read, so that one hierarchy serves every lowering of a graph)."""

    def __init__(self, tg: TrainingGraph, heuristic: str):
        self.tg = tg
        self.pinned = pinned_nodes(tg)
        fwd = [n for n in tg.forward if n not in self.pinned]
        self.forward_set = set(tg.forward)
        self.position = {n: i for i, n in enumerate(tg.forward)}
        undirected = nx.Graph()
        undirected.add_nodes_from(fwd)
        for n in fwd:
            undirected.add_edges_from((n, p) for p in tg.node_inputs(n)
                                      if p in self.forward_set and p not in self.pinned)
        self.adjacency = {n: list(undirected.adj[n]) for n in fwd}
        self.inputs = {n: [p for p in tg.node_inputs(n) if p in self.forward_set]
                       for n in tg.order}
        self.width, self.bags, self.tree = self._decompose(undirected, heuristic)
        self.node_bags: dict[int, list[int]] = defaultdict(list)
        for t, bag in enumerate(self.bags):
            for v in bag:
                self.node_bags[v].append(t)
        self.regions = [Region(-1, 0, frozenset(fwd), ())]
        self.home: dict[int, int] = {}
        components = sorted(nx.connected_components(undirected),
                            key=lambda c: min(self.position[n] for n in c), reverse=True)
        stack = [(frozenset(c), 0) for c in components]
        while stack:
            nodes, parent = stack.pop()
            index = len(self.regions)
            separator, components = self._split(nodes)
            region = Region(parent, self.regions[parent].depth + 1, nodes,
                            tuple(sorted(separator, key=self.position.__getitem__)))
            self.regions.append(region)
            self.regions[parent].children.append(index)
            for v in separator:
                self.home[v] = index
            stack.extend((c, index) for c in reversed(components))
        self._measure()
        #: Region -> the connected component (child of the root) it lies in; the root itself.
        self.component = [0] * len(self.regions)
        for index in range(1, len(self.regions)):
            parent = self.regions[index].parent
            self.component[index] = index if parent == 0 else self.component[parent]
        self.plans: dict[tuple[frozenset[int], frozenset[int]], tuple] = {}

    # ------------------------------------------------------------ decomposition

    @staticmethod
    def _decompose(undirected: nx.Graph, heuristic: str):
        """Bags (frozensets) and the decomposition tree's adjacency (bag indices)."""
        if undirected.number_of_nodes() == 0:
            return 0, [], []
        width, tree = HEURISTICS[heuristic](undirected)
        bags = list(tree.nodes)
        index = {b: i for i, b in enumerate(bags)}
        adjacency = [[index[c] for c in tree.adj[b]] for b in bags]
        return width, bags, adjacency

    def _split(self, nodes: frozenset[int]) -> tuple[set[int], list[frozenset[int]]]:
        """The region's separator and the components it leaves (each connected)."""
        if len(nodes) == 1:
            return set(nodes), []
        if len(nodes) == 2:     # one bag: hold the smaller result, the other below it
            first, second = sorted(nodes, key=lambda v: (self.bytes([v]), self.position[v]))
            return {first}, [frozenset([second])]
        separator = self._separator(nodes)
        left = nodes - separator
        components, seen = [], set()
        for start in sorted(left, key=self.position.__getitem__):
            if start in seen:
                continue
            seen.add(start)
            component, todo = [start], [start]
            while todo:
                for u in self.adjacency[todo.pop()]:
                    if u in left and u not in seen:
                        seen.add(u)
                        component.append(u)
                        todo.append(u)
            components.append(frozenset(component))
        return separator, components

    def _separator(self, nodes: frozenset[int]) -> set[int]:
        """The balanced separator holding the fewest bytes among the bags of the
        decomposition restricted to `nodes` and the intersections of adjacent bags.

        Component sizes are read off the decomposition tree: rooted anywhere, each node
        is counted at the bag nearest the root that holds it, so that the subtree below
        a bag holds exactly the nodes on that side of it."""
        bag_ids = list(dict.fromkeys(t for v in sorted(nodes, key=self.position.__getitem__)
                                     for t in self.node_bags[v]))
        in_region = set(bag_ids)
        root = bag_ids[0]
        parent = {root: -1}
        order = [root]
        for t in order:
            for u in self.tree[t]:
                if u in in_region and u not in parent:
                    parent[u] = t
                    order.append(u)
        top: dict[int, int] = {}
        count = dict.fromkeys(order, 0)
        for t in order:
            for v in self.bags[t]:
                if v in nodes and v not in top:
                    top[v] = t
                    count[t] += 1
        below = dict(count)
        kids: dict[int, list[int]] = defaultdict(list)
        for t in reversed(order):
            if parent[t] >= 0:
                below[parent[t]] += below[t]
                kids[parent[t]].append(t)
        total = len(nodes)
        best_key, best = None, None
        root_of, memory = self.tg.root, self.tg.memory

        def consider(separator: list[int], largest: int) -> None:
            nonlocal best_key, best
            size = sum(memory[r] for r in {root_of(v) for v in separator})
            balanced = largest <= BALANCE * total
            key = (0, size, largest, len(separator)) if balanced else (1, largest, size,
                                                                        len(separator))
            if best_key is None or key < best_key:
                best_key, best = key, separator

        for t in order:
            bag = [v for v in self.bags[t] if v in nodes]
            above = sum(1 for v in bag if top[v] != t)
            sides = [below[c] for c in kids[t]] + [total - below[t] - above]
            consider(bag, max(sides))
            if parent[t] >= 0:
                shared = [v for v in bag if v in self.bags[parent[t]]]
                if shared:
                    consider(shared, max(below[t], total - below[t] - len(shared)))
        return set(best)

    def _measure(self) -> None:
        """Regions' weights and active periods, bottom-up."""
        tg = self.tg
        needed = tg.needed_by_backward
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for j, b in enumerate(tg.backward):
            for p in tg.node_inputs(b):
                if p in self.home:
                    first.setdefault(p, j)
                    last[p] = j
        for index in range(len(self.regions) - 1, -1, -1):
            region = self.regions[index]
            roots = {tg.root(v) for v in region.nodes if v in needed}
            region.weight = sum(tg.memory[r] for r in roots)
            steps = [first[v] for v in region.separator if v in first]
            steps += [self.regions[c].first for c in region.children
                      if self.regions[c].first is not None]
            ends = [last[v] for v in region.separator if v in last]
            ends += [self.regions[c].last for c in region.children
                     if self.regions[c].last is not None]
            region.first = min(steps, default=None)
            region.last = max(ends, default=None)

    def starts(self, index: int) -> bool:
        """Whether region `index` is active when the backward first reads its connected
        component of the forward graph (each is a problem of its own)."""
        first = self.regions[index].first
        return first is not None and first == self.regions[self.component[index]].first

    def roots(self, index: int, plan: Plan) -> set[int]:
        """Allocating nodes whose results region `index` keeps from the forward pass in
        `plan` (its separator if divided, its results if a leaf)."""
        nodes = self.regions[index].nodes if index in plan.leaves else self.regions[index].separator
        return {self.tg.root(v) for v in nodes}

    def bytes(self, nodes) -> int:
        """Bytes of the distinct allocations the results of `nodes` hold."""
        return sum(self.tg.memory[r] for r in {self.tg.root(v) for v in nodes})

    @property
    def depth(self) -> int:
        return max(r.depth for r in self.regions)

    # ----------------------------------------------------------------- plans

    def leaves_at(self, threshold: int) -> frozenset[int]:
        """The topmost regions holding at most `threshold` bytes that backward reads."""
        leaves, todo = set(), [0]
        while todo:
            index = todo.pop()
            region = self.regions[index]
            if region.weight <= threshold or not region.children:
                leaves.add(index)
            else:
                todo.extend(region.children)
        return frozenset(leaves)

    def divided(self, leaves: frozenset[int]) -> list[int]:
        """Regions above the leaves (divided by their separator), top-down."""
        found, todo = [], [0]
        while todo:
            index = todo.pop()
            if index in leaves:
                continue
            found.append(index)
            todo.extend(self.regions[index].children)
        return found

    def sequence(self, leaves: frozenset[int], kept: frozenset[int] = frozenset()
                 ) -> tuple[list[int], list[int], dict[int, tuple[int, int]], dict[int, int]]:
        """The compute sequence (forward, then backward with recomputations) of the plan
        whose leaf regions are `leaves` (topmost regions not divided further) and whose
        regions in `kept` keep their results from the forward pass (a divided region
        its separator, a leaf all of its results) rather than compute them when they
        become active; with the
        position of each backward node in it and, for each divided region, the span of
        the sequence its activation computes (the recomputation that keeping its
        separator from the forward pass would save), and the region owning each forward
        node (the leaf it lies in, or the divided region whose separator holds it).
        Cached: structure only."""
        known = self.plans.get((leaves, kept))
        if known is not None:
            return known
        tg, regions = self.tg, self.regions
        owner: dict[int, int] = {}
        leaf_of: dict[int, int] = {}     # region -> the leaf at or above it, if any
        divided = set()
        for index in range(len(regions)):
            above = leaf_of.get(regions[index].parent) if index else None
            if above is not None:
                leaf_of[index] = above
            elif index in leaves:
                leaf_of[index] = index
            else:
                divided.add(index)
        for v, home in self.home.items():
            owner[v] = leaf_of.get(home, home)
        live = [i for i in range(len(regions))
                if (i in divided or leaf_of.get(i) == i) and regions[i].first is not None]
        activate: dict[int, list[int]] = defaultdict(list)
        deactivate: dict[int, list[int]] = defaultdict(list)
        for i in live:
            activate[regions[i].first].append(i)
            deactivate[regions[i].last].append(i)
        active: set[int] = set()
        # Kept from the forward pass: a divided region's separator, a leaf's results.
        fresh = {v for i in kept if i in divided for v in regions[i].separator}
        fresh.update(v for v, o in owner.items() if o in kept and o not in divided)
        pinned = self.pinned
        sequence = list(tg.forward)
        inputs = self.inputs
        placed: list[int] = []           # position of each backward node in the sequence
        spans: dict[int, tuple[int, int]] = {}   # divided region -> what its activation computes

        def ensure(n: int) -> None:
            if n in fresh or n in pinned:
                return
            stack = [(n, False)]
            while stack:
                node, expanded = stack.pop()
                if node in fresh:
                    continue
                if expanded:
                    sequence.append(node)
                    fresh.add(node)
                    continue
                stack.append((node, True))
                for p in reversed(inputs[node]):
                    if p not in fresh and p not in pinned:
                        stack.append((p, False))

        def forget_transients(since: int) -> None:
            for n in sequence[since:]:
                if owner.get(n) not in active:
                    fresh.discard(n)

        for j, b in enumerate(tg.backward):
            arriving = [i for i in activate.get(j, ()) if i not in active]
            if arriving:
                arriving.sort(key=lambda i: regions[i].depth)
                active.update(arriving)
                mark = len(sequence)
                for i in arriving:
                    if i in divided:
                        before = len(sequence)
                        for v in regions[i].separator:
                            ensure(v)
                        spans[i] = before, len(sequence)
                forget_transients(mark)
            mark = len(sequence)
            for p in inputs[b]:
                ensure(p)
            forget_transients(mark)
            placed.append(len(sequence))
            sequence.append(b)
            for i in deactivate.get(j, ()):
                active.discard(i)
                fresh.difference_update(regions[i].separator if i in divided else regions[i].nodes)
        if len(self.plans) >= CACHED_PLANS:
            self.plans.pop(next(iter(self.plans)))
        self.plans[leaves, kept] = sequence, placed, spans, owner
        return sequence, placed, spans, owner


def pinned_nodes(tg: TrainingGraph) -> frozenset[int]:
    """Forward nodes that run once, in the forward, and stay: those that cannot be
    recomputed, and hiremate's context node (it stands for the rest of the network)."""
    graph = tg.graph
    return tg.run_once | {n for n in tg.forward if graph.node(n).op in CONTEXT_OPS}


def hierarchy(graph: Graph, tg: TrainingGraph, heuristic: str) -> Hierarchy:
    """The graph's separator tree, cached with its structure (`Graph.derived`): hiremate
    asks its leaf solvers for one cluster at several budgets."""
    cache = graph.derived.setdefault("twremat", {})
    found = cache.get(heuristic)
    if found is None:
        found = cache[heuristic] = Hierarchy(tg, heuristic)
    else:
        found.tg = tg   # the same structure; this lowering's costs
    return found


@dataclass(frozen=True)
class Plan:
    """Leaf regions (the topmost not divided), and the regions whose results the forward
    pass keeps: a divided region its separator, a leaf all of its results."""
    leaves: frozenset[int]
    kept: frozenset[int] = frozenset()


@dataclass
class _Trial:
    """A plan as the simulator found it."""
    schedule: pb.Schedule
    #: Sum over the schedule's steps of the bytes above the budget (0: it fits).
    excess: int
    #: Index in the backward order of the step running at the peak (-1: in the forward).
    peak_at: int
    #: Bytes live while each computation of the plan's sequence runs.
    during: list[int]
    #: Position in the sequence of each backward node.
    placed: list[int]
    #: Region -> time spent recomputing for it: a divided region's separator when it
    #: becomes active, a leaf's results (what keeping them from the forward would save).
    spent: dict[int, float]


class _Search:
    """Plans evaluated by the simulator: the fastest within the budget, the lowest peak."""

    def __init__(self, h: Hierarchy, budget: int, deadline: Deadline, progress, trials: int):
        self.h, self.budget, self.deadline, self.progress = h, budget, deadline, progress
        self.best: tuple[Plan, pb.Schedule] | None = None
        self.lowest: pb.Schedule | None = None
        self.known: dict[Plan, _Trial] = {}
        #: Plans beyond the bisections that may still be simulated.
        self.trials = trials

    @property
    def out_of_time(self) -> bool:
        return self.deadline.expired()

    def evaluate(self, plan: Plan) -> _Trial:
        known = self.known.get(plan)
        if known is not None:
            return known
        h = self.h
        sequence, placed, spans, owner = h.sequence(plan.leaves, plan.kept)
        time = h.tg.time
        spent = {i: sum(time[n] for n in sequence[a:b]) for i, (a, b) in spans.items()}
        for n in sequence[len(h.tg.forward):]:     # leaves' recomputations
            leaf = owner.get(n)
            if leaf in plan.leaves:
                spent[leaf] = spent.get(leaf, 0.0) + time[n]
        schedule, result = simulated_schedule(h.tg, sequence, len(h.tg.forward), name="twremat")
        budget = self.budget
        excess = sum(m - budget for m in result.memory_during if m > budget)
        during = [m for step, m in zip(schedule.steps, result.memory_during)
                  if step.WhichOneof("action") == "compute"]
        computed = sum(1 for step in schedule.steps[:result.peak_step + 1]
                       if step.WhichOneof("action") == "compute")
        trial = _Trial(schedule, excess, bisect.bisect_left(placed, computed - 1)
                       if computed > len(h.tg.forward) else -1, during, placed, spent)
        self.known[plan] = trial
        if self.lowest is None or schedule.predicted_peak_bytes < self.lowest.predicted_peak_bytes:
            self.lowest = schedule
        if not excess and (self.best is None
                           or schedule.predicted_time_s < self.best[1].predicted_time_s):
            self.best = plan, schedule
        return trial

    def bisect(self, leaf_sets: list[frozenset[int]], keep_all: bool, low: int = 0
               ) -> tuple[int | None, int | None]:
        """The largest leaf set (ordered from least to most memory) from `low` on whose
        plan fits and the next one, which does not, by bisection (None, low if the one
        at `low` does not fit): the separators of the divided regions all recomputed, as
        TW-remat does, or all kept from the forward pass (with the leaves, the
        checkpoints of Chen et al.'s scheme; the more regions are divided, the more
        they hold, so that this family is bisected from where the other one fits)."""
        high = len(leaf_sets) - 1      # the root a leaf: store everything, over the budget
        if low >= high:
            return None, None
        if self.evaluate(self.plan(leaf_sets[low], keep_all)).excess:
            return None, low
        while high - low > 1 and not self.out_of_time:
            middle = (low + high) // 2
            if self.evaluate(self.plan(leaf_sets[middle], keep_all)).excess:
                high = middle
            else:
                low = middle
        self.progress(f"twremat: separators {'kept' if keep_all else 'recomputed'}: "
                      f"{len(leaf_sets[low])} leaf regions fit the budget")
        return low, high

    def plan(self, leaves: frozenset[int], keep_all: bool) -> Plan:
        """The plan of these leaves that keeps from the forward pass the results of the
        regions active when the backward first reads their component (computing them
        again then would gain nothing), and with `keep_all` every divided region's
        separator."""
        h = self.h
        kept = {i for i in h.divided(leaves)
                if h.starts(i) or (keep_all and h.regions[i].first is not None)}
        kept.update(i for i in leaves if h.starts(i))
        return Plan(leaves, frozenset(kept))

    def descend(self, plan: Plan, trials: int) -> Plan | None:
        """From a plan over the budget, divide where the peak is until it fits: each step
        tries dividing a leaf active at the peak (its separator kept from the forward
        pass or recomputed) and recomputing a kept separator that waits there, and takes
        the move costing the least time per byte of excess it removes (at most `trials`
        plans simulated). Returns the plan reached if it fits."""
        h = self.h
        stop = self.trials - trials
        while True:
            # The root holds no separator: dividing it changes nothing to simulate.
            virtual = [i for i in plan.leaves
                       if not h.regions[i].separator and h.regions[i].children]
            if not virtual:
                break
            plan = Plan((plan.leaves - set(virtual))
                        | {c for i in virtual for c in h.regions[i].children}, plan.kept)
        trial = self.evaluate(plan)
        while trial.excess and self.trials > stop and not self.out_of_time:
            moves = []
            for leaf in plan.leaves:
                region = h.regions[leaf]
                if region.children and region.first is not None \
                        and _holds(h, plan, leaf, trial.peak_at):
                    moves.append(_split(h, plan, leaf, keep_separator=False))
                    moves.append(_split(h, plan, leaf, keep_separator=True))
            splits = len(moves)
            waiting = [i for i in plan.kept if h.regions[i].first is not None
                       and (trial.peak_at < 0 or h.regions[i].first > trial.peak_at)]
            waiting.sort(key=lambda i: -h.regions[i].first)
            for i in waiting[:4]:
                # Views hold their root's allocation: what shares one goes together.
                roots = h.roots(i, plan)
                kept = frozenset(j for j in plan.kept if j != i and not roots & h.roots(j, plan))
                moves.append(Plan(plan.leaves, kept))
            chosen, score = None, None
            for k, move in enumerate(moves):
                if self.trials <= stop or self.out_of_time:
                    break
                if move not in self.known:
                    self.trials -= 1
                found = self.evaluate(move)
                gain = trial.excess - found.excess
                slower = found.schedule.predicted_time_s - trial.schedule.predicted_time_s
                if gain > 0:
                    key = (0, slower / gain)
                elif gain == 0 and k < splits:
                    key = (1, slower)     # no better yet: the peak may lie elsewhere too
                else:
                    continue
                if score is None or key < score:
                    chosen, score = move, key
            if chosen is None:
                return None
            plan, trial = chosen, self.evaluate(chosen)
        return None if trial.excess else plan

    def refine(self, plan: Plan, trials: int) -> Plan:
        """Greedy moves from `plan` (within the budget), kept when the simulator finds
        them within the budget and faster, in passes until one changes nothing:

        - keep a divided region's separator, or a leaf's results, from the forward
          pass instead of recomputing them when the region becomes active: their
          bytes are added to the memory curve from the forward pass to that
          activation;
        - make a divided region whose children are leaves a leaf: its bytes read by
          the backward, less its largest child's, are added over its activity.

        Candidates are taken in order of the recomputation they save (what the
        activation of the region recomputes in the current plan) per byte they add,
        each one while the curve with the moves taken before it stays within the
        budget; the moves taken are simulated together, then the first half of them
        if that fails, and so on (at most `trials` plans simulated). Returns the plan
        reached."""
        h = self.h
        current = self.evaluate(plan)
        stop = self.trials - trials
        refused: set[tuple[str, int]] = set()
        changed = True
        while changed and self.trials > stop and not self.out_of_time:
            changed = False
            for move in ("keep", "leaf"):
                if self.trials <= stop or self.out_of_time:
                    break
                batch = self._screen(plan, current, move, refused)
                while batch and self.trials > stop and not self.out_of_time:
                    trial = plan
                    for index in batch:
                        trial = _moved(h, trial, move, index)
                    if trial not in self.known:
                        self.trials -= 1
                    found = self.evaluate(trial)
                    if not found.excess and (found.schedule.predicted_time_s
                                             < current.schedule.predicted_time_s):
                        plan, current, changed = trial, found, True
                        break
                    if len(batch) == 1:
                        refused.add((move, batch[0]))
                    batch = batch[:len(batch) // 2]
        return plan

    def _screen(self, plan: Plan, current: _Trial, move: str,
                refused: set[tuple[str, int]]) -> list[int]:
        """The moves of one kind that fit together under the current plan's memory
        curve, best first (see `refine`)."""
        h, spent = self.h, current.spent
        if move == "keep":
            candidates = [i for i in h.divided(plan.leaves)
                          if i not in plan.kept and spent.get(i) and h.regions[i].separator]
            added = {i: h.bytes(h.regions[i].separator) for i in candidates}
            leaves = [i for i in plan.leaves if i not in plan.kept and spent.get(i)
                      and h.regions[i].first is not None]
            added.update((i, h.regions[i].weight) for i in leaves)
            candidates += leaves
        else:
            candidates = [i for i in h.divided(plan.leaves)
                          if h.regions[i].first is not None and spent.get(i)
                          and all(c in plan.leaves for c in h.regions[i].children)]
            added = {i: h.regions[i].weight - max(h.regions[c].weight
                                                 for c in h.regions[i].children)
                     for i in candidates}
        candidates.sort(key=lambda i: -spent[i] / max(1, added[i]))
        curve = np.array(current.during, dtype=np.int64)
        batch = []
        for index in candidates:
            if (move, index) in refused:
                continue
            region = h.regions[index]
            if move == "keep":
                held = region.nodes if index in plan.leaves else region.separator
                start = min(h.position[v] for v in held)
                end = current.placed[region.first]
            else:
                start, end = current.placed[region.first], current.placed[region.last] + 1
            if end > start and curve[start:end].max() + added[index] > self.budget:
                continue
            curve[start:end] += added[index]
            batch.append(index)
        return batch


def twremat(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
            progress=quiet, heuristic: str = "min_fill_in", refine: int = REFINE_TRIALS
            ) -> pb.Schedule:
    """TW-remat: divide and conquer over a tree decomposition of the forward graph,
    leaf size and kept separators fitted to the budget by the simulator.

    `heuristic`: the tree decomposition's ("min_fill_in" or "min_degree");
    `refine`: how many plans the simulator may try beyond the bisections, dividing
    where the peak is and undoing divisions where the budget allows (0: none)."""
    if heuristic not in HEURISTICS:
        raise BadRequest(f"heuristic must be one of {', '.join(HEURISTICS)}, not {heuristic!r}")
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise BadRequest(f"refine must be a number of moves (an integer >= 0), not {refine!r}")
    everything = store_all(graph)
    everything.name = "twremat"
    if budget is None or everything.predicted_peak_bytes <= budget:
        return everything
    deadline = Deadline(DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
    tg = TrainingGraph(graph)
    h = hierarchy(graph, tg, heuristic)
    progress(f"twremat: {len(h.home)} recomputable forward nodes, tree decomposition of width "
             f"{h.width}, {len(h.regions) - 1} regions, depth {h.depth}")
    search = _Search(h, budget, deadline, progress, refine)
    search.lowest = everything     # a floor above store-everything's would be no floor
    thresholds = sorted({r.weight for r in h.regions})
    leaf_sets = list(dict.fromkeys(h.leaves_at(t) for t in thresholds))
    starts, overs, low = [], [], 0
    for keep_all in (False, True):
        fitting, over = search.bisect(leaf_sets, keep_all=keep_all, low=low)
        if fitting is None:
            if not keep_all:
                # Not even the finest plan fits: try recomputing all it keeps, and less.
                least = Plan(leaf_sets[0])
                if not search.evaluate(least).excess:
                    starts.append(least)
                overs.append(search.plan(leaf_sets[0], keep_all=False))
            break
        starts.append(search.plan(leaf_sets[fitting], keep_all))
        if over is not None:
            overs.append(search.plan(leaf_sets[over], keep_all))
        low = fitting
    if starts:
        # The finest plan first: every node is some region's separator there, and keeping
        # separators from the forward pass chooses checkpoints one by one.
        starts.insert(0, search.plan(leaf_sets[0], keep_all=False))
    phases = [("refine", plan) for plan in dict.fromkeys(starts)]
    phases += [("descend", plan) for plan in overs]
    for k, (phase, plan) in enumerate(phases):
        share = search.trials // (len(phases) - k)     # the simulations left, shared
        left = search.trials
        if phase == "descend":
            plan = search.descend(plan, share)
        if plan is not None:
            search.refine(plan, share - (left - search.trials))
    if search.best is not None:
        schedule = search.best[1]
        progress(f"twremat: {len(search.known)} plans simulated; the fastest within the budget "
                 f"peaks at {schedule.predicted_peak_bytes / budget:.0%} of it")
        return schedule
    frugal = search.lowest
    raise InfeasibleBudget(budget, frugal.predicted_peak_bytes, " (by twremat)", schedule=frugal)


def _moved(h: Hierarchy, plan: Plan, move: str, index: int) -> Plan:
    """`plan` with divided region `index`'s separator kept from the forward pass
    ("keep"), or with the region a leaf ("leaf"; kept from the forward pass if it is
    active when the backward starts on its component and what it replaces was)."""
    if move == "keep":
        return Plan(plan.leaves, plan.kept | {index})
    merged = _below(h, index) | {index}
    kept = plan.kept - merged
    if h.starts(index) and any(i in plan.kept for i in merged if h.starts(i)):
        kept = kept | {index}
    return Plan((plan.leaves - merged) | {index}, kept)


def _split(h: Hierarchy, plan: Plan, leaf: int, keep_separator: bool) -> Plan:
    """`plan` with `leaf` divided, its children leaves; its separator kept from the
    forward pass or not; the children kept if the leaf was and they are active when
    the backward starts on their component (the results it kept that they own)."""
    children = h.regions[leaf].children
    kept = plan.kept - {leaf}
    if keep_separator:
        kept = kept | {leaf}
    if leaf in plan.kept:
        kept = kept | {c for c in children if h.starts(c)}
    return Plan((plan.leaves - {leaf}) | set(children), kept)


def _holds(h: Hierarchy, plan: Plan, index: int, step: int) -> bool:
    """Whether leaf `index` holds results at backward step `step` (-1: the forward
    pass, where kept leaves do)."""
    region = h.regions[index]
    if step < 0:
        return index in plan.kept
    return region.first <= step <= region.last or (index in plan.kept and step < region.first)


def _under_leaf(h: Hierarchy, index: int, leaves: frozenset[int]) -> bool:
    """Whether `index` is a leaf or lies below one."""
    while index >= 0:
        if index in leaves:
            return True
        index = h.regions[index].parent
    return False


def _below(h: Hierarchy, index: int) -> set[int]:
    """The regions strictly below `index`."""
    found, todo = set(), list(h.regions[index].children)
    while todo:
        i = todo.pop()
        found.add(i)
        todo.extend(h.regions[i].children)
    return found
