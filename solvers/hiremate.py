"""`hiremate`: hierarchical rematerialization (Gusak et al., ICML 2025).

1. H-Partition (`partition.py`) groups the forward graph into a tree of small
   clusters, bottom to top; the tree is stored in the graph's hierarchy, and a
   tree already stored there (`remat-ir partition`, an earlier run) is used.
2. Options, bottom to top: every cluster offers its base options (store
   what its backward reads; keep nothing and recompute in its backward) and
   the solutions of its level's H-ILP (`hilp.py`) under a grid of limits on
   the bytes it keeps for its backward; with `leaf_solvers`, the smallest
   clusters also get the plans other solvers make of them (`leaves.py`).
   A node is a part with its own two base options. Clusters with the same
   structural signature (the blocks of a transformer) are solved once: the
   others take the same options with their own nodes. A level's parts share
   at most `max_options` options, in proportion to their size, keeping the
   most diverse saved-memory values.
3. The top level's H-ILP under the budget gives the whole training step. As
   the model is approximate, its memory limit is fitted to the simulator
   (down by a plan's excess over the budget, up by its slack), and the
   fastest plan within the budget wins.

A graph small enough to need no partition (at most `max_top` forward nodes
after the attached constants) is one level of nodes, Checkmate's own problem;
it and any graph whose Checkmate MILP is small (`EXACT_BINARIES`) are solved by
that MILP too, started from the fastest fitting of the H-ILP's plans and the
heuristics (among them `prefix_schedules`: recompute the forward up to a cut on
demand, which the H-ILP's options cannot express within a cluster), and the
fastest plan wins. Every graph also gets the density plans
(`baselines.density_schedules`: keep the results that cost the most time per byte to
recompute), which keep the same kind of results in every layer, a plan the H-ILP's
per-cluster grid of options can miss, and the keep-set program's plans (`keepset.py`:
the results to keep so that recomputing the others, with what they need, costs least;
they took the 32-layer Llama at 30% from 15.8% to 12.7%, where no schedule is below
12.3%); the fastest fitting plan goes on to trimming.

When no plan fits, or the fastest that fits is slower than `SLOW_PLAN` times
store-everything, rotor's chain plan (`_with_rotor`) is tried; then, if none fits,
TW-remat's (with most of the time left: `NEAR_FLOOR_TWREMAT_SHARE`) and the H-ILP's
least-memory plan and the heuristics (`_fallback`), or TW-remat's alone where the plan
that fits is still that slow. TW-remat runs wherever the fallback is needed, however
fast the fallback's plan (U-Net at 27.5%, GPU rates: the fallback's plan trimmed 1.52x
store-everything, TW-remat's 1.32x).
The smallest feasible budget reported is the lowest peak of every schedule made: the
top H-ILP's plans, its least-memory plan, the density plans, the recompute-all and
sqrt heuristics, rotor's plan where it fits, TW-remat's least-memory plan, and for a
small graph Checkmate's min-peak MILP started from the lowest of those; a budget at
that peak is then planned.

Every MILP has a time limit; a cluster whose H-ILP finds nothing in time keeps
its base options, so a plan always exists down to the least memory the
options allow.

Last, the plan's recomputations move to just before their first readers, and its
forward into eager's order, where the peak allows (`placement.py`): same time in the
model, and run compiled a recomputation lands in its reader's region, where Inductor
fuses it (the quick CNN at torch.compile 0.5's peak: 2.6% faster); the forward runs
module by module as eager's does (FSDP gathers one unit at a time).
"""

from __future__ import annotations

from collections.abc import Sequence

from remat_ir.ir import Graph, InvalidSchedule, pb, store_all

from .base import BadRequest, Deadline, InfeasibleBudget, SolverError, quiet
from .baselines import density_schedules, prefix_schedules, recompute_everything, sqrt_schedule
from .checkmate import binaries, solve_exact
from .fastsa import fastsa, polish
from .hilp import Level, Part, solve_level
from .keepset import keep_set_plans
from .leaves import leaf_options, leaf_solver_names
from .options import PartOption, PartShape, pareto, spread
from .partition import MAX_CLUSTER, MAX_TOP, Cluster, partition, store_hierarchy, stored_partition
from .placement import sink_to_readers
from .rotor import plan_near_floor, rotor
from .sequences import fit_to_budget, to_schedule
from .structure import TrainingGraph
from .trim import trim_recomputations

#: Annealing reaches in 30 s what the H-ILP alone reached in 60 s on the benchmark graphs
#: (benchmarks/results/solvers.md); graphs of 7,000 nodes are planned within it.
DEFAULT_TIME_LIMIT_S = 30.0
#: N_o: options one level's H-ILP chooses among, over all its parts. 100 left U-Net's
#: top 93 of its 143 Pareto options and a 32% overhead at 30% of its peak; 400 gives 24%.
MAX_OPTIONS = 400
#: A cluster's H-ILP is solved under these (peak, saved) limits, as shares of its
#: store-everything option's peak and of the bytes it keeps for the backward
#: (None: no peak limit). Each solution is one of the cluster's options.
BUDGET_GRID = tuple((None, saved) for saved in (0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75))
#: Solvers whose plans of the smallest clusters join their options (`leaves.py`); the
#: H-ILP's own options are always there.
LEAF_SOLVERS = ""
#: Seconds per H-ILP below the top (and per leaf solver's plan).
CLUSTER_SECONDS = 2.0
#: Share of the time limit the options may use before the top is solved.
OPTIONS_SHARE = 0.5
REPLANS = 6
#: Share of the time left that one solve of the top H-ILP may take: CBC rarely proves
#: the top optimal, and a plan over the budget needs time left for the re-plans.
TOP_SOLVE_SHARE = 1 / 3
#: Share of the time limit kept for trimming the plan's recomputations (`trim.py`),
#: which simulates the plan once per move it tries.
TRIM_SHARE = 0.2
#: Share of the time limit kept for annealing node by node (`fastsa.polish`) from every
#: plan made, the trimmed one included (the fastest within the budget, or a faster one
#: a little over it). Trimming, then annealing, at 30 s (predicted overhead, FLOP costs):
#: U-Net at 30% 12.9% (annealing alone 16.6%, trimming alone 14.4%); GPT-2 12 layers at
#: 50% 6.4% (annealing alone 5.5%, trimming alone 7.2%), at 30% 17.6% (19.1% trimming alone).
ANNEAL_SHARE = 0.3
#: Share of the time left after the top H-ILP that the density plans may take
#: (`baselines.density_schedules`; a few seconds on 7,000 nodes).
DENSITY_SHARE = 0.15
#: Share of the time left after the density plans that the keep-set program may take
#: (`keepset.py`: a few solves of one MILP, 1-2 s each on 7,000 nodes).
KEEP_SET_SHARE = 0.4
#: A plan slower than this many times store-everything (only recompute-everything fits,
#: near the smallest feasible budget) is annealed alone, neither trimmed first nor
#: joined by a run from the plans over the budget: trimming simulates the whole plan per
#: move (tens of thousands of steps), and annealing, which turns such a plan on GPT-2
#: from 29x into 1.4x store-everything's time, needs all the time left.
SLOW_PLAN = 2.0
#: Of the time left, the share rotor may take when hiremate's plan is that slow or none
#: fits (`_with_rotor`, before the fallback, whose recompute-all plan of the 32-layer Llama
#: has 2 million steps to simulate; rotor's program over 80-130 stages takes 1-3 s per
#: memory target).
ROTOR_SHARE = 0.25
#: Of the time left, the share twremat may take when hiremate's plan is that slow
#: (`_with_twremat`).
TWREMAT_SHARE = 0.25
#: ... and when nothing else fits, where it runs before the fallback: there TW-remat's
#: plan is usually the one kept, and its tree decomposition alone takes 2-4 s of the 3.4-5 s
#: it needs on the U-Net at 27.5%. Run after the fallback it started at 25 s of a 30 s
#: limit and stopped at its bisections: 1.8% slower than alone on a loaded 2-core machine.
NEAR_FLOOR_TWREMAT_SHARE = 0.6
#: Where nothing else fits, Fast SA's own search (groups, then nodes; again asked for less
#: where that finds nothing: `fastsa.DEEPER_TARGET`) gets this share of the time left
#: (`_with_own_answer`).
FASTSA_SHARE = 0.3
#: A graph whose exact MILP has at most this many binaries (bvlc_alexnet: 6,000, vgg19:
#: 8,600, squeezenet: 15,000, GPT-2: 1.2 million) goes through `checkmate` too.
EXACT_BINARIES = 10_000
#: Of the planning phase's time left, the share Checkmate's MILP may take on such a graph.
#: It is warm-started from the fastest plan that fits and rarely proves optimality there
#: (the 70-node MLP with dropout at 90%: a 32% gap after 8 s), so with all of it it ran
#: to the phase's deadline, most of a small model's planning time. At a quarter, 36
#: cases (chains of 12-60 layers, the zoo's small models, two ONNX zoo graphs, at 35-90%
#: of their peaks; 20 s limit) got the same predicted time and peak, or floor, in 190 s
#: against 247 s (`benchmarks/hiremate_checkmate_share.py`). Its plans of the same
#: figures may order steps otherwise (a forward out of module order, first);
#: `placement.py` puts the forward in eager's order.
CHECKMATE_SHARE = 0.25


def hiremate(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
             progress=quiet, max_cluster: int = MAX_CLUSTER, max_top: int = MAX_TOP,
             max_options: int = MAX_OPTIONS,
             leaf_solvers: str | Sequence[str] = LEAF_SOLVERS,
             repartition: bool = False, anneal: bool = True) -> pb.Schedule:
    """Hierarchical partition, options per cluster, H-ILP at every level; `leaf_solvers`
    (solver names, comma-separated or a sequence) add their plans of the smallest
    clusters to the options.

    The partition tree stored in the graph (`remat-ir partition`, an earlier run)
    is used when there is one, unless `repartition` or `max_cluster`/`max_top`
    are given; otherwise the tree made is stored in the graph. `anneal`: polish the
    plan by simulated annealing (`fastsa.polish`) in the last `ANNEAL_SHARE` of
    the time limit."""
    if isinstance(max_options, bool) or not isinstance(max_options, int) or max_options < 2:
        raise BadRequest(f"max_options must be an integer of at least 2, not {max_options!r}")
    leaves = leaf_solver_names(leaf_solvers)
    everything = store_all(graph)
    everything.name = "hiremate"
    if budget is None or everything.predicted_peak_bytes <= budget:
        return everything
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    whole = Deadline(limit)
    deadline = Deadline(limit * (1 - TRIM_SHARE - (ANNEAL_SHARE if anneal else 0.0)))
    tg = TrainingGraph(graph)
    explicit = repartition or (max_cluster, max_top) != (MAX_CLUSTER, MAX_TOP)
    tree = None if explicit else stored_partition(graph)
    if tree is None:
        tree = partition(graph, max_cluster=max_cluster, max_top=max_top, progress=progress)
        store_hierarchy(graph, tree)
    else:
        progress(f"hiremate: using the partition tree stored in the graph "
                 f"({len(tree.clusters())} clusters; repartition=True partitions it again)")
    planner = _Planner(tg, max_options, leaves, deadline, progress)
    top = planner.level(tree.root)
    planner.progress(f"hiremate: top level of {len(top.parts)} parts, "
                     f"{sum(len(p.options) for p in top.parts)} options")
    #: Every whole-step schedule made on the way, within the budget or not: the
    #: smallest feasible budget reported is never above the lowest of their peaks.
    made: list[pb.Schedule] = [everything]
    #: (memory limit, solution) of the top H-ILP's solves: warm starts for the next ones.
    solved: list[tuple[int, dict]] = []

    def plan_at(target: int) -> pb.Schedule | None:
        found = solve_level(top, target, None, deadline, TOP_SOLVE_SHARE * deadline.remaining(),
                            planner.progress, "hiremate top H-ILP", solved=solved)
        planned = None if found is None else planner.schedule(*found)
        if planned is not None:
            made.append(planned)
        return planned

    best = fit_to_budget(plan_at, budget, step=max(1, budget // 400), replans=REPLANS,
                         progress=progress, label="hiremate", deadline=deadline)
    density = density_schedules(tg, deadline=Deadline(whole.remaining() * DENSITY_SHARE))
    kept = keep_set_plans(tg, budget, Deadline(whole.remaining() * KEEP_SET_SHARE), progress)
    made += density + kept
    best = _fastest_within([best, *density, *kept], budget)
    if tree.rounds == 0 or binaries(tg) <= EXACT_BINARIES:
        made += prefix_schedules(tg)
        best = _with_checkmate(tg, budget, best, made, deadline, progress)
    if best is None or best.predicted_time_s > SLOW_PLAN * everything.predicted_time_s:
        best = _with_rotor(tg, everything, budget, best, made,
                           Deadline(whole.remaining() * ROTOR_SHARE), progress)
    # Nothing planned so far fits (the H-ILP, the density plans, checkmate, rotor): TW-remat's
    # plan, usually the one kept there, goes first, while most of the time is left; then
    # what the fallback finds (the H-ILP's least-memory plan, the heuristics) beside it.
    near_floor = best is None
    if near_floor:
        best = _with_twremat(graph, budget, best, made,
                             Deadline(whole.remaining() * NEAR_FLOOR_TWREMAT_SHARE), progress)
        best = _fallback(tg, top, planner, budget, made, deadline, progress)   # made has TW-remat's
        # Still nothing: Fast SA's search from store-everything, whose first stage moves
        # groups of nodes and finds low peaks where the H-ILP's clusters, rotor's chain and
        # TW-remat's tree do not (a 2-layer Llama at 50%: they stopped at 57.0-57.7% of
        # store-everything, Fast SA reached 50.3% at 1.27x its time); then rotor's own
        # answer, which `_with_rotor` skips where its chain cannot come near the budget and
        # whose least-memory plan may still be the lowest made (a 512-row MLP with dropout
        # at 30%: hiremate named 52.4% of store-everything, rotor 45.0%).
        for name, solver, share in (("fastsa", fastsa, FASTSA_SHARE), ("rotor", rotor, ROTOR_SHARE)):
            if best is None:
                best = _with_own_answer(name, solver, graph, budget, made,
                                        Deadline(whole.remaining() * share), progress)
    elif best.predicted_time_s > SLOW_PLAN * everything.predicted_time_s:
        best = _with_twremat(graph, budget, best, made, Deadline(whole.remaining() * TWREMAT_SHARE),
                             progress)
    slow = best is not None and best.predicted_time_s > SLOW_PLAN * everything.predicted_time_s
    if best is not None and not (anneal and slow):
        trim_seconds = limit * (1 - (ANNEAL_SHARE if anneal else 0.0)) - whole.elapsed()
        best = trim_recomputations(tg, best, budget, Deadline(max(0.0, trim_seconds)), progress,
                                   "hiremate")
    if anneal:
        share = 1.0 if best is not None else 0.5    # nothing fits: keep time for the floor
        starts = [best] if slow else made + ([best] if best is not None else [])
        polished = polish(tg, starts, budget, deadline=Deadline(whole.remaining() * share),
                          progress=progress)
        if polished is not None and (best is None or polished.predicted_time_s < best.predicted_time_s):
            best = polished
    if best is None:
        smallest = min(made, key=lambda s: s.predicted_peak_bytes)
        if anneal:   # the plan named with the floor is used as it is (remat(), the zoo): speed it up
            floor = smallest.predicted_peak_bytes
            smallest = polish(tg, [smallest], floor, deadline=Deadline(whole.remaining()),
                              progress=progress) or smallest
        if smallest.predicted_peak_bytes <= budget:
            # The polish lowered the floor to the budget: asked for the floor it named
            # before, hiremate refused it, naming it again (AST, a transformers audio model).
            return _named(sink_to_readers(tg, smallest, whole))
        raise InfeasibleBudget(budget, smallest.predicted_peak_bytes, " (by hiremate)",
                               schedule=_named(sink_to_readers(tg, smallest, whole)))
    return _named(sink_to_readers(tg, best, whole))


def _fastest_within(schedules: list[pb.Schedule | None], budget: int) -> pb.Schedule | None:
    fitting = [s for s in schedules if s is not None and s.predicted_peak_bytes <= budget]
    return min(fitting, key=lambda s: s.predicted_time_s, default=None)


def _fallback(tg: TrainingGraph, top: Level, planner: _Planner, budget: int,
              made: list[pb.Schedule], deadline: Deadline, progress) -> pb.Schedule | None:
    """When no plan of the H-ILP under the budget fits: its least-memory plan or a
    heuristic if one fits (the H-ILP's memory model is cautious), else None (the
    lowest peak of every schedule made, now in `made`, is the floor to name)."""
    found = solve_level(top, None, None, deadline, deadline.remaining(10.0), planner.progress,
                        "hiremate least-memory H-ILP", least_memory=True)
    planned = None if found is None else planner.schedule(*found)
    if planned is not None:
        made.append(planned)
        progress(f"hiremate: no H-ILP plan within the budget; its least-memory plan peaks at "
                 f"{planned.predicted_peak_bytes} bytes")
    made += [recompute_everything(tg), sqrt_schedule(tg)]
    return _fastest_within(made, budget)


def _with_rotor(tg: TrainingGraph, everything: pb.Schedule, budget: int, best: pb.Schedule | None,
                made: list[pb.Schedule], deadline: Deadline, progress) -> pb.Schedule | None:
    """Near the smallest feasible budget the parameter gradients made so far fill the end
    of the backward, and the H-ILP's plans either do not fit or recompute quadratically;
    rotor's chain plans re-run the forward from checkpoints it can place after the loss,
    and recompute node by node in the last stages (Llama 32 layers at 13.5% of its peak:
    1.38x store-everything's time where the H-ILP's plan costs 110x). It is skipped in a
    second where its chain cannot come near the budget (`rotor.plan_near_floor`)."""
    return _with_helper("rotor", lambda: plan_near_floor(tg, everything, budget, deadline, progress),
                        best, made, progress)


def _with_twremat(graph: Graph, budget: int, best: pb.Schedule | None, made: list[pb.Schedule],
                  deadline: Deadline, progress) -> pb.Schedule | None:
    """Near the smallest feasible budget the H-ILP's plans do not fit and recompute-everything
    (quadratic) may be the only one that does; TW-remat's recursion recomputes O(n log n)
    there (U-Net at 25%: 27% overhead where recompute-everything costs 722%)."""
    from .twremat import twremat   # networkx's tree decompositions, needed only here

    return _with_helper("twremat", lambda: twremat(graph, budget, progress=progress,
                                                   time_limit_s=max(1.0, deadline.remaining())),
                        best, made, progress)


def _with_own_answer(name: str, solver, graph: Graph, budget: int, made: list[pb.Schedule],
                     deadline: Deadline, progress) -> pb.Schedule | None:
    """Where no plan made fits: another solver's own answer at the budget. Its plan within
    the budget is the plan (the polish after it speeds it up); else its lowest joins `made`."""
    return _with_helper(name, lambda: solver(graph, budget, progress=progress,
                                             time_limit_s=max(1.0, deadline.remaining())),
                        None, made, progress)


def _with_helper(name: str, attempt, best: pb.Schedule | None, made: list[pb.Schedule],
                 progress) -> pb.Schedule | None:
    """Another solver's plan near the floor: `attempt()` returns a plan within the budget
    (or None), or refuses with its lowest-peak plan, which joins `made`; the faster
    fitting plan wins, and a failing helper does not fail hiremate."""
    try:
        plan = attempt()
    except InfeasibleBudget as refused:
        if refused.schedule is not None:
            made.append(refused.schedule)
        return best
    except SolverError as error:
        progress(f"hiremate: {name} failed near the floor: {error}")
        return best
    if plan is None:
        return best
    made.append(plan)
    if best is None or plan.predicted_time_s < best.predicted_time_s:
        progress(f"hiremate: {name}'s plan is faster near the floor ({plan.predicted_time_s:.4g} s "
                 f"against {'none' if best is None else f'{best.predicted_time_s:.4g} s'})")
        return plan
    return best


def _with_checkmate(tg: TrainingGraph, budget: int, best: pb.Schedule | None,
                    made: list[pb.Schedule], deadline: Deadline, progress) -> pb.Schedule | None:
    """A graph small enough for Checkmate's exact MILP (one that needs no partition is a
    single level of nodes, Checkmate's own problem) goes through it too: the MILP models
    memory within a stage exactly (the H-ILP counts a stage's recomputations together)
    and recomputes single nodes where the H-ILP reruns parts. It starts from the
    fastest fitting of `made` (the H-ILP's plans and the heuristics); the faster plan
    wins. When no plan fits, its least-memory schedule (the min-peak MILP's, started
    from the lowest-peak plan known) joins `made`."""
    try:
        seconds = max(1.0, CHECKMATE_SHARE * deadline.remaining(30.0))
        exact = solve_exact(tg, budget, Deadline(seconds), progress, known=made)
    except InfeasibleBudget as refused:
        if refused.schedule is not None:
            made.append(refused.schedule)
        return best
    except SolverError:
        return best
    if best is None or exact.predicted_time_s < best.predicted_time_s:
        return exact
    return best


def _named(schedule: pb.Schedule) -> pb.Schedule:
    schedule.name = schedule.solver = "hiremate"
    return schedule


class _Planner:
    """Options of every cluster, bottom to top, each structure solved once."""

    def __init__(self, tg: TrainingGraph, max_options: int, leaves: tuple[str, ...],
                 deadline: Deadline, progress):
        self.tg, self.max_options, self.deadline, self.progress = tg, max_options, deadline, progress
        self.leaves = leaves
        #: Leaf solvers that failed on a cluster: said once, not asked again (`leaf_options`).
        self.failed_leaves: set[str] = set()
        #: signature -> (forward nodes, backward nodes, options) of the first cluster solved.
        self.solved: dict[str, tuple[list[int], list[int], list[PartOption]]] = {}
        self.count = 0

    # -------------------------------------------------------------- levels

    def level(self, cluster: Cluster) -> Level:
        """The H-ILP level of `cluster`: its nodes, its child clusters (with their options,
        solved first), and at the root the backward nodes no forward node owns."""
        tg = self.tg
        pieces: list[tuple[list[int], list[int], list[PartOption] | None]] = []
        owned: dict[int, list[int]] = {n: [] for n in cluster.nodes + cluster.attached}
        loose = []
        for b in cluster.backward:
            owner = cluster.owner.get(b)
            (owned[owner] if owner in owned else loose).append(b)
        for n, backward in owned.items():
            pieces.append(([n], backward, None))
        for child in cluster.children:
            forward, backward = _nodes_of(tg, child)
            pieces.append((forward, backward, self.cluster_options(child)))
        pieces += [([], [b], None) for b in loose]
        sizes = [max(1, len(forward)) for forward, _, _ in pieces]
        parts = []
        for (forward, backward, options), size in zip(pieces, sizes):
            shape = PartShape(tg, forward, backward)
            if options is None:
                options = shape.base_options()
            cap = max(2, round(self.max_options * size / sum(sizes)))
            parts.append(Part.of(tg, shape, spread(options, cap)))
        forward, backward = _nodes_of(tg, cluster)
        exported = PartShape(tg, forward, backward).outputs - tg.held_outputs
        return Level(tg, parts, exported)

    def cluster_options(self, cluster: Cluster) -> list[PartOption]:
        tg = self.tg
        forward, backward = _nodes_of(tg, cluster)
        shape = PartShape(tg, forward, backward)
        known = self.solved.get(cluster.signature)
        if known is not None:
            mapped = _mapped(tg, known, forward, backward, shape)
            if mapped is not None:
                return mapped
        options = shape.base_options()
        if backward and not self.deadline.expired():
            level = self.level(cluster)
            store = options[0]
            peak = max(store.forward_peak, store.saved + store.backward_peak)
            for peak_share, saved_share in BUDGET_GRID:
                if self.options_deadline().expired():
                    break
                found = solve_level(level, None if peak_share is None else int(peak_share * peak),
                                    int(saved_share * store.saved), self.deadline,
                                    CLUSTER_SECONDS, quiet)
                if found is not None:
                    options.append(shape.measure(*found))
            if self.leaves and not cluster.children:
                options += leaf_options(shape, self.leaves, CLUSTER_SECONDS, self.options_deadline(),
                                        f"cluster {cluster.id}", self.progress, self.failed_leaves)
        options = pareto(options)
        self.count += 1
        self.progress(f"hiremate: cluster {cluster.id} (level {cluster.level}, "
                      f"{len(forward)} forward nodes) has {len(options)} options; "
                      f"{self.count} structures solved")
        self.solved.setdefault(cluster.signature, (forward, backward, options))
        return options

    def options_deadline(self) -> Deadline:
        """What is left of the options' share of the time limit."""
        if self.deadline.seconds is None:
            return Deadline(None)
        return Deadline(max(0.0, OPTIONS_SHARE * self.deadline.seconds - self.deadline.elapsed()))

    # ------------------------------------------------------------ schedule

    def schedule(self, forward: list[int], backward: list[int]) -> pb.Schedule | None:
        """The whole-step schedule of an H-ILP's answer, or None where it is invalid: the
        H-ILP does not order the draws of random nodes whose draws depend on their inputs'
        values as eager's, and an answer that reorders them was raised as hiremate's
        error, where the other plans made fit (hunt76: a weight made like `nn.init.sparse_`,
        `normal_` then `randperm` index writes, failed `remat` at 50%)."""
        try:
            return to_schedule(self.tg, forward + backward, len(forward), name="hiremate")
        except InvalidSchedule as error:
            self.progress(f"hiremate: an H-ILP answer left out, invalid as a schedule ({error})")
            return None


def _nodes_of(tg: TrainingGraph, cluster: Cluster) -> tuple[list[int], list[int]]:
    forward = sorted(cluster.forward_nodes(), key=tg.position.__getitem__)
    backward = sorted((b for c in cluster.walk() for b in c.backward), key=tg.position.__getitem__)
    return forward, backward


def _mapped(tg: TrainingGraph, known, forward: list[int], backward: list[int],
            shape: PartShape) -> list[PartOption] | None:
    """The options of a structurally identical cluster, on this cluster's nodes
    (None if the two differ after all, e.g. in their backward nodes)."""
    their_forward, their_backward, options = known
    if len(their_forward) != len(forward) or len(their_backward) != len(backward):
        return None
    mapping = dict(zip(their_forward + their_backward, forward + backward))
    if any(tg.graph.node(a).op != tg.graph.node(b).op for a, b in mapping.items()):
        return None
    return [shape.measure([mapping[n] for n in o.forward], [mapping[n] for n in o.backward])
            for o in options]
