"""The runtime's own time per training call, outside its generated segments: the time
model's `CostModel.call_overhead_s`.

Why: the time model sums a schedule's ops and what its segments spend outside them
(`timing.py`, `step_overhead_s`), as the segments run alone. A training call through
`ScheduledModule` also checks what the forward read and which plan fits, binds the
inputs, runs autograd's nodes around the segments and hands the gradients over. That
time is the same for every plan of a graph; left out, every recomputation is priced as
a larger share of the step than it is, and deep plans are predicted slower than they
run. On CPU it was 1-2 ms of the quick GPT-2's 40 ms step
(`benchmarks/torch_overhead.py`); on a GPU whose step the host bounds (the quick GPT-2
on an H200: 10.5 ms of host time per step) it is a larger share still.

How: real calls of the store-everything schedule on the model's own tensors, forward
and backward, each timed whole and, in the same call, inside its segments (the forward
segment, and each resumption of the backward segment); the call's time outside them
is its overhead, and the median over the rounds is kept. Pairing within one call
matters on a shared machine: comparing real calls with separate segment-only steps
gave 0.06 ms in one run and 25.8 ms in the next, against about 1 ms. On CUDA the
times are the host's (no synchronization inside the call), which is where this work
is done.

The call leaves the caller's state as it found it: the parameters' `.grad`, the
buffers (a step updates running statistics), the parameters the forward writes in place
(a decay under `no_grad`, `nn.Embedding(max_norm=)`'s renormalization), the tensors it
stores on its modules, and the random generators are put back. (The parameters and
stores were not, found by a review: `remat()` itself had run a forward's `mul_(0.5)` of
a weight six times, and training started from 1/64 of eager's weight.)
Inputs that require a gradient are given to the calls as detached copies, so that
theirs stays as it was. Not measured (None, with why) under torch.distributed (a
backward would reduce across ranks), where a parameter holds a hook (a user's, an
optimizer stepping in the backward; hooks on a gradient's accumulator are not seen and
would run), for a model in eval mode (a call then runs the model as it is), or where a
call fails.

Priced in full, on either timeline: the checks before the forward run before the first
op is issued, so they add to any step; the part during the backward (autograd's nodes,
handing gradients over) overlaps device work on a GPU step the device bounds, which
the constant then overprices. Measured on the eager runtime for either backend (the
inductor runtime's call, whose regions hand gradients over otherwise, is not measured
apart)."""

from __future__ import annotations

import json
import statistics
import time

import torch
from torch.utils import _pytree as pytree

from remat_ir.ir import Graph, pb, store_all
from remat_ir.torchlib.generators import generators_kept

from .autocast_anchors import calls_forgotten
from .timing import _synchronize

#: Timed calls, after one warm-up call (which compiles the segments).
ROUNDS = 5
#: An attribute a module did not hold before the calls.
_ABSENT = object()


def measure_call_overhead(graph: Graph, model: torch.nn.Module, args: tuple, kwargs: dict,
                          device: torch.device | str, rounds: int = ROUNDS) -> tuple[float | None, str]:
    """(seconds a training call of `graph`'s store-everything schedule spends outside its
    segments, "") as the module docstring says, or (None, why it was not measured)."""
    from .torch import ScheduledModule, _Lowered, world_size

    device = torch.device(device)
    parameters = list(model.parameters())
    if world_size() > 1:
        return None, "under torch.distributed"
    if not model.training:
        return None, "the model is in eval mode"
    if any(p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) for p in parameters):
        return None, "a parameter holds a hook"
    if not all(p.is_leaf for p in parameters):
        # `functional_call(scheduled, fast_weights, x)` (MAML's outer step): the timed
        # calls' backward would run on through the caller's graph behind those weights
        # (hunt63: its leaves' gradients 36.0 off eager's, or that graph freed before the
        # caller's own backward).
        return None, "a parameter is computed by the caller (functional_call's weights)"
    # Inputs that require a gradient get one from each call: detached copies take them.
    # Inputs the forward writes into (`BUFFER_UPDATE`s of user inputs: labels it masks)
    # are copies, so that timing leaves the caller's as they were.
    updated = {o.name for o in graph.proto.outputs if o.role == pb.BUFFER_UPDATE}
    positions = [e.user_input_position for e in graph.user_inputs() if e.name in updated]
    written = set()
    if positions:   # binding the inputs takes a store-everything schedule: only where needed
        leaves = _Lowered(model, graph, store_all(graph)).flat_inputs(tuple(args), dict(kwargs))
        written = {id(leaves[p]) for p in positions}
    args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().requires_grad_() if t.requires_grad else
        t.clone() if id(t) in written else t, (args, kwargs))
    grads = [p.grad for p in parameters]
    # What the calls may write: the buffers, and the parameters the graph updates.
    named = dict(model.named_parameters(remove_duplicate=False))
    buffers = list(model.buffers()) + [named[name] for name in sorted(updated) if name in named]
    versions = [b._version for b in buffers]
    # What the calls store on modules, put back at the end, and the attributes a first
    # call's setup assigns (`torch.assigned_after`), put back after each call: the next
    # would find its flag set, which the graph was not lowered for.
    setup = len(json.loads(graph.proto.metadata.get("torch.assigned_after", "[]")))
    stores = [(model.get_submodule(path), key) for path, key, *_ in
              json.loads(graph.proto.metadata.get("torch.assigned_after", "[]"))
              + json.loads(graph.proto.metadata.get("torch.stored_attributes", "[]"))]
    held = [module.__dict__.get(key, _ABSENT) for module, key in stores]

    def put_back(count: int) -> None:
        for (module, key), value in zip(stores[:count], held):
            if value is _ABSENT:
                module.__dict__.pop(key, None)
            else:
                setattr(module, key, value)
    saved: list = []
    inside = [0.0]
    try:
        saved = [b.detach().clone() for b in buffers]
        # Quiet: its calls' backward reads the loss alone, and a notice that the loss gives
        # the other outputs no gradient, said here, was about these calls, not the user's.
        scheduled = ScheduledModule(model, graph, store_all(graph), notify=lambda message: None)
        scheduled.runs_root_hooks = False

        def call() -> float:
            for p in parameters:
                p.grad = None
            _synchronize(device)
            inside[0] = 0.0
            # Each as if it were the first in the caller's autocast block, and forgotten by it.
            with calls_forgotten():
                begun = time.perf_counter()
                outputs = scheduled(*args, **kwargs)
                forward_s = time.perf_counter() - begun
                # What a training loop's backward starts from: the loss, where the model returns
                # one beside other outputs (logits get no gradient in training), made untimed.
                leaves = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
                losses = [t for t in leaves if t.dim() == 0] or leaves
                seeds = [torch.ones((), dtype=t.dtype, device=t.device).expand_as(t) for t in losses]
                begun = time.perf_counter()
                torch.autograd.backward(losses, seeds)
                backward_s = time.perf_counter() - begun
                put_back(setup)
                return forward_s + backward_s - inside[0]

        with generators_kept([device] if device.type == "cuda" else []), \
                torch.enable_grad():
            call()   # compiles the segments on the device the call runs on
            for lowered in scheduled._plans.values():
                for runner in lowered.runners.values():
                    _time_segments(runner, inside)
            outside = [call() for _ in range(rounds)]
            if inside[0] <= 0:
                return None, "no segment ran in a timed call"
    except Exception as exc:  # noqa: BLE001 - only this term is not priced, and the caller says why
        return None, f"a call failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]})"
    finally:
        for p, grad in zip(parameters, grads):
            p.grad = grad
        with torch.no_grad():   # only those a call wrote: a constant buffer's version stays
            for buffer, version, copy in zip(buffers, versions, saved):
                if buffer._version != version:
                    buffer.copy_(copy)
        put_back(len(stores))
    return max(0.0, statistics.median(outside)), ""


def _time_segments(runner, inside: list[float]) -> None:
    """Make `runner`'s segments add the seconds they run to `inside[0]`: the forward
    segment per call, the backward segment (a generator) per resumption, whichever the
    backward runs (`_Runner.backward_for`: the calls here leave the logits out)."""
    forward_fn, backward_for = runner.forward_fn, runner.backward_for

    def timed_forward(*a):
        begun = time.perf_counter()
        try:
            return forward_fn(*a)
        finally:
            inside[0] += time.perf_counter() - begun

    def timed_backward_for(unused):
        backward_fn = backward_for(unused)

        def timed_backward(*a):
            segment = backward_fn(*a)
            while True:
                begun = time.perf_counter()
                try:
                    handed = next(segment)
                except StopIteration:
                    inside[0] += time.perf_counter() - begun
                    return
                inside[0] += time.perf_counter() - begun
                yield handed
        return timed_backward

    runner.forward_fn, runner.backward_for = timed_forward, timed_backward_for
