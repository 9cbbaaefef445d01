"""Lowering with costs: a frontend's graph, then the costs profiling gives it.

Frontends only lower (`remat_ir.frontends.torch.lower`, `remat_ir.frontends.onnx.lower`):
costs come from executing ops, which belongs to the runtimes
(`remat_ir.runtimes.profiling.estimate_costs`), and the two layers do not import each
other. This facade module joins them, so that callers keep one call per model:

    graph = lower_torch(model, example_inputs, cost_model="flops")

`cost_model` is "profile" (each op timed inside whole store-everything steps on
`device`, by default the inputs' device), "isolated" (each distinct op timed alone),
"flops" (estimated from FLOPs and bytes, nothing runs: coarse) or None (no costs yet:
`add_costs` later, as `remat_ir.remat` does after checking its plan cache); see
`runtimes.profiling`.
"""

from __future__ import annotations

from remat_ir.ir import Graph

__all__ = ["lower_torch", "lower_onnx", "lower_onnx_module", "add_costs", "check_cost_model", "for_backend"]


def check_cost_model(cost_model, *, allow_none: bool = True) -> None:
    """ValueError naming the cost models there are (`runtimes.profiling.COST_MODELS`)
    unless `cost_model` is one of them (or None, when `allow_none`); called before
    tracing, so that a typo fails at once rather than after a minute of lowering."""
    from remat_ir.runtimes.profiling import check_cost_model as check

    check(cost_model, allow_none=allow_none)


def add_costs(graph: Graph, cost_model: str, device=None, *, model=None, example=None,
              progress=None, backend: str = "eager") -> Graph:
    """Fill every node's cost with `cost_model` on `device` (by default the device the
    graph was lowered on, its `provenance.cost_device`); returns `graph`. "profile" times
    whole steps on `model`'s tensors and the `example` call's inputs, `(args, kwargs)`
    (without them it keeps isolated times, and `provenance.cost_model.note` says so).
    `progress` (a callable taking one line) hears how far profiling got. Unless
    `cost_model` is "flops", the host link offloading plans with is measured too, and
    with "profile" on a device whose transfers overlap compute (CUDA) the host's time
    per transfer is calibrated inside a step (`runtimes/transfer_calibration.py`).
    `backend`: the runtime backend plans will run on ("inductor": "profile" shares
    compiled regions' times among their nodes, `runtimes/compiled_costs.py`)."""
    import torch

    from remat_ir.runtimes.profiling import estimate_costs
    from remat_ir.runtimes.torch import resident_values
    from remat_ir.runtimes.transfer_calibration import calibrate_issue_seconds
    from remat_ir.runtimes.transfers import host_link

    check_cost_model(cost_model, allow_none=False)
    run_device = torch.device(device if device is not None
                              else graph.proto.provenance.cost_device or "cpu")
    values = None
    if cost_model == "profile" and model is not None and example is not None:
        args, kwargs = example
        values = resident_values(model, graph, args, kwargs)
    estimate_costs(graph, cost_model, run_device, values=values, low_memory=_sqrt_schedule,
                   progress=progress, backend=backend)
    if values is not None:
        _price_call_overhead(graph, model, example, run_device)
    if cost_model != "flops":  # "flops" runs nothing
        link = graph.proto.provenance.host_link
        for field, value in host_link(run_device).items():
            setattr(link, field, value)
        if values is not None and link.overlapped:
            # A transfer costs the host more inside a step than alone (H100: about 155 us
            # against the isolated measure): calibrated on a step with round trips.
            fitted = calibrate_issue_seconds(graph, values, run_device, progress=progress)
            if fitted is not None:
                link.issue_s = max(link.issue_s, fitted)
    return graph


def _price_call_overhead(graph: Graph, model, example: tuple, device) -> None:
    """Record the runtime's own time per training call outside its segments
    (`runtimes/call_overhead.py`: the same for every plan, and left out it prices each
    recomputation as a larger share of the step than it is), or say in
    `cost_model.note` that it was not measured."""
    from remat_ir.runtimes.call_overhead import measure_call_overhead

    record = graph.proto.provenance.cost_model
    args, kwargs = example
    seconds, why = measure_call_overhead(graph, model, args, kwargs, device)
    if seconds is None:
        record.note = (f"{record.note + '; ' if record.note else ''}the runtime's time per call "
                       f"was not measured ({why}): it is left out")
    else:
        record.call_overhead_s = seconds


def _sqrt_schedule(graph: Graph):
    """Chen's sqrt checkpoints: the low-memory schedule "profile" calibrates its footprint
    term on (`runtimes/calibration.py`); cheap to build, about 1.4x a step to run. Not
    stored in the graph (as `solve` would): its predicted time is made on the isolated
    costs the calibration then replaces, and a stored copy would go stale."""
    from remat_ir.solvers.baselines import sqrt

    return sqrt(graph, None)


def for_backend(graph: Graph, backend: str) -> Graph:
    """The graph plans for `backend` are made on: for "inductor", a copy with each
    pointwise chain Inductor fuses as one node (`ir.fusion`: its intermediates are never
    in memory, so the planner does not pay for them); for "eager", `graph` itself. Costs
    first: profiling runs the unfused graph's ops."""
    from remat_ir.runtimes.compiled import check_backend, fuse_for_inductor

    return fuse_for_inductor(graph) if check_backend(backend) == "inductor" else graph


def lower_torch(model, example_inputs, *, example_kwargs: dict | None = None,
                cost_model: str | None = "profile", device=None, backend: str = "eager",
                fuse: bool = True, outputs=None, pure_ops=()) -> Graph:
    """`frontends.torch.lower(model, example_inputs, example_kwargs=..., outputs=..., pure_ops=...)` with costs from
    `cost_model` measured on `device` for the runtime `backend` (see the module
    docstring), then, unless `fuse` is False, `for_backend(graph, backend)`."""
    from remat_ir.frontends.torch import example_arguments, lower
    from remat_ir.runtimes.compiled import check_backend

    check_cost_model(cost_model)
    check_backend(backend)  # before the trace, as the cost model is
    graph = lower(model, example_inputs, example_kwargs=example_kwargs, fusing=backend == "inductor",
                  outputs=outputs, pure_ops=pure_ops)
    if cost_model is None:
        return graph
    graph = add_costs(graph, cost_model, device, model=model,
                      example=example_arguments(example_inputs, example_kwargs), backend=backend)
    return for_backend(graph, backend) if fuse else graph


def lower_onnx_module(module, example_inputs: tuple, *, cost_model: str | None = "profile",
                      device=None) -> Graph:
    """`frontends.onnx.lower_module` (an imported `OnnxModule`) with costs."""
    from remat_ir.frontends.onnx import lower_module

    check_cost_model(cost_model)
    graph = lower_module(module, example_inputs)
    if cost_model is None:
        return graph
    return add_costs(graph, cost_model, device, model=module, example=(tuple(example_inputs), {}))


def lower_onnx(model_or_path, example_inputs=None, *, cost_model: str | None = "profile",
               device=None, trainable="initializers") -> Graph:
    """`frontends.onnx.lower` (a path, bytes or `onnx.ModelProto`) with costs; see
    `frontends.onnx.to_torch` for `example_inputs` and `trainable`."""
    from remat_ir.frontends.onnx import to_torch

    check_cost_model(cost_model)
    module, examples = to_torch(model_or_path, example_inputs, trainable=trainable)
    return lower_onnx_module(module, examples, cost_model=cost_model, device=device)
