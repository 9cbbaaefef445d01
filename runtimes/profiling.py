"""Cost models: how long each IR node takes, written into `node.cost`.

Profiling executes ops, so it lives with execution (next to `memory.measure_peak`,
which it uses), not in the frontends: a frontend lowers a model without costs,
and the facade (`remat_ir.lowering`) adds them with `estimate_costs`.

- "profile" (the default): first every distinct op is run alone, as "isolated"
  does, which gives the memory facts below; then the store-everything schedule
  runs as the runtime runs it, on the model's own tensors, and each node's time is
  what it took inside those steps (`timing.py`: medians over a few steps after a
  warm-up), with the time outside ops recorded as the step's overhead
  (`Provenance.cost_model.step_overhead_s`). A low-memory schedule (Chen's sqrt,
  given by the facade) is timed beside it, interleaved, to price the memory a step
  holds (`calibration.py`: `cost_model.peak_byte_s`; node times become net of
  store-everything's footprint). Measured on CPU (GPT-2 4 layers, the quick
  benchmark): isolated times put recomputation at about 1.4x its cost in the step,
  and in-step times alone still predicted plans 7-13% slower than measured, since
  a step holding less memory runs all its ops faster; with the footprint term,
  predictions fall within a few percent. If the step cannot run (out of memory),
  the isolated times stay, and `cost_model.note` says why; so it does when the
  footprint term is left out. For plans run compiled (`backend="inductor"`), the
  store-everything step then runs compiled too, and each region's time is shared
  among its nodes (`compiled_costs.py`; `cost_model.backend` says which). On CUDA
  each node also gets its host and device seconds (`timing.split_timelines`,
  `cost.host_s`/`device_s`, `cost_model.two_timelines`; a compiled region's are shared
  among its nodes as its time is), and the footprint term, whose fit assumes one
  timeline, is left out.
- "isolated": every distinct (op, input shapes/strides/dtypes, other arguments)
  is run on the target device with synthetic inputs (floats normal, integers
  and booleans zero, so indices stay in range): one warm-up, then the median of
  `repeats` runs, timed with CUDA events on a GPU.
- "flops": FLOPs counted by torch's FlopCounterMode on meta tensors, and bytes
  moved; time = overhead + max(FLOPs / rate, bytes / bandwidth), with rates set
  per device type, not measured: coarse, for graphs that cannot run here. Nothing
  runs, so storages keep their meta sizes and the only workspace recorded is the
  one that can be told without running: CPU casts of mixed-dtype operands
  (`cast_workspace`); a schedule planned on these costs can measure above its
  simulated peak wherever kernels use other workspace (convolutions).

Memory comes from the isolated runs only, never from timing, so the same graph
lowered twice gets the same bytes: one run under the allocator gives an op's
workspace, the peak it allocates beyond its outputs (CPU oneDNN convolutions and
their backward: up to 120 KB on a U-Net with 1 MB of activations), and the bytes
each new output's storage really holds: a kernel may return a small tensor in a
bigger storage than its meta kernel says (CPU `mse_loss` with mean reduction
returns its 0-dim loss in the storage of the unreduced tensor), and the graph's
storage is grown to that size. Nodes that cannot run on synthetic data fall back
to the analytic estimate, and say so (`cost.source`).

Profiling draws random numbers (dropout); the caller's RNG state is restored
so that lowering a model does not change the masks training will draw.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from remat_ir.ir import Graph, RematIRError, pb
from remat_ir.ir.schedules import store_all
from remat_ir.ir.arguments import TensorRef, decode
from remat_ir.ir.fusion import is_fused
from remat_ir.ir.memory import is_view, new_storages
from remat_ir.torchlib.generators import generators_kept
from remat_ir.torchlib.types import (DECLARED_WORKSPACES, empty_tensor, record_device, resolve_op,
                                     to_torch_argument)

from . import grad_mode_kernels
from .calibration import fit_peak_byte_cost
from .compiled import check_backend
from .compiled_costs import share_region_times
from .memory import measure_peak
from .timing import time_schedule, time_schedules

#: The cost models `estimate_costs` knows.
COST_MODELS = ("profile", "isolated", "flops")

#: What an op raises when synthetic inputs do not suit it (not our own bugs).
OP_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)

#: Analytic model per device type: (FLOP/s, bytes/s, fixed seconds per op).
RATES = {"cpu": (5e10, 1e10, 2e-6), "cuda": (5e13, 1.5e12, 5e-6)}

#: Revision of the "flops" model's formula, for caches of graphs lowered with it (the
#: solver benchmark's key) to know when their costs are stale. 2: a view moves no bytes;
#: 3: CPU casts of mixed-dtype operands are workspace (`cast_workspace`).
ANALYTIC_REVISION = 3

#: Pointwise ops whose CPU kernel casts operands of another dtype than their common one
#: into temporary tensors first, as (first, second) argument names; `cast_workspace`.
#: Other pointwise ops (`where`, `masked_fill`) read a boolean operand as it is.
CASTING_OPERANDS = {("self", "other"), ("grad_output", "mask")}


def _make_tensor(graph: Graph, value: pb.Value, device: torch.device) -> torch.Tensor:
    """Synthetic input: floats normal, integers and booleans zero (indices stay in range),
    written through a flat view of the whole storage: an expanded value (stride 0, such
    as the loss's gradient broadcast by a sum's backward) cannot be written through its
    own view, and an op reading one used to go unmeasured (no workspace recorded).

    The storage is as large as the value's IR storage, with the value at its offset in
    it, as in the step: a view's kernel may allocate after its whole storage (the
    functional `copy` behind `y[:, :k] = ...` clones the slice's storage: 4 KiB for a
    slice of a 16x64 float tensor, where a storage just holding the slice gives 3968
    bytes, and the plan counted 128 bytes too few per such copy)."""
    t = empty_tensor(value, device)
    extent = value.storage_offset * t.element_size() + t.untyped_storage().nbytes()
    elements = max(extent, graph.storage_data_bytes(value.storage_id)) // t.element_size()
    flat = torch.empty(elements, dtype=t.dtype, device=device)
    if t.dtype.is_floating_point:
        flat.normal_()
    else:
        flat.zero_()
    return flat.as_strided(t.shape, t.stride(), value.storage_offset)


#: Arguments that an op's kernel reads on the host, by op: the random state the
#: memory-efficient attention's forward returns as CPU scalars (outside CUDA graph
#: capture) for its backward to replay the dropout. A synthetic one on the GPU is
#: dereferenced on the host by the backward's launch: a segmentation fault, not an error
#: (seen on an H100, torch 2.11, under GPT-2's attention dropout). Not the other
#: attention kernels': flash attention's state is a device tensor of two 64-bit words,
#: and cuDNN's seed and offset are device scalars (torch's meta kernels and CUDA code).
HOST_ARGUMENTS = {
    "aten._scaled_dot_product_efficient_attention_backward.default": frozenset({"philox_seed", "philox_offset"}),
    "aten._efficient_attention_backward.default": frozenset({"philox_seed", "philox_offset"}),
}


def _on_host_where_read_there(node: pb.Node, op, args: list, kwargs: dict) -> None:
    """Move `node`'s synthetic `HOST_ARGUMENTS` to the CPU, in place."""
    names = HOST_ARGUMENTS.get(node.op)
    if not names:
        return
    for position, argument in enumerate(op._schema.arguments):
        if argument.name not in names:
            continue
        if position < len(args) and isinstance(args[position], torch.Tensor):
            args[position] = args[position].cpu()
        elif isinstance(kwargs.get(argument.name), torch.Tensor):
            kwargs[argument.name] = kwargs[argument.name].cpu()


def call_args(graph: Graph, node: pb.Node, tensors: dict[int, torch.Tensor], device):
    def tensor(ref: TensorRef):
        return tensors[ref.value_id]
    args = [to_torch_argument(decode(a), tensor, device) for a in node.args]
    kwargs = {kw.name: to_torch_argument(decode(kw.value), tensor, device) for kw in node.kwargs}
    return args, kwargs


def _signature(graph: Graph, node: pb.Node) -> tuple:
    """Nodes with equal signatures cost the same: measured once."""
    def describe(obj):
        if isinstance(obj, TensorRef):
            v = graph.value(obj.value_id)
            return ("T", tuple(v.shape), tuple(v.stride), v.dtype)
        if isinstance(obj, (list, tuple)):
            return tuple(describe(x) for x in obj)
        return repr(obj)
    return (node.op, describe([decode(a) for a in node.args]),
            tuple((kw.name, describe(decode(kw.value))) for kw in node.kwargs))


def _analytic(graph: Graph, node: pb.Node, device: torch.device) -> tuple[float, float, int]:
    """(seconds, FLOPs, bytes moved) from the FLOP counter on meta tensors. A view
    (allocates nothing, mutates nothing) moves no bytes: it costs the fixed overhead only.
    Pricing it as a copy of its input and output made views 7.5% of GPT-2's step."""
    moved = (0 if is_view(graph, node) and not node.mutating else
             sum(graph.value(v).size_bytes for v in list(node.inputs) + list(node.outputs)))
    flops = 0.0
    try:
        op = resolve_op(node.op)
        meta = torch.device("meta")
        tensors = {v: empty_tensor(graph.value(v), meta) for v in node.inputs}
        args, kwargs = call_args(graph, node, tensors, meta)
        with FlopCounterMode(display=False) as counter:
            op(*args, **kwargs)
        flops = float(counter.get_total_flops())
    except Exception:  # no meta kernel or FLOP formula: bytes alone decide
        pass
    return analytic_seconds(flops, moved, device.type), flops, moved


def cast_workspace(graph: Graph, node: pb.Node, device_type: str) -> int:
    """Bytes of the temporary copies a CPU pointwise op makes of its operands that are not
    of the operands' common dtype (TensorIterator casts them before the loop: `x * mask`
    with a boolean mask allocates the mask as floats, one activation more than its
    output). The "flops" model's workspace, since nothing runs; 0 on other devices, where
    kernels cast as they read."""
    if device_type != "cpu":
        return 0
    try:
        op = resolve_op(node.op)
    except Exception:
        return 0
    arguments = op._schema.arguments
    if (torch.Tag.pointwise not in op.tags or len(arguments) < 2 or len(node.args) < 2
            or (arguments[0].name, arguments[1].name) not in CASTING_OPERANDS):
        return 0
    operands = [decode(a) for a in node.args[:2]]
    if not all(isinstance(x, TensorRef) for x in operands):
        return 0
    values = [graph.value(x.value_id) for x in operands]
    meta = [empty_tensor(v, torch.device("meta")) for v in values]
    common = meta[0].dtype if arguments[1].name == "mask" else torch.result_type(*meta)
    return sum(t.numel() * common.itemsize for t in meta if t.dtype != common)


def declared_workspace(graph: Graph, node: pb.Node) -> int:
    """The workspace an op of remat-ir's own declares from its arguments' shapes, where its
    run on synthetic inputs cannot show it (`DECLARED_WORKSPACES`: the CTC loss's), for
    every cost model; 0 for other ops."""
    declared = DECLARED_WORKSPACES.get(node.op)
    if declared is None:
        return 0
    args = [decode(a) for a in node.args]
    return declared([empty_tensor(graph.value(a.value_id), torch.device("meta"))
                     if isinstance(a, TensorRef) else a for a in args])


def analytic_seconds(flops: float, moved: float, device_type: str) -> float:
    """The "flops" model's time of an op: launch overhead + max(FLOPs / rate, bytes moved /
    bandwidth) at `RATES[device_type]` (also how a benchmark prices a graph for a GPU it
    does not have, from the FLOPs and bytes its nodes record)."""
    rate, bandwidth, overhead = RATES.get(device_type, RATES["cpu"])
    return overhead + max(flops / rate, moved / bandwidth)


def priced_for(graph: Graph, device_type: str) -> Graph:
    """`graph`, changed in place and returned, with every node's time re-priced by the
    "flops" model at `device_type`'s rates from the FLOPs and bytes its nodes record
    (memory untouched): how a benchmark or a test plans for a GPU that is not there."""
    if device_type not in RATES:
        raise ValueError(f"no FLOP-model rates for device type {device_type!r}; "
                         f"known: {', '.join(sorted(RATES))}")
    for node in graph.proto.nodes:
        node.cost.time_s = analytic_seconds(node.cost.flops, node.cost.bytes_accessed, device_type)
    graph.proto.provenance.cost_device = f"{device_type} (FLOP-model rates, not measured)"
    graph.proto.provenance.cost_model.two_timelines = False  # host and device times were measured ones
    return graph


def output_tensors(node: pb.Node, result) -> list:
    """The op's result per `node.outputs` position, as the runtime binds them
    (`output_indices` pick from a tuple result; without them a lone output is the result)."""
    if not node.output_indices and len(node.outputs) == 1 and isinstance(result, torch.Tensor):
        return [result]
    indices = list(node.output_indices) or list(range(len(node.outputs)))
    return [result[i] for i in indices]


def _real_storage_bytes(node: pb.Node, result, positions: list[int]) -> int:
    """Bytes the real kernel's storage holds for the outputs at `positions` (0 if unknown)."""
    try:
        outputs = output_tensors(node, result)
        return max(outputs[p].untyped_storage().nbytes() for p in positions)
    except (IndexError, TypeError, AttributeError, RuntimeError, NotImplementedError):
        return 0


def _measure(graph: Graph, node: pb.Node, device: torch.device,
             repeats: int) -> tuple[float, int, tuple[int, ...]]:
    """(median seconds, workspace bytes, real bytes per new storage in `new_storages`
    order): the workspace is the op's allocation peak beyond its outputs' storages."""
    op = resolve_op(node.op)
    tensors = {v: _make_tensor(graph, graph.value(v), device) for v in node.inputs}
    args, kwargs = call_args(graph, node, tensors, device)
    _on_host_where_read_there(node, op, args, kwargs)
    op = grad_mode_kernels.kernel(node.op, op)
    op(*args, **kwargs)  # warm-up (and the error, if it cannot run)
    measured = measure_peak(lambda: op(*args, **kwargs), device)
    new = new_storages(graph, node)
    real = tuple(max(graph.storage_data_bytes(s), _real_storage_bytes(node, measured.result, positions))
                 for s, positions in new.items())
    del measured.result
    # The measured peak holds the outputs at their allocated (rounded) sizes.
    workspace = max(0, measured.peak_bytes - sum(graph.allocation_bytes(r) for r in real))
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op(*args, **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            op(*args, **kwargs)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), workspace, real


def check_cost_model(model, *, allow_none: bool = False) -> None:
    """ValueError naming the cost models there are, unless `model` is one of them (or None,
    "no costs yet", where the caller allows it)."""
    if model is None and allow_none:
        return
    if model not in COST_MODELS:
        raise ValueError(f"cost_model must be 'profile' (time each op inside whole steps), "
                         f"'isolated' (time each op alone) or 'flops' (estimate from FLOPs and "
                         f"bytes){' or None (no costs)' if allow_none else ''}, not {model!r}")


def estimate_costs(graph: Graph, model: str, device: torch.device | str, *, repeats: int = 5,
                   values: Mapping[int, torch.Tensor] | None = None,
                   low_memory: Callable[[Graph], pb.Schedule] | None = None,
                   progress: Callable[[str], None] | None = None, backend: str = "eager") -> None:
    """Fill `cost` of every node of `graph` with the chosen model (`COST_MODELS`), for
    `device`, which is recorded as the graph's `provenance.cost_device`, and the model
    as its `provenance.cost_model`. "profile" times the step on `values`, the model's
    resident tensors by value id (`runtimes.torch.resident_values`), then calibrates
    the footprint term on `low_memory(graph)`, a schedule holding much less memory
    (`calibration.py`; the facade passes Chen's sqrt schedule). Without values it keeps
    the isolated times, without a low-memory schedule it leaves the footprint term
    out; `cost_model.note` says so. `progress` hears how far profiling got.
    `backend`: the runtime backend plans will run on; with "inductor", "profile" then
    runs the store-everything step compiled and shares each region's time among its
    nodes (`compiled_costs.py`), recorded as `cost_model.backend`."""
    check_cost_model(model)
    check_backend(backend)
    fused = next((n for n in graph.proto.nodes if is_fused(n)), None)
    if fused is not None:
        raise ValueError(f"{graph.describe_node(fused.id)} is a fused node: costs are measured on "
                         "the graph before fusing (lower_torch(..., fuse=False), or the graph "
                         "before lowering.for_backend), then fused")
    device = torch.device(device)
    record_device(graph.proto.provenance, device)
    graph.proto.provenance.ClearField("cost_model")
    graph.proto.provenance.cost_model.name = model
    measured: dict[tuple, tuple[float, int, tuple[int, ...], int]] = {}
    storages = {s.id: s for s in graph.proto.storages}
    devices = [device] if device.type == "cuda" else []
    with generators_kept(devices), torch.no_grad():
        for node in graph.proto.nodes:
            seconds, flops, moved = _analytic(graph, node, device) if model == "flops" else (0.0, 0.0, 0)
            source = pb.ANALYTIC
            workspace = cast_workspace(graph, node, device.type) if model == "flops" else 0
            if model != "flops":
                key = _signature(graph, node)
                if key not in measured:
                    try:
                        measured[key] = (*_measure(graph, node, device, repeats), pb.PROFILED)
                    except RematIRError:   # remat-ir's own (a profiler session of the caller's)
                        raise
                    except Exception:  # noqa: BLE001 - cannot run on drawn inputs: estimate instead.
                        # Not only OP_ERRORS: a check false of drawn values (the README's
                        # `assert (h.abs() < 50).all()`, a custom op's own `assert`, its own
                        # exception class) raised out of `remat` with eager's message, as if
                        # the user's batch had failed it (found by hunt56, hunt57).
                        measured[key] = (_analytic(graph, node, device)[0], 0, (), pb.ANALYTIC)
                seconds, workspace, real, source = measured[key]
                for storage, size in zip(new_storages(graph, node), real):
                    storages[storage].size_bytes = max(storages[storage].size_bytes, size)
            node.cost.time_s, node.cost.source = seconds, source
            node.cost.flops, node.cost.bytes_accessed = flops, moved
            node.cost.workspace_bytes = max(workspace, declared_workspace(graph, node))
    if progress is not None and model != "flops":
        progress(f"profiling: {len(measured)} distinct ops timed alone")
    if model == "profile":
        compiled = backend == "inductor"  # op-by-op times first: they are shared by regions
        _time_in_step(graph, device, values, None if compiled else low_memory, progress)
        if compiled and graph.proto.provenance.cost_model.timed_schedule:
            _time_compiled(graph, device, values, progress)


def _time_compiled(graph: Graph, device: torch.device, values, progress) -> None:
    """Replace the op-by-op times by the store-everything step's compiled regions' times,
    shared among their nodes (`compiled_costs.py`); keep them, saying why in
    `cost_model.note`, where the compiled step cannot run."""
    record = graph.proto.provenance.cost_model
    eager_seconds = {n.id: n.cost.time_s for n in graph.proto.nodes}
    try:
        timing = time_schedule(graph, store_all(graph), values, device, backend="inductor",
                               progress=progress)
    except (*OP_ERRORS, KeyError) as exc:
        record.note = (f"{record.note + '; ' if record.note else ''}the store-everything step "
                       f"could not run compiled ({_reason(exc)}): costs are op-by-op times")
        return
    costs = {**timing.node_seconds(),
             **share_region_times(graph, timing.regions, timing.region_seconds(), eager_seconds)}
    for node_id, seconds in costs.items():
        graph.node(node_id).cost.time_s = seconds
    if record.two_timelines:  # CUDA: the regions' host and device seconds, shared the same way
        host, device = timing.region_host_device()
        eager_host = {n.id: n.cost.host_s for n in graph.proto.nodes}
        eager_device = {n.id: n.cost.device_s for n in graph.proto.nodes}
        outside = timing.node_host_device()  # steps outside regions, timed one by one
        hosts = {**{n: h for n, (h, _) in outside.items()},
                 **share_region_times(graph, timing.regions, host, eager_host)}
        devices = {**{n: d for n, (_, d) in outside.items()},
                   **share_region_times(graph, timing.regions, device, eager_device)}
        for node_id, seconds in costs.items():
            cost = graph.node(node_id).cost
            cost.host_s, cost.device_s = hosts.get(node_id, seconds), devices.get(node_id, 0.0)
    record.backend, record.timed_steps = "inductor", timing.steps
    record.step_overhead_s = timing.overhead_s
    record.note = "the footprint term is not calibrated on compiled steps: it is left out"


def _time_in_step(graph: Graph, device: torch.device, values, low_memory, progress) -> None:
    """Replace the isolated times by the times the nodes take inside store-everything
    steps, timed beside a low-memory schedule that calibrates the footprint term (see the
    module docstring and `calibration.py`); keep the isolated times, or leave the
    footprint term out, saying why in `cost_model.note`, where that cannot be done."""
    record = graph.proto.provenance.cost_model
    if values is None:
        record.note = ("no model tensors were given to time the step with; each op's time "
                       "is its isolated one")
        return
    store, low, left_out = store_all(graph), None, ""
    two_timelines = device.type == "cuda"
    if two_timelines:
        # The fit (calibration.py) prices one timeline; on the H100 its price came out 0.
        left_out = "ops run asynchronously to the host here (two timelines), which the fit does not model"
    elif low_memory is None:
        left_out = "no low-memory schedule was given"
    else:
        try:
            low = low_memory(graph)
        except Exception as exc:  # noqa: BLE001 - only the footprint term is lost, and said
            left_out = f"building the low-memory schedule failed ({_reason(exc)})"
    try:
        try:
            timings = time_schedules(graph, [store] + ([low] if low else []), values, device,
                                     progress=progress)
        except (*OP_ERRORS, KeyError) as exc:
            if low is None:
                raise
            left_out = f"the low-memory schedule {low.name!r} could not run ({_reason(exc)})"
            low, timings = None, [time_schedule(graph, store, values, device, progress=progress)]
    except (*OP_ERRORS, KeyError) as exc:  # out of memory is a RuntimeError too
        record.note = (f"the store-everything step could not run on {device} ({_reason(exc)}); "
                       "each op's time is its isolated one")
        return
    costs = timings[0].node_seconds()
    if low is not None:
        fit = fit_peak_byte_cost(graph, store, timings[0], low, timings[1])
        if fit is None:
            left_out = (f"the low-memory schedule {low.name!r} holds too much of "
                        "store-everything's peak to calibrate on")
        else:
            (record.peak_byte_s, costs), record.calibration_schedule = fit, low.name
    host_device = timings[0].node_host_device()
    for node_id, seconds in costs.items():
        cost = graph.node(node_id).cost
        cost.time_s, cost.source = seconds, pb.TIMED_IN_STEP
        if two_timelines:
            cost.host_s, cost.device_s = host_device.get(node_id, (seconds, 0.0))
    record.two_timelines = two_timelines
    record.timed_schedule, record.timed_steps, record.backend = "store_all", timings[0].steps, "eager"
    record.step_overhead_s = timings[0].overhead_s
    if left_out:
        record.note = f"{left_out}: the footprint term is left out"


def scale_profile(graph: Graph, source: Graph, inputs: str) -> None:
    """Give `graph` the in-step times of `source`, a lowering of the same model for other
    input shapes, wired alike (`ir.fingerprint.wiring_fingerprint`: the same node ids),
    each scaled by the bytes its node reads and writes here over there; keep `graph`'s
    own memory facts (its isolated runs). `inputs` names what `source` was lowered for.

    Why: a new shape whose plan is reused from another (`solvers.reusable`) needs no
    costs to be planned, only its memory facts; timing its store-everything step beside
    the low-memory one took 0.7-1.0 s of the 2.4 s a new length cost on a 4-layer Llama,
    for a predicted step time. Scaled by traffic, an elementwise op's time follows its
    bytes, a matrix product's (input activations times a weight, or their product into a
    weight gradient) follows the rows it runs; a fixed per-op cost is scaled with it, so
    small ops at a shorter length are priced low (`benchmarks/new_shapes.py` measures
    the prediction against a profile of the shape)."""
    def traffic(g: Graph, node: pb.Node) -> int:
        return sum(g.value(v).size_bytes for v in (*node.inputs, *node.outputs))

    for node in graph.proto.nodes:
        there = source.node(node.id)
        ratio = traffic(graph, node) / max(1, traffic(source, there))
        node.cost.time_s = there.cost.time_s * ratio
        node.cost.host_s, node.cost.device_s = there.cost.host_s * ratio, there.cost.device_s * ratio
        node.cost.source = there.cost.source
    graph.proto.provenance.host_link.CopyFrom(source.proto.provenance.host_link)  # calibrated there
    record = graph.proto.provenance.cost_model
    record.CopyFrom(source.proto.provenance.cost_model)
    record.note = (f"times scaled from the profile of {inputs} by each node's bytes read and "
                   f"written (its plan was reused from there: nothing was timed for these "
                   f"shapes); memory from its own isolated runs")


def _reason(exc: Exception) -> str:
    """An exception in one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
