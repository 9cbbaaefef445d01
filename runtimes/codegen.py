"""Turn a scheduled IR graph into two straight-line Python functions.

A GPU step of a small model is thousands of short kernels, so the runtime
cannot afford to interpret steps: each segment of the schedule is written once
as Python source, one line per step, and compiled. A compute step is a call
of the op (a recomputation is simply a second call), a free is `del`, so that
the tensor's last reference goes exactly where the schedule says. Ops,
constants and the device are bound as globals of the generated code. Offload and
prefetch steps call the runtime's `transfers.Transfers` (copy streams, host buffer
pool), with waits where the schedule frees or reads a value in transit.

    forward(R, U=None)           -> (user outputs, buffer updates, saved)
    backward(R, S, O, T, U=None) -> generator: one list of gradients per gradient group

R holds the resident tensors (parameters, buffers, user inputs, constants) in
`SegmentPlan.resident` order, S the list forward saved (emptied on entry so
that each saved tensor dies at its last use), O the user outputs backward reads,
T the output gradients, U the step's FSDP2 units when some of R's parameters are
sharded (`fsdp.StepUnits`: gathered inside the segments, unit by unit).

The backward segment is a generator so that gradients leave it as soon as they
are final (`gradient_groups`): it yields the gradients of one group (resident
slots in `SegmentPlan.gradient_groups`) right after the step that last touches
them, and runs on when asked for the next. The runtime hands each group to
autograd from its own node, so that hooks on parameters' gradients (DDP's
bucket all-reduce, FSDP's reduce-scatter, optimizers in backward) run while
the rest of the backward segment computes.
Random nodes follow `ir.rng`: whatever the order the schedule runs them in,
each run draws the numbers eager would draw (states saved where eager draws,
replayed on recomputation, placeholder runs to advance the generator past a
node run out of order), and the generator ends the step where eager's does.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch

from remat_ir.ir import Graph, RematIRError, pb, simulate
from remat_ir.ir.arguments import TensorRef, decode, tensor_ids
from remat_ir.ir.dtypes import nbytes
from remat_ir.ir.fusion import body_nodes, is_fused
from remat_ir.ir.graph import FORWARD_OUTPUT_ROLES
from remat_ir.ir.memory import allocated_bytes, is_view, snapshot_buffers

from remat_ir.ir.rng import plan_rng

from remat_ir.torchlib.overloads import functional_overload
from remat_ir.torchlib.types import empty_tensor, resolve_op, to_torch_argument, torch_dtype

from . import absent_gradients, grad_mode_kernels
from .compiled import EAGER_OPS, Region, check_backend, output_positions
from .gradient_parts import Handovers, handovers
from .op_checks import checked_op
from .transfers import Transfers


def _tangents(graph: Graph, user_outputs: list[int]) -> list[int | None]:
    """The tangent input of each user output (None: it gets no gradient). A value returned
    k times has k tangents (`return y, y`), given in output order: the k-th return of a
    value gets the k-th tangent of it (keyed by value alone, the first was never bound)."""
    pending: dict[int, list[int]] = {}
    for entry in graph.proto.inputs:
        if graph.value(entry.value_id).kind == pb.GRADIENT and entry.HasField("gradient_of"):
            pending.setdefault(entry.gradient_of, []).append(entry.value_id)
    return [pending[v].pop(0) if pending.get(v) else None for v in user_outputs]


def _tangent_sources(graph: Graph, tangent_of: list[int | None]):
    """`sources(v)`: the positions of the user outputs whose tangents value `v` is computed
    from (empty for None). A gradient computed from none of the tangents a call's loss
    gave is one eager's autograd never reaches, and so leaves None (`_Step.group`)."""
    position = {t: i for i, t in enumerate(tangent_of) if t is not None}
    found: dict[int, frozenset[int]] = {}

    def sources(value: int | None) -> frozenset[int]:
        if value is None:
            return frozenset()
        stack = [value]
        while stack:
            v = stack[-1]
            if v in found:
                stack.pop()
                continue
            if v in position:
                found[v] = frozenset([position[v]])
                stack.pop()
                continue
            node = graph.producer(v)
            inputs = [] if node is None else list(graph.node(node).inputs)
            pending = [i for i in inputs if i not in found]
            if pending:
                stack.extend(pending)
                continue
            found[v] = frozenset().union(*(found[i] for i in inputs))
            stack.pop()
        return found[value]

    return sources


@dataclass
class SegmentPlan:
    """How the runtime wires the generated functions to tensors."""
    resident: list[int]                       # value ids in R order
    user_outputs: list[int]                   # forward results, by output index
    buffer_updates: list[tuple[str, int]]     # (buffer name, value id)
    tangents: list[int | None]                # tangent value id per user output (None: no gradient)
    forward_outputs_read_in_backward: list[int]
    #: The user outputs whose storage the backward reads, through them or another value
    #: viewing it (`tanh(h).view(-1)` returned, `tanh`'s result read): the caller changing
    #: one in place is refused (`_Runner.output_modified`), as eager's version counter does.
    forward_outputs_sharing_read_storage: list[int] = field(default_factory=list)
    buffers_read_in_backward: set[str] = field(default_factory=set)
    # resident slots, in yield order; a slot whose gradient leaves in parts
    # (`gradient_parts`) appears once per part and once more, last, with None
    gradient_groups: list[list[int]] = field(default_factory=list)
    # per group, per entry, the user outputs (positions) whose tangents what it yields reads
    gradient_sources: list[list[frozenset[int]]] = field(default_factory=list)
    # resident slot -> dtype of autocast's cached cast of it: the backward yields that
    # cast's gradient for the slot (`gradient_parts`), to be handed to the block's cast
    autocast_casts: dict[int, torch.dtype] = field(default_factory=dict)
    # per resident slot, the group during whose run the backward last reads it (-1: never)
    last_read_group: list[int] = field(default_factory=list)
    #: Resident slots the graph computes no gradient for (a parameter the forward never
    #: reads, or reads under no_grad): eager's backward never reaches them, so the runtime
    #: gives autograd no edge to them (`_Runner.handed`), or it would run their hooks.
    without_gradient: frozenset[int] = frozenset()
    forward_source: str = ""
    backward_source: str = ""
    regions: list = field(default_factory=list)  # compiled.Region, backend "inductor"


class _Writer:
    """Accumulates source lines and the globals they refer to."""

    def __init__(self, device: torch.device):
        self.lines: list[str] = []
        self.globals: dict[str, object] = {"_device": device}
        self._constants = 0
        #: Random node -> the inputs a skip ran it on placeholders for (`_declared_shapes`).
        self.placeheld: dict[int, set[int]] = {}

    def constant(self, obj) -> str:
        """A literal for None, bools, ints and strings; a bound global for anything else
        (floats such as -inf and NaN, dtypes, memory formats)."""
        if obj is None or isinstance(obj, (bool, int, str)):
            return repr(obj)
        name = f"_k{self._constants}"
        self._constants += 1
        self.globals[name] = obj
        return name

    def expression(self, obj) -> str:
        if isinstance(obj, _Marker):
            return str(obj)
        if isinstance(obj, list):
            return "[" + ", ".join(self.expression(x) for x in obj) + "]"
        if isinstance(obj, tuple):
            return "(" + "".join(self.expression(x) + ", " for x in obj) + ")"
        if isinstance(obj, torch.device):
            return "_device"
        return self.constant(obj)


def _tensor_name(value_id: int) -> str:
    return f"v{value_id}"


class _Marker(str):
    """A tensor variable name inside a converted argument structure."""


def _compile(writer: _Writer, name: str, params: str, body: list[str]) -> tuple[object, str]:
    source = f"def {name}({params}):\n" + "\n".join("    " + line for line in body or ["pass"]) + "\n"
    namespace = dict(writer.globals)
    exec(compile(source, f"<remat-ir {name}>", "exec"), namespace)
    return namespace[name], source


def resident_order(graph: Graph) -> list[int]:
    """Value ids of the tensors a step is called with (R): graph inputs other than
    output gradients, in graph order, then constants."""
    g = graph.proto
    resident = [e.value_id for e in g.inputs if graph.value(e.value_id).kind != pb.GRADIENT]
    return resident + sorted(v.id for v in g.values if v.kind == pb.CONSTANT and v.id not in resident)


#: Most gradient groups a backward segment yields when gradients are awaited (DDP,
#: FSDP): enough that the first buckets reduce while most of the backward still runs,
#: few enough that the nodes (an autograd node a group) cost little.
GRADIENT_GROUPS = 16


def generate(graph: Graph, schedule: pb.Schedule, device: torch.device, *, tick=None,
             gradient_groups: int = GRADIENT_GROUPS, gathered: dict[int, int] | None = None,
             backend: str = "eager", absent_outputs: frozenset[int] = frozenset(),
             transfers: Transfers | None = None):
    """(forward function, backward generator function, plan) for `schedule` on `device`.

    With `tick` (`timing.Timeline.tick`), each segment calls `tick(-1)` on entry and
    `tick(node_id)` after each compute step, so that a step can be timed op by op in
    the order and context it runs (`timing.time_schedule`); the functions a training
    step runs are generated without it. `gradient_groups` bounds how many groups the
    backward yields its gradients in (`release_points`). `gathered` maps the resident
    slots of parameters an FSDP2 unit shards to the unit's index: each segment then
    gathers a unit before its first read and the forward frees it after its last
    (`_GatherLines`; U, the segments' last argument, is `fsdp.StepUnits`). With
    `backend="inductor"`, runs of plain compute and free steps are Inductor-compiled
    regions (`compiled.py`; listed in `SegmentPlan.regions`); with `tick` too, region
    i calls `tick(-2 - i)` after it runs (its ops cannot be timed one by one), and each
    compute step outside regions `tick(node_id)`. The backward is generated for a loss
    that leaves out the user outputs (positions) in `absent_outputs`: their tangents are
    None, and so is what only they reach (`absent_gradients`). `transfers`: the runtime's
    copy streams and host buffer pool, which every pair of segments generated for one
    schedule must share (a new one by default): a backward generated for a loss leaving
    outputs out, with a pool of its own, took in the buffers of the forward's offloads and
    the forward allocated new ones at every step, a host memory leak (found 2026-12-04:
    the zoo's tiny GPT-2 trained on its own loss, its logits left out: 24 KB a step)."""
    g = graph.proto
    regions = [] if check_backend(backend) == "inductor" else None
    simulated = simulate(graph, schedule) if regions is not None else None
    bs = schedule.backward_start
    steps = list(schedule.steps)
    resident = resident_order(graph)
    user_outputs = [o.value_id for o in g.outputs if o.role == pb.USER_OUTPUT]
    tangent_of = _tangents(graph, user_outputs)
    buffer_updates = [(o.name, o.value_id) for o in g.outputs if o.role == pb.BUFFER_UPDATE]

    # Values each segment reads or frees, to know what crosses the boundary.
    def touched(segment):
        seen = set()
        for s in segment:
            if s.HasField("compute"):
                seen.update(graph.node(s.compute).inputs)
            else:
                seen.add(getattr(s, s.WhichOneof("action")))
        return seen

    forward_steps, backward_steps = steps[:bs], steps[bs:]
    live = set()
    for s in forward_steps:
        if s.HasField("compute"):
            live.update(graph.node(s.compute).outputs)
        elif s.HasField("free"):
            live.discard(s.free)
        elif s.HasField("prefetch"):
            live.add(s.prefetch)
    # Backward gets the user outputs it reads through autograd (save_for_backward); every
    # other value it reads or must return (buffer updates included) through the stash.
    backward_reads = touched(backward_steps)
    backward_results = {o.value_id for o in g.outputs if o.role not in FORWARD_OUTPUT_ROLES}
    saved = sorted(v for v in live - set(user_outputs) if v in backward_reads | backward_results)
    outputs_read = [v for v in user_outputs if v in live and v in backward_reads]
    read_storages = {graph.value(v).storage_id for v in backward_reads}
    outputs_sharing = [v for v in user_outputs if v in live and graph.value(v).storage_id in read_storages]

    # RNG (ir.rng): each run of a random node draws eager's numbers, whatever the order.
    rng = plan_rng(graph, schedule)
    captured_in_forward = {s.compute for s in forward_steps if s.HasField("compute")}
    captured_in_forward.update(n for k in range(bs) for n, _ in rng.skips.get(k, ()))
    captured_in_forward.update(n for n, _ in rng.forward_end)
    rng_carried = sorted(rng.saved & captured_in_forward)

    writer = _Writer(device)
    writer.globals["_get_rng"], writer.globals["_replay"] = _rng_functions(device)
    if tick is not None:
        writer.globals["_tick"] = tick
    writer.globals["_placeholder"] = _placeholder_function(graph, device)
    writer.placeheld = {n: set(missing) for skips in (*rng.skips.values(), rng.forward_end, rng.step_end)
                        for n, missing in skips if missing}
    writer.globals["_declared"] = _declared_shapes(graph)
    copies = (_CopyLines(writer, transfers or Transfers(device)) if any(s.HasField("offload") for s in steps)
              else None)
    resident_index = {v: i for i, v in enumerate(resident)}
    units = _GatherLines(graph, rng, resident, gathered, user_outputs) if gathered else None
    sources = _tangent_sources(graph, tangent_of)
    # Gradients of outputs the loss leaves out are None, and what only they reach is not run.
    def zeros(v: int) -> str:
        value = graph.value(v)
        return (f"_zeros({list(value.shape)}, dtype={writer.constant(torch_dtype(value.dtype))}, "
                f"device=_device)")

    left_out = [tangent_of[i] for i in absent_outputs if tangent_of[i] is not None]
    absent = (absent_gradients.Absent(graph, left_out, lambda v: bool(sources(v)),
                                      absent_gradients.written_storages(graph, mutated_inputs),
                                      _tensor_name, zeros)
              if left_out else None)   # the usual backward: nothing to follow
    if absent is not None:
        writer.globals["_zeros"] = torch.zeros

    def segment_body(first: int, segment, end_skips, reads_saved: bool, after=None,
                     parts: Handovers = Handovers()):
        body = ["_tick(-1)"] if tick is not None else []
        used = touched(segment)
        for k in range(first, first + len(segment)):
            for n, _ in rng.skips.get(k, ()):
                used.update(graph.node(n).inputs)
        for n, _ in end_skips:
            used.update(graph.node(n).inputs)
        gather_before, gather_after = (units.lines(first, segment, end_skips, used, not reads_saved)
                                       if units is not None else ({}, {}))
        for v in sorted(used & set(resident)):
            if units is None or resident_index[v] not in gathered:
                body.append(f"{_tensor_name(v)} = R[{resident_index[v]}]")
        if reads_saved:
            for i, v in enumerate(saved):
                body.append(f"{_tensor_name(v)} = S[{i}]")
            for i, n in enumerate(rng_carried):
                body.append(f"_rng{n} = S[{len(saved) + i}]")
            for i, v in enumerate(carried_copies):
                body.append(f"{_copy_name(v)} = S[{len(saved) + len(rng_carried) + i}]")
            body.append("S.clear()")
            for i, v in enumerate(outputs_read):
                body.append(f"{_tensor_name(v)} = O[{i}]")
            for i, t in enumerate(tangent_of):
                if t is not None and t in used:
                    body.append(f"{_tensor_name(t)} = T[{i}]")
        runs = (_Runs(graph, writer, device, regions, body, simulated, tick=tick is not None,
                      backward_start=bs) if regions is not None else None)

        def emit(lines) -> None:
            """Append Python lines, ending the pending region first (nothing may move
            across a line that is not a plain compute or free step)."""
            lines = list(lines)
            if lines and runs is not None:
                runs.flush()
            body.extend(lines)

        for k, s in enumerate(segment, start=first):
            emit(gather_before.get(k, ()))
            for n, missing in rng.skips.get(k, ()):
                emit(_skip_lines(graph, writer, n, missing, n in rng.saved))
            action = s.WhichOneof("action")
            if k in parts.skipped or (action == "free" and s.free in parts.unmade):
                pass  # a gradient sum autograd makes from the parts handed to it
            elif action == "compute":
                waits = copies.before_compute(graph.node(s.compute)) if copies is not None else []
                mode = "replay" if k in rng.replays else "save" if s.compute in rng.saved else ""
                instead = (absent.lines(s.compute, functools.partial(_member_lines, graph, writer, s.compute,
                                                                     mode=mode))
                           if absent is not None else None)
                if (runs is not None and instead is None and not waits and not mode
                        and not graph.node(s.compute).random):
                    runs.compute(s.compute, k)
                else:
                    emit(waits + (_call_lines(graph, writer, s.compute, mode) if instead is None else instead))
                    if tick is not None:
                        body.append(f"_tick({s.compute})")
            elif action == "free":
                waits = copies.before_free(s.free) if copies is not None else []
                if runs is not None and not waits:
                    runs.free(s.free, k)
                else:
                    emit(waits + [f"del {_tensor_name(s.free)}"])
            elif absent is not None and getattr(s, action) in absent.values:
                # an absent value moves nowhere
                emit([f"{_tensor_name(s.prefetch)} = None"] if action == "prefetch" else [])
            else:
                emit(copies.step(action, getattr(s, action)))
            emit(gather_after.get(k, ()))
            if after and k in after:
                emit(after[k])
        end = first + len(segment)
        emit(gather_before.get(end, ()))
        for n, missing in end_skips:
            emit(_skip_lines(graph, writer, n, missing, n in rng.saved))
        emit(gather_after.get(end, ()))
        if runs is not None:
            runs.flush()
        return body

    carried_copies: list[int] = []
    fwd_body = segment_body(0, forward_steps, rng.forward_end, reads_saved=False)
    if copies is not None:
        fwd_body.extend(copies.end_of_forward(user_outputs + [v for _, v in buffer_updates]))
        carried_copies = copies.carried()
    fwd_body.append("return ((" + "".join(f"{_tensor_name(v)}, " for v in user_outputs) + "), ("
                    + "".join(f"{_tensor_name(v)}, " for _, v in buffer_updates) + "), ["
                    + ", ".join([_tensor_name(v) for v in saved] + [f"_rng{n}" for n in rng_carried]
                                + [_copy_name(v) for v in carried_copies])
                    + "])")
    forward_fn, forward_source = _compile(writer, "forward_segment", "R, U=None", fwd_body)

    gradient_of = {}
    for o in g.outputs:
        if o.role == pb.PARAMETER_GRADIENT or o.role == pb.INPUT_GRADIENT:
            gradient_of.setdefault(o.name, o.value_id)
    name_of = {e.value_id: e.name for e in g.inputs}
    grads = [gradient_of.get(name_of.get(v)) for v in resident]
    reads = _storage_last_reads(graph, schedule, rng)
    points = release_points(graph, schedule, grads, gradient_groups, resident, reads)
    # Timed or compiled steps keep the graph's sums (timing prices the add where the graph
    # has it; Inductor regions make no bitwise promise).
    parts = (handovers(graph, schedule, grads, casts=gathered is None)
             if tick is None and regions is None else Handovers())
    whole = [None if slot in parts.slots else v for slot, v in enumerate(grads)]
    drops = _aliases_to_drop(graph, schedule, points, whole)
    yields = _yield_points(points, parts, whole)
    groups = [[slot for slot, _ in entries] for _, entries in yields]
    last_read_group = _last_read_groups(graph, reads, resident, [k for k, _ in yields])
    handed = {v for entries in parts.at.values() for _, v in entries}
    copied = _gradients_to_copy(graph, yields)
    after = {k: _yield_lines([v for _, v in entries], drops.get(k, ()), kept=handed, copied=copied)
             for k, entries in yields if k is not None}
    bwd_body = segment_body(bs, backward_steps, rng.step_end, reads_saved=True, after=after,
                            parts=parts)
    if copies is not None:
        bwd_body.extend(copies.end_of_step())
    bwd_body.extend(_yield_lines([v for _, v in yields[-1][1]], kept=handed, copied=copied))
    backward_fn, backward_source = _compile(writer, "backward_segment", "R, S, O, T, U=None", bwd_body)

    read_in_backward = {name_of[v] for v in snapshot_buffers(graph, schedule)}
    plan = SegmentPlan(resident=resident, user_outputs=user_outputs, buffer_updates=buffer_updates,
                       tangents=tangent_of,
                       forward_outputs_read_in_backward=outputs_read,
                       forward_outputs_sharing_read_storage=outputs_sharing,
                       buffers_read_in_backward=read_in_backward, gradient_groups=groups,
                       gradient_sources=[[sources(v) for _, v in entries] for _, entries in yields],
                       last_read_group=last_read_group, regions=regions or [],
                       without_gradient=frozenset(slot for slot, v in enumerate(grads) if v is None),
                       autocast_casts={slot: torch_dtype(d) for slot, d in parts.casts.items()},
                       forward_source=forward_source, backward_source=backward_source)
    return forward_fn, backward_fn, plan


def release_points(graph: Graph, schedule: pb.Schedule, grads: list[int | None],
                   most: int, resident: list[int], reads: dict[int, int]
                   ) -> list[tuple[int | None, list[int]]]:
    """Where the backward segment yields gradients: (step index, resident slots) per
    group, in order; the last group (step None) is yielded once the segment has ended
    and holds every slot not yielded before, slots without a gradient included.

    A gradient can leave right after the compute step that touches it last, once no
    later step reads, frees or moves it, and no later step reads the tensor it is the
    gradient of (`resident`, per slot; `reads`: `_storage_last_reads`): what autograd runs on a gradient handed over may
    write that tensor (an optimizer step in a post-accumulate hook, PyTorch's recipe for
    fusing it into the backward), and eager never reads a parameter after its gradient
    is accumulated; a recomputation reading it later computed from the updated values
    (3.7e-2 off eager's). Groups close when they hold at least 1/`most` of all gradient
    bytes, so a model gets at most `most` groups however many parameters it has, and the
    first group leaves as soon as that share is final."""
    steps = schedule.steps
    last, moved = _backward_touches(graph, schedule)
    final = {v: max(last[v], reads.get(graph.value(p).storage_id, -1))
             for v, p in zip(grads, resident) if v is not None and v in last}
    ready = sorted({v for v, k in final.items() if v not in moved and k < len(steps)
                    and steps[last[v]].HasField("compute") and steps[k].HasField("compute")},
                   key=lambda v: final[v])
    size = {v: nbytes(graph.value(v).dtype, graph.value(v).shape) for v in set(grads) if v is not None}
    share = sum(size.values()) / max(1, most)
    points, pending, held = [], [], 0
    for i, v in enumerate(ready):
        pending.append(v)
        held += size[v]
        closes = i + 1 == len(ready) or final[ready[i + 1]] != final[v]
        if closes and held >= share and held > 0:
            points.append((final[v], pending))
            pending, held = [], 0
    out: list[tuple[int | None, list[int]]] = []
    taken: set[int] = set()
    for k, values in points[: max(0, most - 1)]:
        slots = [i for i, g in enumerate(grads) if g in values]
        taken.update(slots)
        out.append((k, slots))
    out.append((None, [i for i in range(len(grads)) if i not in taken]))
    return out


def _backward_touches(graph: Graph, schedule: pb.Schedule) -> tuple[dict[int, int], set[int]]:
    """(value -> index of the last backward step that reads, writes, frees or moves it;
    values the backward offloads or prefetches)."""
    steps = schedule.steps
    last: dict[int, int] = {}
    moved: set[int] = set()
    for k in range(schedule.backward_start, len(steps)):
        s = steps[k]
        action = s.WhichOneof("action")
        if action == "compute":
            node = graph.node(s.compute)
            for v in (*node.inputs, *node.outputs):
                last[v] = k
        else:
            last[getattr(s, action)] = k
            if action != "free":
                moved.add(getattr(s, action))
    return last, moved


def _storage_last_reads(graph: Graph, schedule: pb.Schedule, rng) -> dict[int, int]:
    """Storage id -> the last backward step that reads it (itself or a view of it); the
    number of steps for a read after the last step (a random op's generator skip)."""
    steps, end = schedule.steps, len(schedule.steps)
    last: dict[int, int] = {}

    def read(node_id: int, k: int) -> None:
        for v in graph.node(node_id).inputs:
            last[graph.value(v).storage_id] = k

    for k in range(schedule.backward_start, end):
        if steps[k].HasField("compute"):
            read(steps[k].compute, k)
        for n, _ in rng.skips.get(k, ()):
            read(n, k)
    for n, _ in rng.step_end:
        read(n, end)
    return last


def _last_read_groups(graph: Graph, last: dict[int, int], resident: list[int],
                      ends: list[int | None]) -> list[int]:
    """Per resident value, the gradient group during whose run (the steps up to its
    yield, `ends`) the backward segment last reads its storage (itself or a view of it,
    such as a transposed weight saved by the forward); -1 if it never does. What may be
    freed after a group, such as an FSDP unit's gathered parameters, follows from it.
    `last`: `_storage_last_reads`."""

    def group(k: int) -> int:
        return next(i for i, e in enumerate(ends) if e is None or e >= k)

    storages = [graph.value(v).storage_id for v in resident]
    return [group(last[s]) if s in last else -1 for s in storages]


def _aliases_to_drop(graph: Graph, schedule: pb.Schedule, points, grads: list[int | None]
                     ) -> dict[int, list[int]]:
    """Per yield point (step index), the values still bound in the backward segment that
    share a storage with a gradient yielded there and that no later step touches (the
    matmul result a transposed weight gradient is a view of, which the schedule need
    not free: the gradient keeps the storage anyway). Dropping them with the gradient
    lets the storage go when its new owner does (FSDP frees a unit's gradient once
    reduce-scattered)."""
    steps = schedule.steps
    last, _ = _backward_touches(graph, schedule)
    storage = {}

    def storage_of(v: int) -> int:
        if v not in storage:
            storage[v] = graph.value(v).storage_id
        return storage[v]

    at = {k: slots for k, slots in points if k is not None}
    bound: set[int] = set()
    drops: dict[int, list[int]] = {}
    for k in range(schedule.backward_start, len(steps)):
        s = steps[k]
        action = s.WhichOneof("action")
        if action == "compute":
            bound.update(graph.node(s.compute).outputs)
        elif action == "free":
            bound.discard(s.free)
        elif action == "prefetch":
            bound.add(s.prefetch)
        if k in at:
            values = {grads[i] for i in at[k] if grads[i] is not None}
            shared = {storage_of(v) for v in values}
            drops[k] = sorted(a for a in bound - values
                              if storage_of(a) in shared and last.get(a, -1) <= k)
            bound -= values | set(drops[k])
    return drops


def _yield_points(points, parts: Handovers, whole: list[int | None]
                  ) -> list[tuple[int | None, list[tuple[int, int | None]]]]:
    """The backward segment's yields: (step index or None for the end, [(resident slot,
    value or None)]), in order: the release points' gradients (`whole`: None for a
    gradient handed over in parts) and the parts' hand-overs, before the gradients
    released at the same step."""
    entries: dict[int | None, list[tuple[int, int | None]]] = {}
    for k, handed in parts.at.items():
        entries[k] = list(handed)
    for k, slots in points:
        entries.setdefault(k, []).extend((slot, whole[slot]) for slot in slots)
    end = entries.pop(None)
    return sorted(entries.items()) + [(None, end)]


def _gradients_to_copy(graph: Graph, yields) -> frozenset[int]:
    """The gradients handed over that share a storage with another one handed over before
    them (in the order the segment yields): `W + delta.view(8, 8)` makes `delta`'s gradient
    a view of `W`'s. `AccumulateGrad` steals a gradient nobody else holds, so both `.grad`s
    were one memory, and an in-place update of the gradients (`clip_grad_norm_`,
    accumulating micro-batches) applied twice to it: 1.8e-3 off eager after clipping, 0.12
    after two micro-batches (found by a review). Eager's engine copies such a gradient;
    these are handed over as copies too."""
    first: dict[int, int] = {}
    copied = set()
    for _, entries in yields:
        for _, v in entries:
            if v is None:
                continue
            storage = graph.value(v).storage_id
            if first.setdefault(storage, v) != v:
                copied.add(v)
    return frozenset(copied)


def _yield_lines(values: list[int | None], aliases=(), kept=(), copied=frozenset()) -> list[str]:
    """Yield `values` (a group's gradients, None for none) and drop the segment's
    references to them (and to `aliases`, `_aliases_to_drop`), so that autograd can take
    them over (`AccumulateGrad` steals a tensor nobody else holds); values in `kept`
    (gradient parts, `gradient_parts`) stay bound until the schedule frees them; those in
    `copied` are handed over as copies (`_gradients_to_copy`)."""
    names = [("None" if v is None else f"(None if {_tensor_name(v)} is None else {_tensor_name(v)}.clone())"
              if v in copied else _tensor_name(v)) for v in values]
    held = sorted({_tensor_name(v) for v in values if v is not None and v not in kept}
                  | {_tensor_name(a) for a in aliases})
    lines = [f"_out = [{', '.join(names)}]"]
    if held:
        lines.append(f"del {', '.join(held)}")
    return lines + ["yield _out", "del _out"]


class _GatherLines:
    """Where each segment gathers and frees the FSDP2 units (`fsdp.StepUnits`, U in the
    generated code): a unit is gathered before the first step that reads a value of its
    parameters' storages (views such as a transposed weight saved for backward
    included, and random nodes run to advance the generator), the all-gather of the unit
    gathered next is started then (as FSDP prefetches), and the forward frees a unit
    after the last such step. The backward never frees: a unit's reduce-scatter, which
    frees it, starts once its gradients are handed over (`torch._Sharding`). A unit
    whose storage a user output shares stays gathered to the end of the forward."""

    def __init__(self, graph: Graph, rng, resident: list[int], gathered: dict[int, int],
                 user_outputs: list[int]):
        self.graph, self.rng, self.resident = graph, rng, resident
        self.slots: dict[int, list[int]] = {}
        for slot, unit in sorted(gathered.items()):
            self.slots.setdefault(unit, []).append(slot)
        self.unit_of_storage = {graph.value(resident[slot]).storage_id: unit
                                for slot, unit in gathered.items()}
        self.kept = {self.unit_of_storage[graph.value(v).storage_id] for v in user_outputs
                     if graph.value(v).storage_id in self.unit_of_storage}

    def _units_read(self, node_ids, missing=()) -> set[int]:
        units = set()
        for n in node_ids:
            for v in self.graph.node(n).inputs:
                unit = self.unit_of_storage.get(self.graph.value(v).storage_id)
                if unit is not None and v not in missing:
                    units.add(unit)
        return units

    def lines(self, first: int, segment, end_skips, used: set[int], forward: bool):
        """({position: lines before it}, {position: lines after it}); position
        first + len(segment) stands for the random nodes run at the segment's end."""
        reads: dict[int, set[int]] = {}
        for k, s in enumerate(segment, start=first):
            units = set()
            for n, missing in self.rng.skips.get(k, ()):
                units |= self._units_read([n], set(missing))
            if s.HasField("compute"):
                units |= self._units_read([s.compute])
            reads[k] = units
        reads[first + len(segment)] = set().union(*(self._units_read([n], set(m)) for n, m in end_skips))
        first_read, last_read = {}, {}
        for k in sorted(reads):
            for unit in reads[k]:
                first_read.setdefault(unit, k)
                last_read[unit] = k
        before: dict[int, list[str]] = {}
        after: dict[int, list[str]] = {}
        order = sorted(first_read, key=lambda unit: (first_read[unit], unit))
        for i, unit in enumerate(order):
            lines = before.setdefault(first_read[unit], [])
            following = order[i + 1] if i + 1 < len(order) else None
            lines.append(f"_G = U.gather({unit}, {following})")
            lines += [f"{_tensor_name(self.resident[slot])} = _G[{slot}]" for slot in self.slots[unit]
                      if self.resident[slot] in used]
            lines.append("del _G")
        if forward:
            for unit, k in last_read.items():
                if unit not in self.kept:
                    after.setdefault(k, []).append(f"U.release({unit})")
        return before, after


class _Runs:
    """The pending run of plain compute and free steps of a segment, written into the
    segment's `body` as one compiled region (`compiled.Region`) once something else
    comes. A run of fewer than `MIN_REGION_OPS` ops, or one whose values are all freed
    in it, is written as eager lines: compiling it would gain nothing.

    Inductor does not run a region's steps as the plan orders them, which can hold more
    memory than the plan at any step of the region:
    - a fused kernel allocates all its outputs when it starts, and frees its inputs when
      it ends, where the plan may free an input between two of the kernel's ops (the
      quick GPT-2 at torch.compile's 0.5 peak: a GELU kernel held the sum it read while
      writing three outputs, 3.75 MiB above the plan at its peak, 4.9% above in all);
    - it orders kernels by their dependencies, so a step that reads nothing the run
      computed before it (the start of another chain: a recomputation from saved values,
      the backward resuming after one) may run as early as the region's start.
    Both only move allocations earlier and frees later within the region. So the most a
    region can hold is the plan's memory before its first step plus everything its steps
    allocate, none of it freed (plus the step's own workspace): a step joins the pending run
    only while that stays within the plan's peak; otherwise the region is cut before
    it. The bound binds near the plan's peak only; elsewhere regions are as long as the
    steps between Python lines.

    Earlier rules: cutting before every step that starts a chain kept plans within their
    peaks, but the planner interleaves chains, so most regions had two ops and compiling
    gained little (the quick GPT-2's 30% plan ran at 1.28x eager's store-everything step
    against 1.20x with the bound on moved steps alone, its store-everything at 0.95x
    against 0.93x); bounding what moved steps allocate, without the fused kernels' holds,
    left the quick GPT-2 up to 5% above its plans. Letting every step join without a
    check put the CNN 9% and tiny Llama 10% above their plans.

    What the bound costs where a plan stays near its peak: the quick CNN's plan at
    torch.compile 0.5's peak (it recomputes only fused BatchNorm-normalize + ReLU nodes and
    a max-pool, predicted +1.2%) runs in 26 regions, backward 18.3 ms, against 3 regions and
    16.6 ms uncut (12.6% over the plan) and 15.8 ms for store-everything (one run, 40
    interleaved rounds, CPU). Tried and left: letting a region compile whole and split
    itself in halves where Inductor's own memory timeline of its fused kernel order (a
    `_post_fusion_custom_pass`) went over the plan: 24 parts, no faster (x1.125 of eager's
    step against x1.112), and 2.6% over the plan in that run, where the check failed on one
    part (an index error in the prototype) and the part ran eagerly. Also left: a tighter
    bound from how Inductor's scheduler moves steps (a fused kernel runs where its first
    member was and pulls what it needs before it; a result of Inductor's own kernels,
    decomposed ops included, may be computed inside each reader and holds its inputs to the
    last): every compiled test within its plan's peak, the CNN plan's peak at its plan
    (1.0000), but 13 regions instead of 18 and no faster (x1.059 of eager's step against
    x1.058, 40 interleaved rounds; that run's plan, made under a time limit, was not the one
    above)."""

    MIN_REGION_OPS = 2

    def __init__(self, graph: Graph, writer: _Writer, device: torch.device, regions: list,
                 body: list[str], simulated, tick: bool = False, backward_start: int = -1):
        self.graph, self.writer, self.device, self.regions = graph, writer, device, regions
        self.body, self.tick = body, tick
        self.after, self.peak = simulated.memory_after, simulated.peak_bytes
        self.backward_start = backward_start
        self.held_from_backward = simulated.snapshot_bytes + simulated.seed_bytes
        self._reset()

    def _before(self, k: int) -> int:
        """The plan's memory before step `k`: what the step before left, and at the start
        of the backward what is made there (`ir.memory.snapshot_buffers`, the gradient
        seeds: `ir.memory.gradient_seed_bytes`)."""
        return ((self.after[k - 1] if k else 0)
                + (self.held_from_backward if k == self.backward_start else 0))

    def _reset(self) -> None:
        self.steps: list[tuple[str, int, int]] = []  # (compute|free, node|value, step)
        self.produced: set[int] = set()  # values the pending run computes
        self.held = 0  # the plan's memory before the run's first compute, plus all it allocated

    def compute(self, node_id: int, k: int) -> None:
        node = self.graph.node(node_id)
        if (node.mutating and not self.produced.issuperset(mutated_inputs(node))) or node.op in EAGER_OPS:
            # It writes into a value from before the run (buffer reuse's `mul.out` into a
            # dying gradient). Inside a region Inductor would keep that input to the
            # region's end, to copy the result into it, and compute the result into a
            # fresh buffer: two buffers held where the plan holds one (tiny DistilBERT
            # at its smallest budget: 12% above its plan, 6% as an eager line). Or Inductor
            # would run it holding more than it does eagerly (`compiled.EAGER_OPS`).
            self.flush()
            self.body.extend(_call_lines(self.graph, self.writer, node_id, ""))
            if self.tick:
                self.body.append(f"_tick({node_id})")
            return
        allocated = allocated_bytes(self.graph, node)
        if self.produced and self.held + allocated + node.cost.workspace_bytes > self.peak:
            self.flush()
        if not self.produced:
            self.held = self._before(k)
        self.held += allocated
        self.steps.append(("compute", node_id, k))
        self.produced.update(node.outputs)

    def free(self, value_id: int, k: int) -> None:
        self.steps.append(("free", value_id, k))

    def flush(self) -> None:
        """Write the pending run into the body (as a region or eager lines)."""
        steps = self.steps
        self._reset()
        self.body.extend(self._lines(steps))

    def _lines(self, steps: list[tuple[str, int, int]]) -> list[str]:
        hoisted = self._escaping_views(steps)
        if hoisted:
            return (self._eager_lines([step for step in steps if step[2] in hoisted])
                    + self._lines([step for step in steps if step[2] not in hoisted]))
        nodes = [n for kind, n, _ in steps if kind == "compute"]
        inputs, dropped, live, produced = {}, [], {}, set()
        for kind, x, _ in steps:
            if kind == "compute":
                for v in self.graph.node(x).inputs:
                    if v not in produced:
                        inputs.setdefault(v, None)
                for v in self.graph.node(x).outputs:
                    produced.add(v)
                    live.pop(v, None)
                    live[v] = None
            elif x in live:
                del live[x]
            else:  # a value bound before the run: its name goes before the call
                dropped.append(x)
        outputs = list(live)
        ops = sum(len(body_nodes(self.graph.node(n))) for n in nodes)
        if ops < self.MIN_REGION_OPS or not outputs:
            return self._eager_lines(steps)
        name = f"_region{len(self.regions)}"
        region = Region(self.graph, nodes, list(inputs), outputs, self.device, name,
                        [k for _, _, k in steps])
        self.regions.append(region)
        self.writer.globals[name] = region
        lines = [f"_in = [{', '.join(_tensor_name(v) for v in inputs)}]"]
        if dropped:
            lines.append(f"del {', '.join(_tensor_name(v) for v in dropped)}")
        targets = "".join(f"{_tensor_name(v)}, " for v in outputs)
        lines += [f"({targets}) = {name}(_in)", "del _in"]
        return lines + ([f"_tick({region_tick(len(self.regions) - 1)})"] if self.tick else [])

    def _eager_lines(self, steps: list[tuple[str, int, int]]) -> list[str]:
        """Steps as Python lines, op by op (ticking each compute when timed)."""
        lines = []
        for kind, x, _ in steps:
            lines += (_call_lines(self.graph, self.writer, x, "") if kind == "compute"
                      else [f"del {_tensor_name(x)}"])
            if self.tick and kind == "compute":
                lines.append(f"_tick({x})")
        return lines

    def _escaping_views(self, steps: list[tuple[str, int, int]]) -> set[int]:
        """The compute steps of a run (by schedule index) better run eagerly before its
        region: views (through views only) of values from before the run, of which one
        the run returns.

        A region output that views a region input is rebuilt at every call by the
        compiled function's wrapper (AOT autograd replays the view on the input, to keep
        the alias): about 10 us each, 0.64 ms of a 25 ms step for the 61 such outputs of
        the quick CNN's plan at torch.compile 0.5's peak (mostly BatchNorm's squeezed
        statistics, read by a later region), against about 3 us for the view as an
        eager line. A view allocates nothing and its input exists before the run, so
        running it first changes no byte the plan counts."""
        producer: dict[int, int] = {}    # value -> the step computing it (the last one)
        sources: dict[int, list[int]] = {}  # view step -> the steps of the run it reads
        escaping: set[int] = set()       # values the run returns
        named: set[int] = set()          # values the run has computed or freed so far
        for kind, x, k in steps:
            if kind == "free":
                escaping.discard(x)
                named.add(x)
                continue
            node = self.graph.node(x)
            read = [producer[v] for v in node.inputs if v in producer]
            # (A recomputation of a value freed earlier in the run stays in place: run
            # first, its name would be bound before the old copy's is deleted.)
            if (is_view(self.graph, node) and not node.mutating and all(r in sources for r in read)
                    and named.isdisjoint(node.outputs)):
                sources[k] = read
            named.update(node.outputs)
            for v in node.outputs:
                producer[v] = k
                escaping.add(v)
        hoisted, pending = set(), [producer[v] for v in escaping if producer[v] in sources]
        while pending:  # and the views they view
            k = pending.pop()
            if k not in hoisted:
                hoisted.add(k)
                pending += sources[k]
        return hoisted


def region_tick(index: int) -> int:
    """The id region `index` ticks with when a step is timed (`timing.Timeline`): negative,
    apart from node ids and a segment's entry (-1)."""
    return -2 - index


def mutated_inputs(node: pb.Node) -> set[int]:
    """The value ids a node's op writes into (its schema's written arguments: the `out` of
    an `out=` overload, the self of an in-place op)."""
    arguments = resolve_op(node.op)._schema.arguments
    written = {a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write}
    found = {v for a, argument in zip(arguments, node.args) if a.name in written
             for v in tensor_ids(argument)}
    return found | {v for kw in node.kwargs if kw.name in written for v in tensor_ids(kw.value)}


def _copy_name(value_id: int) -> str:
    return f"_h{value_id}"


class _CopyLines:
    """The lines of offload and prefetch steps (`transfers.Transfers`), and the waits they
    call for, following which values have a host copy or a transfer compute has not
    waited for, through both segments in order. The simulator forbids what is not handled
    here (prefetching a live value, recomputing one whose offload is under way)."""

    def __init__(self, writer: _Writer, transfers: Transfers):
        writer.globals["_transfers"] = transfers
        self.host: set[int] = set()       # values with a host copy (_h<v> holds its buffer)
        self.leaving: set[int] = set()    # offloaded, device copy still live, not waited for
        self.arriving: set[int] = set()   # prefetched, not waited for

    def _wait(self, v: int) -> list[str]:
        lines = []
        if v in self.leaving or v in self.arriving:
            lines.append(f"_transfers.wait({_copy_name(v)})")
        if v in self.arriving and v not in self.host:
            lines.append(f"del {_copy_name(v)}")
        self.leaving.discard(v)
        self.arriving.discard(v)
        return lines

    def step(self, action: str, v: int) -> list[str]:
        if action == "offload":
            lines = self._wait(v)
            self.host.add(v)
            self.leaving.add(v)
            return lines + [f"{_copy_name(v)} = _transfers.offload({_tensor_name(v)})"]
        self.host.discard(v)
        self.arriving.add(v)
        return [f"{_tensor_name(v)} = _transfers.prefetch({_copy_name(v)})"]

    def before_compute(self, node: pb.Node) -> list[str]:
        lines = []
        for v in node.inputs:
            if v in self.arriving:
                lines += self._wait(v)
        for v in node.outputs:   # a fresh copy replaces the one in host memory
            if v in self.host:
                self.host.discard(v)
                lines += [f"_transfers.release({_copy_name(v)})", f"del {_copy_name(v)}"]
        return lines

    def before_free(self, v: int) -> list[str]:
        return self._wait(v)

    def end_of_forward(self, returned: list[int]) -> list[str]:
        """The caller gets forward outputs once their copies have arrived."""
        return [line for v in dict.fromkeys(returned) if v in self.arriving for line in self._wait(v)]

    def carried(self) -> list[int]:
        """Values whose host copy or pending transfer the backward segment takes over."""
        return sorted(self.host | self.leaving | self.arriving)

    def end_of_step(self) -> list[str]:
        """Nothing may go while a transfer still reads or writes it; host copies nobody
        prefetched give their buffers back."""
        lines = [line for v in sorted(self.leaving | self.arriving) for line in self._wait(v)]
        for v in sorted(self.host):
            lines += [f"_transfers.release({_copy_name(v)})", f"del {_copy_name(v)}"]
        self.host.clear()
        return lines


@contextlib.contextmanager
def segments_without_autocast(device: torch.device):
    """The graph already holds the casts autocast made while it was traced: running its
    segments under the caller's autocast would cast a second time. (Nothing to turn off
    where autocast is off: making the contexts took 20 us each, at every node that hands
    gradients over.)"""
    with contextlib.ExitStack() as stack:
        for device_type in dict.fromkeys(("cpu", device.type)):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _op_global(graph: Graph, writer: _Writer, node_id: int, node: pb.Node | None = None):
    """(global name, OpOverload) of the node's op (or of `node`, a member of fused node
    `node_id`), bound in the generated code."""
    node = graph.node(node_id) if node is None else node
    op = checked_op(graph, node_id, node)
    op_global = "op_" + node.op.replace(".", "_")
    if op is torch.ops.aten.view.default and node.phase == pb.BACKWARD:
        op_global = "_view_or_reshape"
        writer.globals[op_global] = view_or_reshape
        return op_global, op
    writer.globals[op_global] = grad_mode_kernels.kernel(node.op, op)
    return op_global, op


def view_or_reshape(tensor: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """A backward `view`, or eager's `reshape` (a copy) where the tensor's layout allows no
    view. The graph's views were traced for its tangents' layouts, and a gradient may come
    otherwise: an output no loss reads gets a broadcast zero, and the op adding it to the
    loss's gradient then takes the other operand's layout, as eager's (which adds nothing)
    does. PatchTSTForPrediction's prediction, laid out transposed, failed there ("view size
    is not compatible with input tensor's size and stride"); eager's code reshaped, copying.
    Copying the gradient into the traced layout instead ran the ops after it in another
    layout than eager's: CLIP's `logit_scale` gradient came out 1.3e-7 off. The copy is a
    tensor the plan does not count, made only where the step failed before."""
    try:
        return tensor.view(shape)
    except RuntimeError:
        return tensor.reshape(shape)


def _arguments(graph: Graph, writer: _Writer, node_id: int, placeholders=(),
               node: pb.Node | None = None) -> list[str]:
    """The node's (or fused member `node`'s) arguments as source; values in `placeholders`
    as placeholder tensors."""
    node = graph.node(node_id) if node is None else node

    def tensor(ref: TensorRef):
        if ref.value_id in placeholders:
            return _Marker(f"_placeholder({ref.value_id})")
        return _Marker(_tensor_name(ref.value_id))

    device = writer.globals["_device"]
    args = [writer.expression(to_torch_argument(decode(a), tensor, device)) for a in node.args]
    args += [f"{kw.name}={writer.expression(to_torch_argument(decode(kw.value), tensor, device))}"
             for kw in node.kwargs]
    return args


def _skip_lines(graph: Graph, writer: _Writer, node_id: int, missing, save: bool) -> list[str]:
    """Advance the generator past a random node as eager's run would (`ir.rng`): save the
    state first if a later run replays it, run the op on placeholders for the inputs that
    are not at hand, and drop the result at once."""
    op_global, _ = _op_global(graph, writer, node_id)
    lines = [f"_rng{node_id} = _get_rng()"] if save else []
    lines.append(f"{op_global}({', '.join(_arguments(graph, writer, node_id, set(missing)))})")
    return lines


def _call_lines(graph: Graph, writer: _Writer, node_id: int, mode: str) -> list[str]:
    """One compute step. `mode`: "replay" runs from the node's saved RNG state, "save"
    saves the state before a drawing run that a later run replays, "" just runs. A fused
    node outside a compiled region runs its members one by one, each intermediate
    deleted after the last member reading it (more memory than its plan counts: the
    inductor backend compiles fused nodes)."""
    node = graph.node(node_id)
    if is_fused(node):
        lines, outputs = [], set(node.outputs)
        last_read = {v: i for i, m in enumerate(node.body) for v in m.inputs}
        for i, member in enumerate(node.body):
            lines += _member_lines(graph, writer, node_id, member)
            dead = [v for m in node.body for v in m.outputs if last_read.get(v) == i and v not in outputs]
            if dead:
                lines.append(f"del {', '.join(_tensor_name(v) for v in dead)}")
        return lines
    return _member_lines(graph, writer, node_id, node, mode)


def _member_lines(graph: Graph, writer: _Writer, node_id: int, node: pb.Node, mode: str = "") -> list[str]:
    """The lines that run `node` (node `node_id`, or one member of fused node `node_id`)."""
    if mode == "" and plain_detach(graph, node):
        return [f"{_tensor_name(node.outputs[0])} = {_tensor_name(node.inputs[0])}"]
    op_global, op = _op_global(graph, writer, node_id, node)
    args = _arguments(graph, writer, node_id, node=node)
    call = f"{op_global}({', '.join(args)})"
    lines = []
    if mode == "replay":
        call = f"_replay(_rng{node_id}, {op_global}, {', '.join(args)})"
        lines += [f"_declared({_tensor_name(v)}, {v}, {node_id})"
                  for v in sorted(writer.placeheld.get(node_id, set()) & set(node.inputs))]
    elif mode == "save":
        lines.append(f"_rng{node_id} = _get_rng()")
    outputs = [_tensor_name(v) for v in node.outputs]
    positions = output_positions(node, op)
    reused = _reused_buffer(graph, node, op) if mode == "" else None
    if reused is not None:
        functional, out_name, laid_out = reused
        writer.globals[f"{op_global}_f"] = getattr(functional, "_op", functional)
        rest = [a for a in args if not a.startswith(f"{out_name}=")]
        lines += [f"if {' and '.join(f'{_tensor_name(v)}.is_contiguous()' for v in laid_out)}:",
                  f"    {outputs[0]} = {call}", "else:",
                  f"    {outputs[0]} = {op_global}_f({', '.join(rest)})"]
    elif positions is None:
        lines.append(f"{outputs[0]} = {call}")
    else:
        lines.append(f"_r = {call}")
        for name, index in zip(outputs, positions, strict=True):
            lines.append(f"{name} = _r[{index}]")
        lines.append("del _r")
    return lines


def _reused_buffer(graph: Graph, node: pb.Node, op) -> tuple[object, str, list[int]] | None:
    """For a node buffer reuse made write into a dying input (`frontends/buffer_reuse.py`:
    a backward op's `out=` overload, flagged mutating): its functional op, the out
    argument's name, and the values that must be contiguous for the `out=` form to give the
    functional op's bits: the buffer and every input of the result's shape, as they were
    traced. Else None. Why: they arrive otherwise where an output's gradient is read as it
    arrives (a loss reading a softmax output transposed): `_log_softmax_backward_data`
    written into a transposed buffer gave gradients 0.11 off eager's 0.125 (found by a
    review); the call then runs the functional op, as eager does."""
    if not (node.mutating and node.phase == pb.BACKWARD and len(node.outputs) == 1
            and isinstance(op, torch._ops.OpOverload)):
        return None
    found = functional_overload(op)
    if found is None:
        return None
    functional, out_name = found
    buffer = next((decode(kw.value) for kw in node.kwargs if kw.name == out_name), None)
    if not isinstance(buffer, TensorRef) or set(graph.users(buffer.value_id)) != {node.id}:
        return None   # not reuse's: a buffer read after it needs the write, whatever its layout
    shape = list(graph.value(node.outputs[0]).shape)
    laid_out = [buffer.value_id] + [v for v in dict.fromkeys(node.inputs)
                                    if v != buffer.value_id and list(graph.value(v).shape) == shape]
    return functional, out_name, laid_out


def plain_detach(graph: Graph, node: pb.Node) -> bool:
    """Whether `node` detaches a value a segment computed, into one no output is: the
    segments run without autograd, so the value needs no gradient and its detached alias
    (same storage, version counter, shape and strides) is the value itself. The joint
    graph detaches each ReLU's output for its backward, twice: 52 dispatcher calls a
    ResNet-18 step made for nothing (eager's autograd makes none)."""
    if node.op != "aten.detach.default" or len(node.inputs) != 1 or len(node.outputs) != 1:
        return False
    source = node.inputs[0]
    return (graph.producer(source) is not None
            and source not in graph.output_value_ids and node.outputs[0] not in graph.output_value_ids)


def _placeholder_function(graph: Graph, device: torch.device):
    """`_placeholder(value_id)`: an uninitialized tensor with the value's shape, strides and
    dtype, standing in for an input a skipped random op does not have at hand."""
    def placeholder(value_id: int) -> torch.Tensor:
        return empty_tensor(graph.value(value_id), device)
    return placeholder


def _declared_shapes(graph: Graph):
    """`_declared(tensor, value_id, node_id)`: raise where a random node's input, which a
    skip ran the node on a placeholder for, is not of the shape and dtype the graph
    declares. The skip drew as many numbers as the placeholder has: found by hunt68, a file
    declaring a dropout's input at half its batch trained with every later draw shifted
    (6.1 off, silently), under schedules running another dropout first."""
    def declared(tensor: torch.Tensor, value_id: int, node_id: int) -> None:
        value = graph.value(value_id)
        if list(tensor.shape) != list(value.shape) or tensor.dtype != torch_dtype(value.dtype):
            raise RematIRError(
                f"{graph.describe_value(value_id)} is {list(tensor.shape)} {tensor.dtype} when it runs "
                f"where the graph declares {list(value.shape)} {torch_dtype(value.dtype)}: random "
                f"{graph.describe_node(node_id)}, run earlier on a placeholder of the declared shape "
                f"to keep eager's draws, drew other numbers than eager's. The graph is not the "
                f"model's (a file edited by hand, or lowered for other inputs): lower it again")
    return declared


def _rng_functions(device: torch.device):
    """(get state, replay) for the generator that random ops on `device` draw from.

    CUDA states are 16-byte host tensors. The CPU generator's state is 5 KB, so
    it is kept as a cloned Generator (no tensor stays allocated); a replay
    materializes it for the moment it is set.
    """
    if device.type == "cuda":
        def get_state():
            return torch.cuda.get_rng_state(device)

        def set_state(state):
            torch.cuda.set_rng_state(state, device)
    else:
        generator = torch.default_generator
        get_state = generator.clone_state

        def set_state(state):
            generator.set_state(state.get_state())

    def replay(state, op, *args, **kwargs):
        current = get_state()
        set_state(state)
        try:
            return op(*args, **kwargs)
        finally:
            set_state(current)

    return get_state, replay
