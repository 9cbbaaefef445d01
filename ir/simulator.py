"""The simulator: the single definition of what a schedule does to memory and time.

Every solver's output goes through `simulate` before anyone uses it, and the
runtime's measured peak is compared with its prediction. The rules (docs/schedules.md
explains them with an example):

- Graph inputs (user inputs, parameters, buffers) and constants are resident:
  always available, never computed or freed, and counted apart
  (`resident_bytes`). Output gradients fed to backward (GRADIENT inputs) are
  available only from `backward_start` on.
- A compute step needs every input live; its outputs become live. Computing a
  node again is a recomputation; a node flagged mutating or non-recomputable
  may run only once, a random one more than once only if the schedule
  replays RNG state (`rng_replay`).
- Memory follows the memory model (`memory.py`: allocations per storage,
  views, workspace, recomputed outputs). The peak is the maximum of the
  bytes live during any step; it is what the budget bounds.
- Random nodes follow `rng.plan_rng`: a run out of graph order first skips the
  random nodes eager would have run before it, each costing its time and, while
  it runs, its placeholders, outputs and workspace on top of the live bytes;
  only nodes flagged `rng_shape_only` can be skipped. A replaying run holds the
  generator's state beside its outputs for a moment (`Provenance.rng_replay_bytes`).
- A free step drops a live value; resident values are never freed, nor are graph
  outputs unless a copy of them is on the host (they must be prefetched before the
  end).
- Transfers (the graph's `Provenance.host_link`): an **offload** starts copying a
  live value's storage to host memory; the device copy stays live and counted
  until a later **free** of it, which waits for the copy to complete. The host
  copy counts against the host budget (`Schedule.host_budget_bytes`) from the
  offload until its **prefetch**, which allocates the value on the device again
  at once and starts copying it back; the first step that reads it (or frees it)
  waits for that copy. A value whose offload has not been freed yet cannot be
  computed again. A transfer of b bytes takes `latency_s + b / bandwidth`;
  transfers queue in schedule order on one channel per direction (PCIe is full
  duplex), beside compute when the link is `overlapped` (CUDA copy streams: a
  transfer starts once compute has reached its step and its channel is free), on
  the compute timeline otherwise (a CPU copy). Starting a transfer and waiting for it
  costs the compute timeline the link's `issue_s` either way (the host's work). Without
  a described link transfers take no time.
- At `backward_start` the forward outputs (user outputs, buffer updates) must
  be live (the caller gets them once any prefetch of them has ended); the other
  live values are what the step saves for backward; the buffers the forward
  updated that backward reads are copied there and held to the end
  (`memory.snapshot_buffers`), as are the output gradients' seeds the caller's
  backward makes (`memory.gradient_seed_bytes`). The buffer updates no later step
  reads are freed there: the runtime copies them in as the forward ends and drops
  them. At the end every other graph output must be live.
- A step's time is the end of its compute timeline: compute steps' `cost.time_s`
  (skipped random runs included) one after another, with waits for transfers
  (`stall_s`), plus the graph's per-step overhead outside ops
  (`Provenance.cost_model.step_overhead_s`, the segments', and `call_overhead_s`, the
  runtime's per training call), plus `cost_model.peak_byte_s` x the
  schedule's peak (holding more memory makes every op slower; all three are 0 for
  hand-made costs; `runtimes/calibration.py` and `runtimes/call_overhead.py` say how
  they are measured).
- With `cost_model.two_timelines` (a GPU, whose kernels run asynchronously to the host
  that issues them) the compute timeline is the device's, and a host timeline runs
  beside it: a node (or skipped random run) takes `cost.host_s` of the host's time to
  issue, then runs for `cost.device_s` on the device once issued and once the device
  has finished what came before; starting a transfer (`issue_s`) is host time, and a
  copy starts once the device has reached its step. Waits for transfers are the
  device's (stream waits). The step ends when both timelines have, plus the overhead
  and footprint terms. So a recomputation in a stretch the host bounds costs its host
  time, the device's time hiding in the device's idle gaps (`runtimes/timing.py`
  measures both).
The first rule broken stops the simulation and is reported as a `Violation`
naming the step, the node and the value.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from . import remat_ir_pb2 as pb
from .errors import InvalidSchedule
from .graph import FORWARD_OUTPUT_ROLES, Graph
from .memory import Allocations, gradient_inputs, gradient_seed_bytes, snapshot_buffers
from .rng import plan_rng, skip_bytes


@dataclass(frozen=True)
class Violation:
    """The first rule a schedule breaks: where (step, node, value) and what."""
    step: int
    kind: str
    message: str
    node_id: int | None = None
    value_id: int | None = None

    def __str__(self) -> str:
        return f"step {self.step}: {self.message}"


@dataclass
class SimulationResult:
    """What a schedule does: peak and time, memory step by step, or where it breaks."""
    violation: Violation | None
    peak_bytes: int = 0
    peak_step: int = -1
    forward_time_s: float = 0.0
    backward_time_s: float = 0.0
    #: Per step, time outside every op: the segments' (`cost_model.step_overhead_s`) and
    #: the runtime's per call (`cost_model.call_overhead_s`).
    overhead_time_s: float = 0.0
    #: Per step, the cost of the memory the schedule holds: `cost_model.peak_byte_s` x peak.
    footprint_time_s: float = 0.0
    #: Activation bytes live after each step (excluding resident bytes).
    memory_after: list[int] = field(default_factory=list)
    #: Activation bytes while each step runs (what the peak is taken over).
    memory_during: list[int] = field(default_factory=list)
    #: When compute reaches each step, in seconds from the start of the step (before any
    #: wait for a transfer): where solvers place transfers.
    start_s: list[float] = field(default_factory=list)
    #: Values live at the end of forward that backward needs (not outputs).
    saved_value_ids: list[int] = field(default_factory=list)
    saved_bytes: int = 0
    #: Bytes of the buffers copied at the end of forward and held to the end of the step
    #: (`memory.snapshot_buffers`), included in `memory_after` from there.
    snapshot_bytes: int = 0
    #: Bytes of the output gradients' seeds, made when the backward starts and held to the
    #: end of the step (`memory.gradient_seed_bytes`), included in `memory_after` from there.
    seed_bytes: int = 0
    resident_bytes: int = 0
    #: How many times each node was computed.
    compute_counts: Counter = field(default_factory=Counter)
    #: Seconds compute waited for transfers (included in the forward and backward times).
    stall_s: float = 0.0
    #: Seconds the host link was busy, and the bytes it moved (offloads and prefetches).
    transfer_s: float = 0.0
    transferred_bytes: int = 0
    #: Most bytes of offloaded copies held in host memory at once.
    host_peak_bytes: int = 0
    #: With two timelines: the seconds the host spent issuing nodes and transfers, and the
    #: seconds the device spent running nodes (0 with one timeline). Their ratio says
    #: which one bounds the step.
    host_busy_s: float = 0.0
    device_busy_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.violation is None

    @property
    def total_time_s(self) -> float:
        return self.forward_time_s + self.backward_time_s + self.overhead_time_s + self.footprint_time_s

    @property
    def recomputations(self) -> int:
        """Compute steps beyond the first of each node."""
        return sum(c - 1 for c in self.compute_counts.values())


def transfer_seconds(link: pb.HostLink, nbytes: int) -> float:
    """One copy of `nbytes` over the host link: latency + bytes / bandwidth (no time
    without a described link)."""
    if link.bandwidth_bytes_per_s <= 0:
        return 0.0
    return link.latency_s + nbytes / link.bandwidth_bytes_per_s


class _Run:
    """One simulation: walks the steps, stops at the first violation."""

    def __init__(self, graph: Graph, schedule: pb.Schedule, budget: int | None):
        self.g = graph
        self.schedule = schedule
        self.budget = budget
        self.mem = Allocations(graph)
        self.host_budget = (schedule.host_budget_bytes if schedule.HasField("host_budget_bytes")
                            else None)
        self.link = graph.proto.provenance.host_link
        self.clock = 0.0                      # when compute reaches the current step
        #: With two timelines, when the host has issued everything so far (else unused).
        self.two_timelines = graph.proto.provenance.cost_model.two_timelines
        self.issued = 0.0
        self.channels = {"offload": 0.0, "prefetch": 0.0}  # when each direction is free again
        self.host: dict[int, int] = {}        # value -> bytes of its copy in host memory
        self.host_bytes = 0
        self.offloading: dict[int, float] = {}  # value -> end of its offload (device copy live)
        self.arriving: dict[int, float] = {}    # value -> end of its prefetch, not waited for yet
        self.released: set[int] = set()   # buffer updates freed as the backward starts
        self.gradient_inputs = gradient_inputs(graph)
        self.result = SimulationResult(
            violation=None, resident_bytes=graph.resident_bytes(),
            overhead_time_s=(graph.proto.provenance.cost_model.step_overhead_s
                             + graph.proto.provenance.cost_model.call_overhead_s))
        self.rng = plan_rng(graph, schedule)
        self.skip_during = 0
        self.structure = self.mem.structure
        self.resident = graph.resident_value_ids

    def fail(self, step: int, kind: str, message: str, node_id=None, value_id=None) -> SimulationResult:
        self.result.violation = Violation(step, kind, message, node_id, value_id)
        return self.result

    def wait(self, until: float) -> None:
        """Compute waits for a transfer that ends at `until` (with two timelines the device
        does, and the stall is only what the wait adds to waiting for the host)."""
        ready = max(self.clock, self.issued) if self.two_timelines else self.clock
        if until > ready:
            self.result.stall_s += until - ready
        self.clock = max(self.clock, until)

    def transfer(self, value_id: int, direction: str) -> float:
        """Queue a copy of the value's storage on the host link's channel for `direction`
        ("offload": device to host, "prefetch": back); return when it ends."""
        size = self.g.storage_bytes(self.g.value(value_id).storage_id)
        seconds = transfer_seconds(self.link, size)
        self.result.transfer_s += seconds
        self.result.transferred_bytes += size
        if self.two_timelines:
            self.issued += self.link.issue_s  # the host's work; the copy waits for the device
            reached = max(self.clock, self.issued)
        else:
            self.clock += self.link.issue_s  # the host starting it, on the compute timeline
            reached = self.clock
        if not self.link.overlapped:
            self.clock = reached + seconds
            return self.clock
        self.channels[direction] = max(self.channels[direction], reached) + seconds
        return self.channels[direction]

    def run_node(self, cost: pb.Cost) -> None:
        """Advance the timelines by one run of a node (see the module docstring)."""
        if self.two_timelines:
            self.issued += cost.host_s
            self.clock = max(self.clock, self.issued) + cost.device_s
            self.result.device_busy_s += cost.device_s
        else:
            self.clock += cost.time_s

    def run(self) -> SimulationResult:
        steps = self.schedule.steps
        if self.schedule.backward_start > len(steps):
            return self.fail(len(steps), "bad_step", f"backward starts at step "
                             f"{self.schedule.backward_start} but there are only {len(steps)} steps")
        bs = self.schedule.backward_start
        for k, step in enumerate(steps):
            self.skip_during = 0
            if k == bs:
                if v := self.end_of_forward(k):
                    return v
                if v := self.skips(k, self.rng.forward_end):
                    return v
                self.result.forward_time_s = self.clock
            if v := self.skips(k, self.rng.skips.get(k, ())):
                return v
            if v := self.execute(k, step):
                return v
        self.skip_during = 0
        if bs == len(steps):
            if v := self.end_of_forward(len(steps)):
                return v
            if v := self.skips(len(steps), self.rng.forward_end):
                return v
            self.result.forward_time_s = self.clock
        if v := self.skips(len(steps), self.rng.step_end):
            return v
        if self.skip_during > self.result.peak_bytes:  # after the last step: no record follows
            self.result.peak_bytes = self.skip_during
            if self.budget is not None and self.skip_during > self.budget:
                return self.fail(len(steps), "budget_exceeded", f"RNG skips after the last step "
                                 f"reach {self.skip_during} bytes, over the budget of {self.budget} bytes")
        missing = [o for o in self.g.proto.outputs if o.value_id not in self.mem.live
                   and o.value_id not in self.g.resident_value_ids and o.value_id not in self.released]
        if missing:
            o = missing[0]
            return self.fail(len(steps), "output_missing",
                             f"graph output {o.name or pb.OutputRole.Name(o.role).lower()} "
                             f"({self.g.describe_value(o.value_id)}) is not live at the end",
                             value_id=o.value_id)
        self.result.backward_time_s = max(self.clock, self.issued) - self.result.forward_time_s
        self.result.host_busy_s = self.issued
        self.result.footprint_time_s = (self.g.proto.provenance.cost_model.peak_byte_s
                                        * self.result.peak_bytes)
        return self.result

    def end_of_forward(self, k: int) -> SimulationResult | None:
        forward_outputs = {o.value_id for o in self.g.proto.outputs if o.role in FORWARD_OUTPUT_ROLES}
        for v in sorted(forward_outputs - set(self.mem.live) - self.g.resident_value_ids):
            return self.fail(k, "output_missing", f"forward output {self.g.describe_value(v)} "
                             "is not live when backward starts", value_id=v)
        for v in sorted(forward_outputs & set(self.arriving)):
            self.wait(self.arriving.pop(v))
        saved = sorted(set(self.mem.live) - forward_outputs)
        self.result.saved_value_ids = saved
        self.result.saved_bytes = self.mem.held_bytes(saved)
        storages = {self.g.value(v).storage_id for v in snapshot_buffers(self.g, self.schedule)}
        self.result.snapshot_bytes = sum(self.g.storage_bytes(s) for s in storages)
        self.mem.hold(self.result.snapshot_bytes)
        self.result.seed_bytes = gradient_seed_bytes(self.g)
        self.mem.hold(self.result.seed_bytes)
        # The runtime copies the buffer updates in as the forward ends and drops them then:
        # those no backward step reads are freed there (held to the step's end, a written
        # `nn.Embedding(max_norm=...)` table was counted through the whole backward).
        for v in sorted(self.released_updates(k)):
            self.mem.drop(v)
            self.released.add(v)
        return None

    def released_updates(self, k: int) -> set[int]:
        """The buffer updates (`BUFFER_UPDATE` values, no other output's) that no step from
        `k` on reads: freed as the backward starts at step `k`."""
        candidates = self.g.derived.get("released_update_candidates")
        if candidates is None:   # asked at every simulation: most graphs have none
            outputs = self.g.proto.outputs
            candidates = self.g.derived["released_update_candidates"] = frozenset(
                {o.value_id for o in outputs if o.role == pb.BUFFER_UPDATE}
                - {o.value_id for o in outputs if o.role != pb.BUFFER_UPDATE})
        if not candidates:
            return set()
        updates = set(candidates)
        nodes = self.g.nodes
        for step in self.schedule.steps[k:]:
            if step.HasField("compute") and step.compute in nodes:   # else `execute` refuses it
                updates.difference_update(nodes[step.compute].inputs)
        return (updates & set(self.mem.live)) - set(self.host) - set(self.offloading)

    def skips(self, k: int, entries) -> SimulationResult | None:
        """Count RNG skips (`rng.RngPlan`) that run before step `k`: their time, and the
        most memory one of them takes above the live bytes (they run one at a time), which
        the step's record includes. Only `rng_shape_only` nodes can be skipped."""
        for n, missing in entries:
            if not self.g.node(n).rng_shape_only:
                return self.fail(k, "random_order", f"{self.g.describe_node(n)} draws random "
                                 "numbers that may depend on its inputs' values, and the schedule "
                                 "does not run it first where eager does (in graph order among random "
                                 "nodes, in its own segment), so its draws cannot be reproduced; "
                                 "run it in that order", node_id=n)
            self.skip_during = max(self.skip_during, self.mem.bytes + skip_bytes(self.g, n, missing))
            self.run_node(self.g.node(n).cost)
        return None

    def record(self, k: int, during: int) -> SimulationResult | None:
        during = max(during, self.skip_during)
        self.result.memory_during.append(during)
        self.result.memory_after.append(self.mem.bytes)
        if during > self.result.peak_bytes or self.result.peak_step < 0:
            self.result.peak_bytes, self.result.peak_step = during, k
        if self.budget is not None and during > self.budget:
            return self.fail(k, "budget_exceeded", f"memory reaches {during} bytes, over the budget "
                             f"of {self.budget} bytes", node_id=self.current_node)
        return None

    def execute(self, k: int, step: pb.Step) -> SimulationResult | None:
        self.result.start_s.append(self.clock)
        action = step.WhichOneof("action")
        self.current_node = None
        if action == "compute":
            return self.compute(k, step.compute)
        if action is None:
            return self.fail(k, "bad_step", "the step has no action")
        value_id = getattr(step, action)
        if value_id not in self.structure.storage:
            return self.fail(k, "bad_step", f"{action} of value id {value_id}, which does not exist",
                             value_id=value_id)
        if value_id in self.resident:
            return self.fail(k, "free_resident", f"{action} of graph input {self.g.describe_value(value_id)}, which is "
                             "resident and cannot be released", value_id=value_id)
        if action == "free":
            if value_id in self.g.output_value_ids and value_id not in self.host:
                return self.fail(k, "free_output", f"free of graph output {self.g.describe_value(value_id)}, which has no "
                                 "copy in host memory", value_id=value_id)
            if value_id not in self.mem.live:
                return self.fail(k, "free_not_live", f"free of {self.g.describe_value(value_id)}, which is not live",
                                 value_id=value_id)
            during = self.mem.bytes
            if self.offloading or self.arriving:
                self.wait(max(self.offloading.pop(value_id, 0.0), self.arriving.pop(value_id, 0.0)))
            self.mem.drop(value_id)
            return self.record(k, during)
        if action == "offload":
            if value_id not in self.mem.live:
                return self.fail(k, "offload_not_live", f"offload of {self.g.describe_value(value_id)}, which is not live",
                                 value_id=value_id)
            if value_id in self.host:
                return self.fail(k, "already_offloaded", f"offload of {self.g.describe_value(value_id)}, which already has "
                                 "a copy in host memory", value_id=value_id)
            self.wait(self.arriving.pop(value_id, 0.0))
            self.offloading[value_id] = self.transfer(value_id, "offload")
            self.host[value_id] = self.g.storage_bytes(self.g.value(value_id).storage_id)
            self.host_bytes += self.host[value_id]
            self.result.host_peak_bytes = max(self.result.host_peak_bytes, self.host_bytes)
            if self.host_budget is not None and self.host_bytes > self.host_budget:
                return self.fail(k, "host_budget_exceeded", f"offloaded copies reach "
                                 f"{self.host_bytes} bytes of host memory, over the host budget "
                                 f"of {self.host_budget} bytes", value_id=value_id)
            return self.record(k, self.mem.bytes)
        # prefetch: the value comes back into a fresh allocation
        if value_id not in self.host:
            return self.fail(k, "prefetch_not_offloaded", f"prefetch of {self.g.describe_value(value_id)}, which is not "
                             "offloaded", value_id=value_id)
        if value_id in self.mem.live:
            return self.fail(k, "prefetch_live", f"prefetch of {self.g.describe_value(value_id)}, which is still live on "
                             "the device (free it after its offload first)", value_id=value_id)
        self.host_bytes -= self.host.pop(value_id)
        self.arriving[value_id] = self.transfer(value_id, "prefetch")
        self.mem.restore(value_id)
        return self.record(k, self.mem.bytes)

    def compute(self, k: int, node_id: int) -> SimulationResult | None:
        g = self.g
        inputs = self.structure.inputs.get(node_id)
        if inputs is None:
            return self.fail(k, "bad_step", f"compute of node id {node_id}, which does not exist",
                             node_id=node_id)
        self.current_node = node_id
        node = g.node(node_id)
        resident, live = self.resident, self.mem.live
        for v in inputs:
            if v in resident:
                if v in self.gradient_inputs and k < self.schedule.backward_start:
                    return self.fail(k, "gradient_before_backward", f"{g.describe_node(node_id)} reads output gradient "
                                     f"{g.describe_value(v)} before backward starts",
                                     node_id=node_id, value_id=v)
                continue
            if v not in live:
                where = " (it is offloaded; prefetch it first)" if v in self.host else ""
                return self.fail(k, "input_not_live", f"{g.describe_node(node_id)} reads {g.describe_value(v)}, "
                                 f"which is not live{where}", node_id=node_id, value_id=v)
        counts = self.result.compute_counts
        counts[node_id] += 1
        if counts[node_id] > 1:
            if node.mutating or node.non_recomputable:
                return self.fail(k, "recompute_forbidden", f"{g.describe_node(node_id)} runs a second time but may run "
                                 "only once per step", node_id=node_id)
            if node.random and not self.schedule.rng_replay:
                return self.fail(k, "random_recompute", f"{g.describe_node(node_id)} draws random numbers and is "
                                 "recomputed, but the schedule does not replay RNG state "
                                 "(set rng_replay)", node_id=node_id)
        if self.offloading or self.host:
            for v in self.structure.outputs[node_id]:
                if v in self.offloading:
                    return self.fail(k, "offload_pending", f"{g.describe_node(node_id)} computes "
                                     f"{g.describe_value(v)} again while its offload is under way "
                                     "(free it first)", node_id=node_id, value_id=v)
                if v in self.host:  # a fresh copy replaces the one in host memory
                    self.host_bytes -= self.host.pop(v)
        if self.arriving:
            for v in inputs:
                if v in self.arriving:
                    self.wait(self.arriving.pop(v))
        during = self.mem.compute(node_id)
        if k in self.rng.replays:  # the generator is set back while the outputs exist
            during = max(during, self.mem.bytes + g.proto.provenance.rng_replay_bytes)
        self.run_node(node.cost)
        return self.record(k, during)


def simulate(graph: Graph, schedule: pb.Schedule, *, budget: int | None = None) -> SimulationResult:
    """Replay `schedule` on `graph`; check it against `budget` (default: its own).

    Returns peak, time, memory after every step and the values saved for
    backward, or, with `.valid` false, the first violation.
    """
    if budget is None and schedule.HasField("budget_bytes"):
        budget = schedule.budget_bytes
    return _Run(graph, schedule, budget).run()


def check(graph: Graph, schedule: pb.Schedule, *, budget: int | None = None) -> SimulationResult:
    """`simulate`, raising `InvalidSchedule` when the schedule breaks a rule."""
    result = simulate(graph, schedule, budget=budget)
    if not result.valid:
        raise InvalidSchedule(schedule.name, result.violation)
    return result
