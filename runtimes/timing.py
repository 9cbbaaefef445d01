"""Timing a whole step op by op, in the order and context the runtime runs it.

Why not time each op alone: on CPU an op timed by itself (`profiling`'s isolated
runs) costs what it costs with a fresh output allocation, warm inputs and nothing
around it. Inside a step the same op costs differently, and not by a constant
factor: GPT-2's elementwise ops (`mul`, `add`, `pow`, `log_softmax`) cost about
twice as much alone as in the step, its matrix products about the same. A plan
priced on isolated times overrates recomputing cheap elementwise chains, which
is what rematerialization recomputes most.

So `time_schedule` runs a schedule's generated segments, as the runtime does
(same code, same order, same frees), with a `Timeline` tick after every compute
step, for a few steps after a warm-up, on the model's own tensors (parameters,
buffers, the example inputs; constants as the graph holds them). Not on synthetic
ones: GPT-2 with standard-normal weights computes gradients small enough to be
subnormal, and a CPU matrix product on subnormal floats is 200x slower (290 ms
instead of 1.5 ms for 1024x128 by 128x2048), which put GPT-2's matrix products at
7x their real time in the step. Each compute step gets
the median over those steps of the time since the previous tick; what is not
inside an op (segment entry, handing the saved tensors over, returning) is the
step's `overhead_s`. On CUDA the ticks are events, so an op's time is when the
GPU finished it after the previous one (launch gaps included), and nothing
synchronizes between ops.

On CUDA each tick also notes the host's clock, which splits every op's time into
the host's part and the GPU's (`split_timelines`): the host issued op k between
ticks k-1 and k (host seconds: that gap, less what a tick itself costs the host),
and the GPU ran it from when it was issued, or from when the GPU finished op k-1 if
later, to when tick k's event completed (device seconds). Why: the GPU runs kernels
asynchronously, and a small model's step is bound by the host issuing them (the
quick GPT-2 on an H100: a 12.6 ms step, the GPU busy about 3 ms of it). An op's
time in the step is then its host time where the GPU waits for the host and its GPU
time where the host waits for the GPU; a recomputation moved from one stretch to
the other costs the other. With both parts the simulator runs both timelines
(`CostModel.two_timelines`, docs/schedules.md).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from remat_ir.ir import Graph, pb
from remat_ir.torchlib.generators import generators_kept
from remat_ir.torchlib.types import constant_tensor, empty_tensor

from .codegen import generate, region_tick, segments_without_autocast

#: Timed rounds after the warm-up, and the wall-clock seconds after which no further
#: round starts (at least two are always timed). Ten rounds: with five, the footprint
#: price calibrated on GPT-2 (`calibration.py`) varied 2x between lowerings.
STEPS = 10
MAX_SECONDS = 20.0


@dataclass
class ScheduleTiming:
    """What one schedule measured, step by step (medians over `steps` timed steps)."""
    #: (node id, seconds) per compute step, in schedule order.
    occurrences: list[tuple[int, float]]
    #: Per step, the time outside ops: segment entry and exit, the stash, tangents.
    overhead_s: float
    #: The whole step (forward segment + backward segment).
    step_s: float
    steps: int
    #: Each timed round's whole step, in round order. Schedules timed together interleave
    #: their rounds, so the k-th entries of their timings ran side by side.
    round_s: list[float] = field(default_factory=list)
    #: On the inductor backend, the node ids of each compiled region, by region index.
    regions: list[list[int]] = field(default_factory=list)
    #: On CUDA, (node id or region mark, host seconds, device seconds) per compute step,
    #: in schedule order (`split_timelines`, medians over the timed steps); empty elsewhere.
    host_device: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def robust_step_s(self) -> float:
        """The step as the sum of its ops' medians plus the overhead: steadier than the
        median step, since a pause inside one step spoils one op's sample, not the step's."""
        return self.overhead_s + sum(seconds for _, seconds in self.occurrences)

    def node_seconds(self) -> dict[int, float]:
        """Seconds per node timed by itself: the mean over its occurrences in the timed
        schedule (compiled regions, which tick as a whole, are not nodes)."""
        total: dict[int, list[float]] = {}
        for node, seconds in self.occurrences:
            if node >= 0:
                total.setdefault(node, []).append(seconds)
        return {node: sum(times) / len(times) for node, times in total.items()}

    def node_host_device(self) -> dict[int, tuple[float, float]]:
        """On CUDA, (host seconds, device seconds) per node timed by itself: the means over
        its occurrences, as `node_seconds`; empty elsewhere."""
        total: dict[int, list[tuple[float, float]]] = {}
        for node, host, device in self.host_device:
            if node >= 0:
                total.setdefault(node, []).append((host, device))
        return {node: (statistics.fmean(h for h, _ in pairs), statistics.fmean(d for _, d in pairs))
                for node, pairs in total.items()}

    def region_seconds(self) -> dict[int, float]:
        """Seconds per compiled region (by index in the plan's `regions`), where the step
        ran on the inductor backend."""
        return {region_tick(mark): seconds for mark, seconds in self.occurrences if mark <= -2}

    def region_host_device(self) -> tuple[dict[int, float], dict[int, float]]:
        """On CUDA and the inductor backend, each compiled region's host seconds and its
        device seconds (by region index), as `region_seconds` has its time."""
        marks = [(region_tick(mark), host, device) for mark, host, device in self.host_device if mark <= -2]
        return {i: host for i, host, _ in marks}, {i: device for i, _, device in marks}


class Timeline:
    """Marks (node id, when) as a step runs; `tick` is what generated code calls. On CUDA
    "when" is an event, and the host's clock is noted beside it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[int, object]] = []
        self.host_marks: list[float] = []

    def tick(self, node_id: int) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((node_id, event))
            self.host_marks.append(time.perf_counter())
        else:
            self.marks.append((node_id, time.perf_counter()))

    def clear(self) -> None:
        self.marks.clear()
        self.host_marks.clear()

    def host_device(self, tick_s: float) -> list[tuple[int, float, float]]:
        """On CUDA, `split_timelines` of this step's marks (events completed: call after
        synchronizing), `tick_s` being what one tick costs the host."""
        first_event, first_host = self.marks[0][1], self.host_marks[0]
        marks = [(self.marks[0][0], 0.0, 0.0)]
        marks += [(node, host - first_host, first_event.elapsed_time(event) / 1e3)
                  for (node, event), host in zip(self.marks[1:], self.host_marks[1:])]
        return split_timelines(marks, tick_s)

    @staticmethod
    def host_seconds_per_tick(device: torch.device, ticks: int = 200) -> float:
        """The host's seconds per tick on `device` (the median of five batches): what the
        timing itself adds to each op's host time. 0 off CUDA (not used there)."""
        if device.type != "cuda":
            return 0.0
        probe, batches = Timeline(device), []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(ticks):
                probe.tick(0)
            batches.append((time.perf_counter() - started) / ticks)
            probe.clear()
        torch.cuda.synchronize(device)
        return statistics.median(batches)

    def op_seconds(self) -> list[tuple[int, float]]:
        """(mark, seconds since the previous mark) for each compute or region mark (a node
        id, or `codegen.region_tick` of a compiled region; segment entry marks, -1, only
        open a segment: what precedes them is overhead)."""
        out = []
        for (_, before), (node, after) in zip(self.marks, self.marks[1:]):
            if node != -1:
                out.append((node, before.elapsed_time(after) / 1e3 if self.cuda else after - before))
        return out


def split_timelines(marks: list[tuple[int, float, float]], tick_s: float = 0.0
                    ) -> list[tuple[int, float, float]]:
    """(mark, host seconds, device seconds) for each compute or region mark of one step,
    from its marks (mark, host clock, device clock), both clocks in seconds from the
    first mark, which the device reached when the host made it (the step starts on an
    idle device). The k-th op was issued by the host between marks k-1 and k, so its
    host time is that gap less `tick_s` (a mark's own cost to the host); the device ran
    it from max(when it was issued, when the device finished the previous mark) to
    mark k: its device time. These are the costs for which two timelines (host issuing,
    device running each op once issued and free) replay the marks as they were
    measured, up to the marks' own host cost. Segment entry marks (-1) carry no op:
    what precedes them is the step's overhead."""
    out = []
    for (_, host_before, device_before), (mark, host, device) in zip(marks, marks[1:]):
        if mark == -1:
            continue
        out.append((mark, max(0.0, host - host_before - tick_s),
                    max(0.0, device - max(device_before, host))))
    return out


def _resident(graph: Graph, value_ids: list[int], values: Mapping[int, torch.Tensor],
              device: torch.device) -> tuple[torch.Tensor, ...]:
    """The resident tensors in `value_ids` order: constants from the graph, the rest from
    `values`; a tensor a node mutates in place is copied first (timing never changes
    the model)."""
    mutated = {v for node in graph.proto.nodes if node.mutating for v in node.inputs}
    out = []
    for v in value_ids:
        value = graph.value(v)
        if value.kind == pb.CONSTANT:
            out.append(constant_tensor(value, device))
            continue
        if v not in values:
            raise KeyError(f"no tensor for {value.name!r} (value {v}) to time the step with")
        t = values[v].detach()
        out.append(t.clone() if v in mutated else t)
    return tuple(out)


def _output_gradient(value: pb.Value, device: torch.device) -> torch.Tensor:
    """A gradient for a user output (ones: the loss's own gradient)."""
    return empty_tensor(value, device).fill_(1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Step:
    """One schedule's generated segments, wired to its resident tensors, timed per step."""

    def __init__(self, graph: Graph, schedule: pb.Schedule, values: Mapping[int, torch.Tensor],
                 device: torch.device, backend: str = "eager", ticks: bool = True):
        self.device = device
        self.timeline = Timeline(device)
        # One gradient group, as a single-process step runs (`ScheduledModule`): on the
        # inductor backend each group's yield is a Python line that cuts a region, so
        # timing with DDP's 16 groups timed the quick CNN's store-everything backward in
        # 20 regions where training runs 16.
        self.forward, self.backward, plan = generate(graph, schedule, device,
                                                     tick=self.timeline.tick if ticks else None,
                                                     backend=backend, gradient_groups=1)
        self.regions = [list(region.node_ids) for region in plan.regions]
        self.resident = _resident(graph, plan.resident, values, device)
        position = {v: i for i, v in enumerate(plan.user_outputs)}
        self.read = [position[v] for v in plan.forward_outputs_read_in_backward]
        self.tangents = [_output_gradient(graph.value(t), device) if t is not None
                         else torch.zeros((), device=device) for t in plan.tangents]
        self.runs: list[tuple[list[tuple[int, float]], float]] = []
        self.tick_s = Timeline.host_seconds_per_tick(device)
        self.host_device: list[list[tuple[int, float, float]]] = []

    def run(self, timed: bool) -> None:
        self.timeline.clear()
        _synchronize(self.device)
        started = time.perf_counter()
        outputs, _, saved = self.forward(self.resident)
        for _ in self.backward(self.resident, saved, [outputs[i] for i in self.read], self.tangents):
            pass  # each group of gradients, dropped
        del outputs, saved
        _synchronize(self.device)
        wall = time.perf_counter() - started
        if timed:
            self.runs.append((self.timeline.op_seconds(), wall))
            if self.timeline.cuda:
                self.host_device.append(self.timeline.host_device(self.tick_s))

    def timing(self) -> ScheduleTiming:
        runs = self.runs
        occurrences = [(node, statistics.median(run[i][1] for run, _ in runs))
                       for i, (node, _) in enumerate(runs[0][0])]
        step_s = statistics.median(wall for _, wall in runs)
        overhead = statistics.median(wall - sum(s for _, s in run) for run, wall in runs)
        host_device = [(node, statistics.median(run[i][1] for run in self.host_device),
                        statistics.median(run[i][2] for run in self.host_device))
                       for i, (node, _, _) in enumerate(self.host_device[0])] if self.host_device else []
        return ScheduleTiming(occurrences, max(0.0, overhead), step_s, len(runs),
                              [wall for _, wall in runs], self.regions, host_device)


def segments_step(graph: Graph, schedule: pb.Schedule, values: Mapping[int, torch.Tensor],
                  device: torch.device | str) -> Callable[[], float]:
    """A function running one step of `schedule`'s generated segments alone, as a
    training step runs them but without ticks, autograd or the runtime's per-call checks,
    and returning its wall seconds: what a `ScheduledModule` step costs beyond it is the
    runtime's per-call overhead, compared separately by `benchmarks/torch_overhead.py`
    (the time model measures it within the same calls: `call_overhead.py`). The caller's
    RNG state is not restored."""
    step = _Step(graph, schedule, values, torch.device(device), ticks=False)

    def run() -> float:
        with torch.no_grad(), segments_without_autocast(step.device):
            started = time.perf_counter()
            step.run(timed=False)
            return time.perf_counter() - started
    return run


def ratio_interval(times: list[float], reference: list[float], per_round: int = 1, level: float = 0.95,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The `level` interval of median(times) / median(reference) when rounds are resampled
    (with replacement, `draws` times; the same seed gives the same interval).

    Why: on a shared CPU one schedule's step moves by 10-20% from step to step and by
    5-10% between the halves of one run (the quick GPT-2, 2 cores), so one ratio of two
    medians can be several percent off. Rounds are drawn whole, a schedule's and its
    reference's steps of one round together, so that what hit both in that round stays
    paired: drift of the machine's speed between rounds cancels, noise within a round
    widens the interval. Both lists hold `per_round` steps per round, in round order."""
    import numpy as np

    a = np.asarray(times, dtype=float).reshape(-1, per_round)
    b = np.asarray(reference, dtype=float).reshape(-1, per_round)
    rounds = min(len(a), len(b))
    picks = np.random.default_rng(seed).integers(0, rounds, size=(draws, rounds))
    ratios = (np.median(a[picks].reshape(draws, -1), axis=1)
              / np.median(b[picks].reshape(draws, -1), axis=1))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def time_schedules(graph: Graph, schedules: list[pb.Schedule], values: Mapping[int, torch.Tensor],
                   device: torch.device | str, *, steps: int = STEPS,
                   max_seconds: float = MAX_SECONDS, backend: str = "eager",
                   progress: Callable[[str], None] | None = None) -> list[ScheduleTiming]:
    """Time each of `schedules` of `graph` on `device` (see the module docstring), reading
    the resident tensors from `values` (value id -> tensor: parameters, buffers, user
    inputs). Rounds interleave the schedules, so that drift in the machine's speed hits
    all alike; in a round each runs one untimed step, then a timed one, so that its timed
    step starts from its own allocator state. After a warm-up round, up to `steps` rounds
    (at least two; no new round after `max_seconds`). Raises what running raises (out of
    memory among others); the caller's RNG state is restored. `progress` hears of each
    round. `backend="inductor"` runs compiled regions (the warm-up round compiles them),
    each timed as a whole (`ScheduleTiming.region_seconds`)."""
    device = torch.device(device)
    names = " and ".join(s.name or "a schedule" for s in schedules)
    prepared = [_Step(graph, schedule, values, device, backend) for schedule in schedules]
    devices = [device] if device.type == "cuda" else []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(generators_kept(devices))
        stack.enter_context(torch.no_grad())
        stack.enter_context(segments_without_autocast(device))
        for step in prepared:
            step.run(timed=False)
        started = time.perf_counter()  # the warm-up (compiling, on the inductor backend) is not timing
        for k in range(steps):
            if k >= 2 and time.perf_counter() - started > max_seconds:
                break
            for step in prepared:
                step.run(timed=False)
                step.run(timed=True)
            if progress is not None:
                progress(f"timing {names} op by op: round {k + 1} of at most {steps}")
    return [step.timing() for step in prepared]


def time_schedule(graph: Graph, schedule: pb.Schedule, values: Mapping[int, torch.Tensor],
                  device: torch.device | str, **limits) -> ScheduleTiming:
    """`time_schedules` for one schedule."""
    return time_schedules(graph, [schedule], values, device, **limits)[0]
