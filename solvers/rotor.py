"""`rotor`: the chain dynamic program (Beaumont, Eyraud-Dubois, Herrmann, Joly,
Shilova), over the segments between the forward graph's articulation points.

The forward pass is a chain of segments (`TrainingGraph.segments`); as in
rotor's chain, a stage's backward may read the stage's input, which the DP
holds until that backward has run. Opt(s, t, m) is the least time to run
the backward of stages s..t given the input of s held and m bytes free.
Moves at stage s:

- *store*: run s keeping what its backward needs (one of several options,
  below), solve s+1..t with that memory taken, then run s's backward;
- *checkpoint*: run s..s'-1 keeping nothing but the input of s', solve
  s'..t, then solve s..s'-1 again from the held input of s;
- *direct* (s = t only): skip s's forward and run its backward from the
  held input, recomputing what it reads: either every result its backward
  reads, held until its last reader, or (*frugal*) only what each backward
  node reads, dropped right after it (recompute-all within the stage, the
  least memory a stage can take, for where the parameter gradients already
  made fill the budget: the end of the backward near the smallest budget).

A stage's input is held by the caller until the stage's backward has run,
except what no backward reads (an option's `input_freed`): the rest of
the chain and the stage's backward have its bytes too (the logits, 4% of
the Llama's peak, need not sit beside the loss's backward).

Options per segment (HiRemate's "several options"): keep every result its
backward reads, or only the results that are most expensive to recompute per
byte (3/4, 1/2, 1/4 of the bytes, nothing); the rest is recomputed just
before the segment's backward. Memory is counted in slots of budget/SLOTS
bytes, rounded up. The graph outputs that backward produces (parameter
gradients) stay live to the end and are added to every step's need.

The DP's memory model is approximate (side values, views, gradients shared
between stages); the simulator is the judge: the DP's memory target is moved
down by a plan's excess over the budget, up by its slack, then bisected, and
the fastest plan within the budget wins. The smallest feasible budget
reported is a simulated peak.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numba import njit

from remat_ir.ir import Graph, pb, store_all
from remat_ir.ir.fingerprint import structure_fingerprint

from .base import Deadline, InfeasibleBudget, SolverError, quiet
from .sequences import OnDemand, fit_to_budget, to_schedule
from .structure import Segment, TrainingGraph

SLOTS = 400
#: A frugal direct backward (node by node) is offered where its recomputations take at
#: most this many times the stage's forward: a transformer layer's stages take 2.5x, a
#: 400-node U-Net stage 63x, whose least-memory plans then cost 20x store-everything.
FRUGAL_LIMIT = 8.0
KEEP_SHARES = (1.0, 0.75, 0.5, 0.25, 0.0)
REPLANS = 8


@dataclass
class StageOption:
    """One way to run a segment when its results are stored for its backward."""
    kept: frozenset[int]
    recompute: list[int]            # forward nodes recomputed for the backward
    recompute_time: float
    #: The backward's nodes with the recomputations, each just before the first backward
    #: node reading it (the order the memory model measured).
    steps: list[int] = field(default_factory=list)
    hist: int = 0                   # bytes kept after the forward (for this and later stages)
    forward_peak: int = 0           # bytes during the forward of the segment
    backward_hist: int = 0          # of `hist`, the bytes still held when its backward starts
    backward_peak: int = 0          # bytes during its backward beyond `backward_hist`
    #: Bytes of the stage's input that die with its forward: no backward and none of its
    #: recomputations read them (the logits, which only the log-softmax reads). They
    #: count for the later stages and its own backward.
    input_freed: int = 0


@dataclass
class Stage:
    segment: Segment
    forward_time: float
    backward_time: float
    options: list[StageOption] = field(default_factory=list)
    #: The backward run from the stage's input alone, skipping its forward (the last
    #: stage of a solve needs no forward when its backward recomputes what it reads):
    #: recomputed results held until their last reader, then, if it takes less memory,
    #: each dropped after the backward node reading it.
    directs: list[StageOption] = field(default_factory=list)
    nostore_peak: int = 0           # bytes during its forward when keeping only its output
    boundary: int = 0               # bytes of its output (input of the next stage)
    #: Bytes of gradients live when its backward starts, made by later stages' backwards:
    #: those it reads and those passing it for earlier stages (a gradient the loss's stage
    #: makes for the first stage's backward is held through every stage between).
    gradient: int = 0
    outputs: int = 0                # bytes of graph outputs its backward produces


class Chain:
    """The segments as rotor's heterogeneous chain, with options per stage."""

    def __init__(self, tg: TrainingGraph):
        self.tg = tg
        forward = set(tg.forward)
        self.segments = _chain_segments(tg)
        #: The stage whose forward each forward node is in.
        self._forward_stage = {n: seg.index for seg in self.segments for n in seg.forward}
        self.pinned = self._pinned()
        #: Bytes held all along, outside the chain model: pinned results, forward outputs,
        #: and the graph outputs of recomputable nodes (BatchNorm's running statistics).
        self.pinned_bytes = (sum(tg.memory[n] for n in self.pinned)
                             + sum(tg.output_bytes[n]
                                   for n in (tg.output_nodes & tg.recomputable) - self.pinned))
        #: Results a backward node reads, and the last forward position reading each result
        #: (through its root): what a stage's input may not free.
        self.read_by_backward = frozenset(tg.root(p) for p in tg.needed_by_backward)
        self.last_forward_read = {tg.root(p): tg.position[n] for n in tg.forward
                                  for p in tg.node_inputs(n)}
        #: Per backward allocation (through roots: a parameter's gradient is often a view,
        #: `t()` of a mm, and a view holds its root's bytes), its stage and the earliest
        #: stage whose backward reads it or a view of it (the backwards run from the last
        #: stage to the first: it is live until that one's).
        root = tg.root
        stage_of = {b: seg.index for seg in self.segments for b in seg.backward}
        last_reader: dict[int, int] = {}
        for b in stage_of:
            r = root(b)
            if r in stage_of:
                readers = [stage_of[u] for u in tg.node_users[b] if u in stage_of]
                last_reader[r] = min(readers + [last_reader.get(r, stage_of[r])])
        #: What the backwards of the stages built so far read, recomputations included
        #: (through roots; any of their options): an earlier stage's backward runs after a
        #: later one's, so a later stage may not free its input where this holds it.
        self._read_by_earlier: set[int] = set()
        self.stages: list[Stage] = []
        for seg in self.segments:
            nodes = set(seg.forward)
            escaping = {n for n in seg.forward if any(u in forward and u not in nodes
                                                      for u in tg.node_users[n])}
            stage = Stage(seg, sum(tg.time[n] for n in seg.forward),
                          sum(tg.time[n] for n in seg.backward), boundary=seg.boundary_bytes)
            stage.nostore_peak = tg.walk(set(), list(seg.forward), escaping | self.pinned,
                                         self._held_apart(seg))[0]
            # The gradients made by other stages that its backward reads or views.
            grads_in = frozenset(r for b in seg.backward
                                 for r in [root(b)] + [root(p) for p in tg.node_inputs(b)]
                                 if r in stage_of and stage_of[r] != seg.index)
            # Held past its backward: what it makes for earlier stages, and what it reads
            # that an earlier stage reads too.
            grads_out = {r for r in grads_in | {root(b) for b in seg.backward}
                         if last_reader.get(r, seg.index) < seg.index}
            stage.gradient = sum(tg.memory[r] for r, first in last_reader.items()
                                 if first <= seg.index < stage_of[r])
            # A parameter's gradient is often a view (t() of a mm): count what it keeps
            # alive; a node returning one beside other results (convolution_backward's
            # weight gradient beside its input gradient) keeps only that to the end.
            stage.outputs = sum(tg.output_bytes[r] or tg.memory[r]
                                for r in {tg.root(b) for b in seg.backward if b in tg.output_nodes})
            for kept in self._keep_sets(seg):
                stage.options.append(self._option(seg, kept, escaping, grads_in, grads_out))
            if all(n in tg.recomputable and n not in self.pinned for n in seg.forward):
                for forget in (False, True):
                    direct = self._option(seg, frozenset(), frozenset(), grads_in, grads_out,
                                          forget=forget)
                    if not stage.directs or (
                            direct.backward_peak < stage.directs[0].backward_peak
                            and direct.recompute_time <= FRUGAL_LIMIT * stage.forward_time):
                        stage.directs.append(direct)
            self.stages.append(stage)
            self._read_by_earlier.update(tg.root(p) for o in stage.options + stage.directs
                                         for n in o.steps for p in tg.node_inputs(n))

    def _held_apart(self, seg: Segment) -> frozenset[int]:
        """What a stage's memory walks count apart: the pinned results and the stage's
        input, which the caller holds."""
        return self.pinned | {self.tg.root(n) for n in seg.inputs}

    @cached_property
    def outputs_after(self) -> list[int]:
        """Per stage, the bytes of graph outputs (parameter gradients) the backward of the
        later stages makes: live whenever this stage's backward runs."""
        after, total = [], 0
        for stage in reversed(self.stages):
            after.append(total)
            total += stage.outputs
        return after[::-1]

    @cached_property
    def least_need(self) -> int:
        """Bytes no plan of the program goes below: the pinned results, and the largest
        least need of a stage's forward (with its input held) or of its backward (with its
        input unless freed, its stored results and peak, the gradients it reads and the
        parameter gradients made before it)."""
        worst = 0
        for k, (stage, after) in enumerate(zip(self.stages, self.outputs_after)):
            held = self.stages[k - 1].boundary if k else 0
            forward = min([stage.nostore_peak] + [o.forward_peak for o in stage.options])
            backward = min([o.backward_hist + o.backward_peak + held - o.input_freed
                            for o in stage.options] + [d.backward_peak + held for d in stage.directs])
            worst = max(worst, forward + held, backward + stage.gradient + after)
        return self.pinned_bytes + worst

    def _pinned(self) -> frozenset[int]:
        """Forward results that break the chain: read by the backward of another
        segment (the loss path, attention masks), or graph outputs. They are
        kept from the forward pass and counted apart from the chain. A
        segment's input read by its own backward is not one: the chain holds
        a stage's input until the stage's backward has run."""
        tg = self.tg
        segment_of = self._forward_stage
        # A node that may run only once per step (`non_recomputable`, mutating) keeps its
        # results from its one run: a stage's forward run again skips it (`sequence_of`).
        # (Graph outputs that never run again, `held_outputs`, are among them.)
        pinned = {n for n in tg.run_once if n in segment_of}
        for seg in self.segments:
            for b in seg.backward:
                pinned.update(p for p in tg.node_inputs(b)
                              if p in segment_of and segment_of[p] != seg.index
                              and tg.root(p) not in seg.inputs)
        return frozenset(tg.with_roots(pinned))

    def _keep_sets(self, seg: Segment) -> list[frozenset[int]]:
        tg = self.tg
        needed = [n for n in seg.forward if n in tg.needed_by_backward and n in tg.recomputable]
        fixed = frozenset(n for n in seg.forward if n not in tg.recomputable or n in self.pinned)
        by_value = sorted(needed, key=lambda n: -tg.time[n] / max(1, tg.memory[n]))
        total = sum(tg.memory[n] for n in needed)
        sets: list[frozenset[int]] = []
        for share in KEEP_SHARES:
            chosen, used = set(fixed), 0
            for n in by_value:
                if used + tg.memory[n] <= share * total:
                    chosen.add(n)
                    used += tg.memory[n]
            chosen = frozenset(tg.with_roots(chosen))
            if chosen not in sets:
                sets.append(chosen)
        return sets

    def _option(self, seg: Segment, kept: frozenset[int], escaping, grads_in,
                grads_out, forget: bool = False) -> StageOption:
        """The stage's costs when its forward keeps `kept`: forward and backward peaks
        by `NodeMemory.walk` (node granularity: a node's results held or freed
        together through their root), its backward recomputing on demand (with
        `forget`, again for every backward node)."""
        tg = self.tg
        outside = set(tg.forward) - set(seg.forward)
        sequence: list[int] = []
        builder = OnDemand(tg, kept | escaping | outside, sequence)
        for b in seg.backward:
            builder.run(b)
            if forget:
                builder.forget(list(builder.fresh))
        recompute = [n for n in sequence if n not in set(seg.backward)]
        option = StageOption(kept, recompute, sum(tg.time[n] for n in recompute), sequence)
        # Not freed: what a backward or a recomputation reads, what a later stage's forward
        # reads (also through a view this stage makes of its input).
        end = tg.position[seg.forward[-1]]
        entering = ({tg.root(n) for n in seg.inputs} - self.read_by_backward - self.pinned
                    - self._read_by_earlier)
        entering -= {tg.root(p) for n in sequence for p in tg.node_inputs(n)}
        freed = {r for r in entering if self.last_forward_read.get(r, -1) <= end}
        option.input_freed = sum(tg.memory[r] for r in freed)
        # The input its backward reads dies at its last reader there, where nothing after
        # this backward reads it: no earlier stage's backward, and no forward run again
        # (made by the previous stage, it is made again by any re-run reading it). The
        # caller counts it to the end of the backward: the loss's backward would count the
        # log-probabilities beside both gradients of the logits (the GPT-2's least plans
        # 10% of store-everything over their simulated peak).
        dies = ({tg.root(n) for n in seg.inputs} - self.pinned - self._read_by_earlier - freed)
        dies = {r for r in dies if self._forward_stage.get(r) == seg.index - 1}
        apart = self._held_apart(seg)
        stored = {n for n in kept if n in tg.needed_by_backward} | escaping
        option.forward_peak, option.hist = tg.walk(set(), list(seg.forward),
                                                   stored | self.pinned, apart)
        # What only later stages read (the next stage's input) is gone by this backward.
        read = {p for n in sequence for p in tg.node_inputs(n)}
        held = tg.with_roots(n for n in stored if n in read or tg.view_roots.get(n, set()) & read)
        held &= set(seg.forward)  # the stage's input is held by the caller
        option.backward_hist = sum(tg.memory[n] for n in held - self.pinned)
        # The gradients it reads are freed after their last use (counted in `gradient`).
        peak, _ = tg.walk(held | grads_in | dies, sequence, grads_out | tg.held_outputs,
                          apart - dies)
        gradient = sum(tg.memory[p] for p in grads_in)
        option.backward_peak = max(0, peak - option.backward_hist - gradient
                                   - sum(tg.memory[r] for r in dies))
        return option


#: Most stages of the chain: the program's work grows with the cube of its length (a
#: table over GPT-2's 117 stages takes 3 s, over the 48-layer GPT-2's 391 two minutes);
#: longer chains have runs of consecutive segments merged into one stage.
MAX_STAGES = 128


def _chain_segments(tg: TrainingGraph) -> list[Segment]:
    """The segments as the chain's stages: each run of segments that only make views (the
    reshapes of the logits) merged into the next, since such a stage's output is its input,
    which the chain would count twice (held for the stage and as its output); then, past
    `MAX_STAGES`, runs of consecutive segments merged."""
    runs: list[list[Segment]] = [[]]
    for seg in tg.segments:
        runs[-1].append(seg)
        if seg is tg.segments[-1] or any(tg.memory[n] for n in seg.forward):
            runs.append([])
    runs.pop()
    size = math.ceil(len(runs) / MAX_STAGES)
    runs = [[seg for run in runs[k:k + size] for seg in run] for k in range(0, len(runs), size)]
    return [_merged(tg, run, index) for index, run in enumerate(runs)]


def _merged(tg: TrainingGraph, run: list[Segment], index: int) -> Segment:
    backward = {b for seg in run for b in seg.backward}
    return Segment(index, tuple(n for seg in run for n in seg.forward),
                   tuple(b for b in tg.backward if b in backward), run[-1].boundary_bytes,
                   run[0].inputs)


@njit(cache=True)
def _checkpoint_moves(table, s, t, need, cost, boundary, gradient, best, arg, code):
    """Rotor's checkpoint moves from stage `s` to `t`, every split k in s..t-1 at once (run
    s..k keeping only stage k+1's input, solve k+1..t, then s..k again): for each memory
    m, the cheapest `cost[i] + table[k+1, t, m - boundary[i]] + table[s, k, m - gradient[i]]`
    (infinite where m is below `need[i]` or a shifted index below zero; the last slot
    beyond the table), the earliest k among equals, written into `best` and `arg` (as
    `code + i`) where it is cheaper. Compiled: the same sums in the same order as the
    arrays numpy built per (s, t), whose building was most of rotor's time (an 80-node
    chain: 0.7 s per table, 7 tables per plan)."""
    M = best.shape[0] - 1
    for m in range(M + 1):
        cheapest, first = np.inf, -1
        for i in range(t - s):
            if m < need[i]:
                continue
            j, j2 = m - boundary[i], m - gradient[i]
            if j < 0 or j2 < 0:
                continue
            c = cost[i] + table[s + i + 1, t, min(j, M)] + table[s, s + i, min(j2, M)]
            if c < cheapest:
                cheapest, first = c, i
        if first >= 0 and cheapest < best[m]:
            best[m] = cheapest
            arg[m] = code + first


class OutOfTime(SolverError):
    """The dynamic program did not finish within the time limit."""


class _Tables:
    """The DP tables for one memory scale. With `round_trip` (seconds to offload and
    prefetch so many bytes; `pofo`), a stored stage may also be offloaded while the
    rest of the chain runs (`offload_move`), which also costs the compute timeline
    `round_trip_host_s` (the host issuing the two transfers). Past `deadline` it raises
    `OutOfTime`."""

    def __init__(self, chain: Chain, capacity: int, progress, round_trip=None, overlapped=True,
                 deadline: Deadline | None = None, round_trip_host_s: float = 0.0):
        self.chain = chain
        self.round_trip = round_trip
        #: What the chain holds all along does not fit: no plan does.
        self.short = capacity < chain.pinned_bytes
        capacity = max(0, capacity - chain.pinned_bytes)
        self.unit = max(1, math.ceil(capacity / SLOTS))
        self.M = capacity // self.unit
        stages = chain.stages
        L = len(stages)
        u = self.units
        after = chain.outputs_after
        grad = [st.gradient for st in stages]
        self.opt: dict[tuple[int, int], np.ndarray] = {}
        self.arg: dict[tuple[int, int], np.ndarray] = {}
        #: opt[s, t] as one array (its rows are `opt`'s tables), for `_checkpoint_moves`.
        self.table = np.full((L, L, self.M + 1), np.inf)
        slots = np.arange(self.M + 1)
        for length in range(1, L + 1):
            if L > 20 and length % max(1, L // 4) == 0:
                progress(f"rotor: dynamic program {length / L:.0%} done")
            for s in range(L - length + 1):
                t = s + length - 1
                st = stages[s]
                best = np.full(self.M + 1, np.inf)
                arg = np.full(self.M + 1, -1, dtype=np.int64)

                def consider(cand: np.ndarray, need: int, code: int) -> None:
                    cand[slots < need] = np.inf
                    better = cand < best
                    best[better], arg[better] = cand[better], code

                for o, opt in enumerate(st.options):
                    freed = opt.input_freed // self.unit      # rounded down: cautious
                    need = max(u(opt.forward_peak + after[t]),
                               u(opt.backward_hist + opt.backward_peak + grad[s] + after[s])
                               - u(grad[t]) - freed)
                    cost = st.forward_time + opt.recompute_time + st.backward_time
                    if s == t:
                        cand = np.full(self.M + 1, float(cost))
                    else:
                        cand = cost + self.shift(self.opt[s + 1, t], u(opt.hist) - freed)
                    consider(cand, need, o)
                    if round_trip is not None and s < t:
                        # POFO's move: the stage's saved results leave the device while
                        # stages s+1..t run and come back for its backward; the middle
                        # runs without them, and the step waits for the longer of the two.
                        middle, seconds = self.opt[s + 1, t], round_trip(opt.hist)
                        cand = (cost + round_trip_host_s
                                + (np.maximum(middle, seconds) if overlapped else middle + seconds))
                        # Its results are on the device again while stage s+1's backward
                        # runs (the prefetch overlaps it) and before they leave.
                        nxt = stages[s + 1].options[0]
                        back = (u(opt.hist) + u(nxt.backward_hist + nxt.backward_peak + grad[s + 1]
                                                + after[s + 1]) - u(grad[t]))
                        consider(cand, max(need, u(opt.hist + stages[s + 1].boundary), back),
                                 self.offload_code(s) + o)
                n_opts = len(st.options)
                for d, opt in enumerate(st.directs if s == t else ()):
                    need = u(opt.backward_peak + grad[s] + after[s]) - u(grad[t])
                    cand = np.full(self.M + 1, float(opt.recompute_time + st.backward_time))
                    consider(cand, need, n_opts + d)
                if s < t:
                    # Checkpoint moves, every s2 in s+1..t at once: run s..s2-1 keeping
                    # only the input of s2, solve s2..t, then s..s2-1 again.
                    ks = range(s, t)
                    need = np.maximum.accumulate(
                        [u(stages[k].nostore_peak + after[t] + (stages[k - 1].boundary if k > s else 0))
                         for k in ks])
                    cost = np.cumsum([stages[k].forward_time for k in ks])
                    _checkpoint_moves(self.table, s, t, need.astype(np.int64), cost,
                                      np.array([u(stages[k].boundary) for k in ks], dtype=np.int64),
                                      np.array([u(grad[k]) - u(grad[t]) for k in ks], dtype=np.int64),
                                      best, arg, self.checkpoint_code(s) + s + 1)
                self.table[s, t] = best
                self.opt[s, t], self.arg[s, t] = self.table[s, t], arg
            if deadline is not None and deadline.expired():
                raise OutOfTime(f"rotor: the dynamic program over {L} stages did not finish "
                                f"within the time limit")

    # Move codes at stage s: its options (0..), its direct runs, a checkpoint before
    # stage s2 (checkpoint_code + s2), its options offloaded (offload_code + option).

    def checkpoint_code(self, s: int) -> int:
        stage = self.chain.stages[s]
        return len(stage.options) + len(stage.directs)

    def offload_code(self, s: int) -> int:
        """Codes from here on are `offload_move`s of stage s (option = code - this)."""
        return self.checkpoint_code(s) + len(self.chain.stages) + 1

    def units(self, nbytes: int) -> int:
        return -(-int(nbytes) // self.unit)

    def shift(self, table: np.ndarray, d: int) -> np.ndarray:
        """out[m] = table[m - d] (inf below zero; beyond the table, its last entry). Two
        slices: the DP shifts one row per option and stage pair, and a gather with a
        clipped index and a mask cost 90 us a call, 30% of rotor's time on a 40-link chain."""
        size = self.M + 1
        out = np.empty_like(table)
        if d >= 0:
            d = min(d, size)
            out[:d] = np.inf
            out[d:] = table[:size - d]
        else:
            d = min(-d, size)
            out[:size - d] = table[d:]
            out[size - d:] = table[size - 1]
        return out

    def feasible(self, m: int) -> bool:
        return not self.short and bool(np.isfinite(self.opt[0, len(self.chain.stages) - 1][m]))

    def smallest(self) -> int | None:
        if self.short:
            return None
        finite = np.flatnonzero(np.isfinite(self.opt[0, len(self.chain.stages) - 1]))
        return int(finite[0]) if finite.size else None

    def operations(self, m: int) -> list[tuple]:
        """The plan as ("forward", stage, option|None) / ("backward", stage, option) steps,
        with ("offload", stage, option) after the forward of a stage offloaded; a direct
        backward's option is ("direct", index)."""
        ops: list[tuple] = []
        todo = [("solve", 0, len(self.chain.stages) - 1, m)]
        stages, u = self.chain.stages, self.units
        while todo:
            item = todo.pop()
            if item[0] != "solve":
                ops.append(item)
                continue
            _, s, t, m = item
            code = int(self.arg[s, t][m])
            n_opts = len(stages[s].options)
            if code >= self.offload_code(s):
                o = code - self.offload_code(s)
                then = [("forward", s, o), ("offload", s, o), ("solve", s + 1, t, m),
                        ("backward", s, o)]
            elif n_opts <= code < self.checkpoint_code(s):
                then = [("backward", s, ("direct", code - n_opts))]
            elif code < n_opts:
                opt = stages[s].options[code]
                then = [("forward", s, code)]
                if s < t:
                    freed = opt.input_freed // self.unit
                    then.append(("solve", s + 1, t, min(self.M, m - u(opt.hist) + freed)))
                then.append(("backward", s, code))
            else:
                s2 = code - self.checkpoint_code(s)
                then = [("forward", k, None) for k in range(s, s2)]
                then.append(("solve", s2, t, m - u(stages[s2 - 1].boundary)))
                then.append(("solve", s, s2 - 1, min(self.M, m - u(stages[s2 - 1].gradient)
                                                      + u(stages[t].gradient))))
            todo.extend(reversed(then))
        return ops


def sequence_of(chain: Chain, ops: list[tuple]) -> tuple[list[int], int, dict[int, tuple[int, int]]]:
    """(compute sequence, forward length, offloaded stages): for each stage an "offload"
    op names, the position in the sequence where its forward ends and where its
    backward (recomputations first) begins."""
    sequence: list[int] = []
    forward_length = None
    offloaded: dict[int, tuple[int, int]] = {}
    once = chain.tg.run_once   # pinned: their first run's results are kept
    ran: set[int] = set()
    for kind, s, o in ops:
        stage = chain.stages[s]
        if kind == "forward":
            sequence.extend(n for n in stage.segment.forward if n not in once or n not in ran)
            ran.update(stage.segment.forward)
        elif kind == "offload":
            offloaded[s] = (len(sequence), -1)
        else:
            if forward_length is None:
                sequence.extend(_outputs_left(chain.tg, ran))
                forward_length = len(sequence)
            if s in offloaded:
                offloaded[s] = (offloaded[s][0], len(sequence))
            option = stage.directs[o[1]] if isinstance(o, tuple) else stage.options[o]
            sequence.extend(n for n in option.steps if n not in once or n not in ran)
    return sequence, len(sequence) if forward_length is None else forward_length, offloaded


def _outputs_left(tg, ran: set[int]) -> list[int]:
    """The forward nodes, in forward order, that compute the graph's outputs no forward
    op ran, and what they read that none ran either. The last stage runs only in its
    backward op, which computes what the backward reads: a buffer written after the
    block (an EMA of features, `self.last.copy_(x.mean(0))`), which no backward node
    reads, was never computed, and rotor's plan was invalid (hunt80 F2: the default
    solver raised `InvalidSchedule` at every budget). Values the forward computed already
    live until these read them (frees follow the last use)."""
    forward = set(tg.forward)
    needed, stack = set(), [n for n in tg.output_nodes if n in forward and n not in ran]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(p for p in tg.node_inputs(n) if p in forward and p not in ran)
    ran.update(needed)
    return [n for n in tg.forward if n in needed]


def _schedule(chain: Chain, plan: _Tables, m: int) -> pb.Schedule:
    sequence, forward_length, _ = sequence_of(chain, plan.operations(m))
    return to_schedule(chain.tg, sequence, forward_length, name="rotor")


def chain_to_plan(graph: Graph, budget: int | None, name: str, progress
                  ) -> tuple[pb.Schedule, Chain | None]:
    """(store-everything, the chain to plan): no chain when store-everything fits the
    budget (it is then the plan, named `name`). Where rotor and pofo start."""
    everything = store_all(graph)
    if budget is None or everything.predicted_peak_bytes <= budget:
        everything.name = name
        return everything, None
    chain = chain_of(graph)
    progress(f"{name}: {len(chain.stages)} segments, "
             f"{sum(len(s.options) for s in chain.stages)} options")
    return everything, chain


#: Chains of the graphs planned last, by the graph's fingerprint with its costs: a chain
#: depends on the graph alone, not on the budget, and the offload ladder (`offload.py`)
#: plans one graph at a dozen budgets; building the chain (a memory walk per option) was
#: 1.0 s of rotor's 2.2 s on the tiny U-Net.
_CHAINS: OrderedDict[str, Chain] = OrderedDict()
CHAINS_KEPT = 4


def chain_of(graph: Graph) -> Chain:
    """Rotor's chain of `graph`, built once per graph content (`_CHAINS`). A chain found
    there is handed out as a copy bound to a training graph of `graph` itself: the graph
    it was built from may have changed since (a caller profiling it again)."""
    key = structure_fingerprint(graph, costs=True)
    built = _CHAINS.pop(key, None)
    if built is None:
        built = chain = Chain(TrainingGraph(graph))
    else:
        chain = copy.copy(built)
        chain.tg = TrainingGraph(graph)
    _CHAINS[key] = built
    while len(_CHAINS) > CHAINS_KEPT:
        _CHAINS.popitem(last=False)
    return chain


def rotor(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
          progress=quiet) -> pb.Schedule:
    """Chain dynamic program over the segments between articulation points. The program
    grows with the cube of the chain's length (seconds for 100 stages); `time_limit_s`
    stops the re-plans, the fastest plan within the budget so far winning, and raises
    `OutOfTime` if none was found."""
    everything, chain = chain_to_plan(graph, budget, "rotor", progress)
    if chain is None:
        return everything
    deadline = Deadline(time_limit_s)
    try:
        plan = _within_or_least(chain, everything, budget, deadline, progress)
    except OutOfTime as late:
        raise OutOfTime(f"{late} of {time_limit_s} s and found no plan within the budget; "
                        f"give it more time (time_limit_s; --time-limit on the command line)") from None
    if plan.predicted_peak_bytes <= budget:
        return plan
    plan = _below_least(chain, plan, deadline, progress)
    raise InfeasibleBudget(budget, plan.predicted_peak_bytes, " (by rotor)", schedule=plan)


#: Rounds of `_below_least`.
BELOW_LEAST_ROUNDS = 3


def _below_least(chain: Chain, least: pb.Schedule, deadline: Deadline, progress) -> pb.Schedule:
    """The plan a refusal names: below the least-memory plan where the program, fitted
    to the simulator just under that plan's peak, finds one that peaks lower. The least
    plan of the program's memory model need not be the least in the simulator (GPT-2 4
    layers: the least-memory plan peaks at 32.8% of store-everything, a plan fitted to
    30% at 29.3%), and a refusal names a budget that is then feasible, so the lowest
    found is named."""
    for _ in range(BELOW_LEAST_ROUNDS):
        target = least.predicted_peak_bytes - 1
        if chain.least_need > target or deadline.expired():
            break
        found = _fit_memory_model(chain, target, progress, deadline)
        if found is None:
            break
        least = found
    return least


#: `plan_near_floor` gives up where the chain's least need, or a round of the least-memory
#: search, is over this many times the budget: the program's memory model is cautious by
#: under 1% there (the 32-layer Llama's least-memory plan peaks at 13.47% of the
#: store-everything peak, its program's floor is 13.56%), and GPT-2 12 layers' program
#: needs 28% at hiremate's 25.9% floor.
FLOOR_SLACK = 1.05


def plan_near_floor(tg: TrainingGraph, everything: pb.Schedule, budget: int, deadline: Deadline,
                    progress) -> pb.Schedule | None:
    """For hiremate near the smallest budget (over `everything`'s peak): rotor's plan within
    `budget`, or None when the chain cannot come near it (least need over `FLOOR_SLACK`
    times the budget: known in a second, before any table) or nothing is found before
    `deadline`. Takes hiremate's training graph and store-everything plan."""
    chain = Chain(tg)
    if chain.least_need > FLOOR_SLACK * budget:
        progress(f"rotor: its chain needs {chain.least_need} bytes, over the budget")
        return None
    try:
        plan = _within_or_least(chain, everything, budget, deadline, progress,
                                enough=int(FLOOR_SLACK * budget))
    except OutOfTime:
        return None
    return plan if plan.predicted_peak_bytes <= budget else None


def _within_or_least(chain: Chain, everything: pb.Schedule, budget: int, deadline: Deadline,
                     progress, enough: int | None = None) -> pb.Schedule:
    """The fastest plan within `budget`, else the least-memory plan (which may still fit:
    the program's memory model is cautious; `_least_memory`'s `enough`). No fitting is
    tried where the chain's least need is over the budget."""
    best = _fit_memory_model(chain, budget, progress, deadline) if chain.least_need <= budget else None
    return best if best is not None else _least_memory(chain, everything, progress, deadline, enough)


def _fit_memory_model(chain: Chain, budget: int, progress,
                      deadline: Deadline | None = None) -> pb.Schedule | None:
    """The fastest plan within `budget`, the DP's memory target fitted to the simulator
    (the plans made before `deadline`)."""
    unit = max(1, math.ceil(max(0, budget - chain.pinned_bytes) / SLOTS))

    def plan_at(target: int) -> pb.Schedule | None:
        try:
            plan = _Tables(chain, target, progress, deadline=deadline)
        except OutOfTime:
            return None
        return _schedule(chain, plan, plan.M) if plan.feasible(plan.M) else None

    return fit_to_budget(plan_at, budget, step=unit, replans=REPLANS, progress=progress,
                         label="rotor", deadline=deadline)


#: Rounds of `_least_memory`: each solves the DP again with the capacity its last round
#: found, so slots shrink with it (from 1/400 of the store-everything peak, to within a
#: few 1/400 of the floor).
LEAST_MEMORY_ROUNDS = 3


def _least_memory(chain: Chain, everything: pb.Schedule, progress,
                  deadline: Deadline | None = None, enough: int | None = None) -> pb.Schedule:
    """The plan the DP finds for the least memory it allows (store-everything if none),
    with its memory counted in ever finer slots: near the floor a slot of 1/400 of the
    store-everything peak is a few percent of the budget. The first round is at twice
    the chain's least need (one round at the store-everything peak more if that fails).
    With `enough` bytes (a plan above them is not wanted), the search starts there and
    stops when a round's floor is above them."""
    frugal, peak = everything, everything.predicted_peak_bytes
    capacity = min(peak, 2 * chain.least_need if enough is None else enough)
    for round_ in range(LEAST_MEMORY_ROUNDS + 1):
        try:
            plan = _Tables(chain, capacity, progress, deadline=deadline)
        except OutOfTime:
            if frugal is everything:
                raise
            break
        m = plan.smallest()
        if m is None:
            if round_ or capacity == peak or enough is not None:
                break
            capacity = peak          # nothing within twice the least need: from the top
            continue
        found = _schedule(chain, plan, m)
        if found.predicted_peak_bytes < frugal.predicted_peak_bytes:
            frugal = found
        smaller = chain.pinned_bytes + m * plan.unit
        if smaller >= capacity or (enough is not None and smaller > enough):
            break
        capacity = smaller
    return frugal
