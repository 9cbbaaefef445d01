"""Training through remat-ir next to eager, and random valid schedules of real graphs.

`side_by_side` trains a model and its scheduled copy for a few optimizer steps
from the same generator state and compares, step by step, every output, every
gradient, every buffer and the generator state after the step. It returns the
relative error of each quantity that is not bitwise equal, so that callers can
require bitwise equality or name the reason it cannot hold.

`random_schedule` draws a valid schedule of a lowered graph: a random
dependency order of the forward, forward nodes deferred to the backward when
only backward needs them, random recomputations anywhere (forward or
backward, any node any number of times but mutating ones), and frees as early
as the simulator allows (`ir.from_compute_sequence`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
from dataclasses import replace

import numpy as np
from hypothesis import strategies as st
import torch
from torch.utils import _pytree as pytree

from remat_ir import ir
from remat_ir.ir import rng
from remat_ir.ir import pb
from remat_ir.solvers.offload import idle_gaps, with_round_trips
from remat_ir.torchlib.hook_reparametrizations import assign_weights, hook_reparametrizations


#: What the random-schedule property tests draw (`random_schedule`'s shares and the
#: runtime's gradient groups), as keyword strategies for `hypothesis.given`.
SCHEDULE_DRAWS = dict(seed=st.integers(0, 2**32 - 1), recompute=st.sampled_from([0.0, 0.3, 0.8]),
                      defer=st.sampled_from([0.0, 0.5, 1.0]), groups=st.sampled_from([1, 3, 64]))

#: Zoo models for schedule searches: every kind of node the runtime treats apart
#: (random, buffer updates, a preserved custom Function, views, tuple outputs).
SEARCH_MODELS = ("mlp_dropout", "gpt2", "cnn_batchnorm", "straight_through", "lora_llama")


#: The devices the device-parametrized tests run on: the CPU, and CUDA where a GPU is
#: present (`make gpu-tests` selects those with `-k cuda`).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def lowered(name: str, cost_model: str = "flops", backend: str = "eager") -> ir.Graph:
    """A copy of `_lowered`'s graph: solving adds schedules to the graph it is given, and a
    graph shared by every test of a process made later tests depend on earlier ones (run
    in one process, `fuse()` refused the GPT-2 graph another file had planned)."""
    graph = ir.pb.Graph()
    graph.CopyFrom(_lowered(name, cost_model, backend).proto)
    return ir.Graph(graph)


@functools.cache
def _lowered(name: str, cost_model: str = "flops", backend: str = "eager") -> ir.Graph:
    """A zoo model (tiny) lowered once per test session, with FLOP costs by default;
    `cost_model="isolated"` gives its real storage sizes and workspaces (each op run
    once, timed alone: profiling's memory facts without its in-step timing), so that a
    measured peak can be held to the simulated one. `backend="inductor"`: the graph
    plans for that backend are made on (pointwise chains fused, `lowering.for_backend`)."""
    from remat_ir.lowering import lower_torch

    import zoo_models

    model, args, kwargs, _ = zoo_models.ZOO[name]()
    return lower_torch(model, args, example_kwargs=kwargs, cost_model=cost_model, backend=backend)


def relative_error(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """max |a - b| over the larger of max |a|, max |b| and `floor`, over the finite
    elements; 0 where the two agree on every element that is not (NaN where both are NaN,
    the same infinity), infinite where they do not. Why: a random network may diverge in
    eager too (soak, 2026-11-28: a layer norm's output multiplied by its own transpose
    twice reaches inf in the second step, and every gradient after it is NaN), and NaN
    is never equal to NaN, so such a step counted as wrong on both sides alike."""
    a, b = a.double(), b.double()
    if not a.numel():
        return 0.0
    agree = (a == b) | (a.isnan() & b.isnan())
    finite = a.isfinite() & b.isfinite()
    if not bool((agree | finite).all()):
        return float("inf")   # a NaN or an infinity on one side only, or opposite infinities
    a, b = a[finite], b[finite]
    if not a.numel():
        return 0.0
    scale = max(a.abs().max().item(), b.abs().max().item(), floor)
    return (a - b).abs().max().item() / scale


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, the sign of a zero included (`torch.equal` counts -0.0
    equal to +0.0, but `1 / x`, `copysign` and `atan2` tell them apart), a NaN counting as
    equal to a NaN in the same place (both sides diverged alike: see `relative_error`)."""
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():   # each part's bits; a conjugate or negative view resolved first
        a, b = (torch.view_as_real(t.resolve_conj().resolve_neg()) for t in (a, b))
    nan_a, nan_b = a.isnan(), b.isnan()
    if not torch.equal(nan_a, nan_b):
        return False
    a, b = a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0)
    return torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model`, also where a forward pre-hook holds a computed weight on a
    module (`torch.nn.utils.weight_norm`, `spectral_norm`, `prune`), which PyTorch refuses
    to deepcopy (a tensor that is not a leaf): the weights are left out of the copy and
    computed again on it by the hooks' own functions (`torchlib.hook_reparametrizations`),
    which give their bits again from the copied parameters and buffers."""
    held = {}   # "path.name" -> (module, name, weight) of the weights a call computed
    for key, (module, _) in hook_reparametrizations(model).items():
        name = key.rpartition(".")[2]
        weight = module.__dict__.get(name)
        if isinstance(weight, torch.Tensor) and not weight.is_leaf:
            held[key] = (module, name, module.__dict__.pop(name))
    try:
        copied = copy.deepcopy(model)
    finally:
        for module, name, weight in held.values():
            module.__dict__[name] = weight
    assign_weights({key: hooked for key, hooked in hook_reparametrizations(copied).items() if key in held})
    return copied


def peaks(model: torch.nn.Module, graph: ir.Graph, schedule: pb.Schedule, *args) -> tuple[int, int]:
    """(measured, simulated) peak bytes of a step of `schedule` of `graph` training `model`
    on `args` on CPU, measured at the second call (the first compiles the segments)."""
    from remat_ir.runtimes.memory import measure_peak
    from remat_ir.runtimes.torch import ScheduledModule

    scheduled = ScheduledModule(model, graph, schedule)
    for _ in range(2):
        scheduled.zero_grad(set_to_none=True)
        measured = measure_peak(lambda: scheduled(*args).backward(), "cpu").peak_bytes
    return measured, ir.simulate(graph, schedule).peak_bytes


def side_by_side(model: torch.nn.Module, make_scheduled, args: tuple, kwargs: dict, loss_of, *,
                 steps: int = 2, seed: int = 100, tolerance: float = 1e-6,
                 model_scale: bool = False, forward_context=contextlib.nullcontext,
                 backward_context=contextlib.nullcontext, outside: bool = True) -> dict[str, float]:
    """Train `model` (a deep copy, eagerly) and `make_scheduled(model)` side by side.

    Returns {what: relative error} for every output, gradient and buffer that is not
    bitwise equal; raises AssertionError if the generator state after a step differs,
    if a gradient is missing on one side only, or if the two drift (relative error
    above `tolerance` anywhere; compiled kernels round differently from eager ones).

    `model_scale`: a gradient's error is relative to the largest gradient of the step
    (the whole gradient as one vector), not to its own largest entry. Kernels that
    round differently give gradients that are zero in exact arithmetic (a key
    projection's bias under softmax: about 1e-9 here) values that differ wholly, which
    says nothing about the step; compiled backends are compared this way.

    `forward_context()`: entered around each forward and its loss, both sides (autocast;
    the backward runs outside it, as PyTorch recommends); `backward_context()`: around
    each backward.

    `outside` (on unless a test turns it off): the loss also reads every trainable
    parameter outside the module (a small L2 penalty, as weight decay written into the
    loss), so that each parameter's gradient gets a contribution from outside too: where
    the module reads a parameter more than once, its parts must reach autograd's buffer
    in eager's order around that contribution (`runtimes/gradient_parts.py`), which a
    loss of the outputs alone does not check (a gradient handed whole is then bitwise
    eager's too: an offloaded running sum and weights tied after lowering were found so,
    2026-12-02)."""
    try:
        eager = copy_model(model)
    except RuntimeError:   # one PyTorch cannot copy: remat-ir's verdict first
        make_scheduled(model)
        raise
    scheduled = make_scheduled(model)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    opt_s = torch.optim.SGD(scheduled.parameters(), lr=0.01, momentum=0.9)
    errors: dict[str, float] = {}

    def compare(a, b, what, floor=1e-30):
        if not _bitwise_equal(a, b):
            errors[what] = relative_error(a, b, floor)

    # Inputs that need a gradient get one from each side: compared, then cleared.
    leaves = [t for t in _tensors((args, kwargs)) if t.requires_grad and t.is_leaf]
    for step in range(steps):
        for t in leaves:
            t.grad = None
        _seed_all(seed + step)
        with forward_context():
            out_e = eager(*args, **kwargs)
            loss_e = loss_of(out_e) + (_penalty(eager) if outside else 0)
        with backward_context():
            loss_e.backward()
        state_e = _generator_states()
        input_grads_e = [t.grad for t in leaves]
        for t in leaves:
            t.grad = None
        _seed_all(seed + step)
        with forward_context():
            out_s = scheduled(*args, **kwargs)
            loss_s = loss_of(out_s) + (_penalty(scheduled) if outside else 0)
        with backward_context():
            loss_s.backward()
        state_s = _generator_states()
        for i, (t, g_e) in enumerate(zip(leaves, input_grads_e)):
            assert (g_e is None) == (t.grad is None), f"step {step}: gradient of input {i}"
            if g_e is not None:
                compare(g_e, t.grad, f"step {step} grad of input {i}")
        for (where, eager_state), (_, scheduled_state) in zip(state_e, state_s):
            assert _same_state(eager_state, scheduled_state), f"step {step}: the {where} generator's state differs from eager's"
        flat_e, flat_s = _tensors(out_e), _tensors(out_s)
        assert len(flat_e) == len(flat_s), f"step {step}: {len(flat_s)} outputs, eager {len(flat_e)}"
        for i, (a, b) in enumerate(zip(flat_e, flat_s)):
            compare(a.detach(), b.detach(), f"step {step} output {i}")
        floor = (max((p.grad.abs().max().item() for p in eager.parameters()
                      if p.grad is not None and p.numel()), default=0.0) if model_scale else 1e-30)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert (p_e.grad is None) == (p_s.grad is None), f"step {step}: gradient of {name}"
            if p_e.grad is not None:
                compare(p_e.grad, p_s.grad, f"step {step} grad {name}", floor)
        for (name, b_e), b_s in zip(eager.named_buffers(), scheduled.buffers()):
            compare(b_e, b_s, f"step {step} buffer {name}")
        opt_e.step(), opt_s.step()
        opt_e.zero_grad(), opt_s.zero_grad()
    worst = max(errors.values(), default=0.0)
    assert worst < tolerance, f"drifts from eager: {max(errors, key=errors.get)} relative error {worst:.3g}"
    return errors


def _penalty(model: torch.nn.Module) -> torch.Tensor:
    """1e-2 times the sum of squares of `model`'s trainable parameters, in float32."""
    return 1e-2 * sum(p.float().square().sum() for p in model.parameters() if p.requires_grad)


def _seed_all(seed: int) -> None:
    """Seed torch's, NumPy's and Python's global generators, as a training script does."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _generator_states() -> list[tuple[str, object]]:
    """The CPU generator's state, and the current CUDA device's where CUDA is in use (its
    ops draw from that one: dropout on a CUDA tensor leaves the CPU generator alone); and
    NumPy's and Python's global generators' (transformers' SpecAugment draws its masks
    from NumPy's in the forward)."""
    states = [("CPU", torch.get_rng_state())]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(("CUDA", torch.cuda.get_rng_state()))
    return states + [("NumPy", np.random.get_state()), ("Python", random.getstate())]


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple) and a and a[0] == "MT19937":   # NumPy's: key array, position, ...
        return all(np.array_equal(x, y) for x, y in zip(a, b))
    return a == b


def random_schedule(graph: ir.Graph, rnd: random.Random, *, recompute_share: float = 0.3,
                    defer_share: float = 0.3) -> pb.Schedule:
    """A random valid schedule of `graph` (see the module docstring), checked by the simulator."""
    forward = graph.phase_order(pb.FORWARD)
    backward = graph.phase_order(pb.BACKWARD)
    producer = graph.producer
    once = {n for n in forward + backward
            if graph.node(n).mutating or graph.node(n).non_recomputable}
    # Forward nodes the forward segment must run: those the forward outputs (results,
    # buffer updates, value checks: every output but gradients) depend on.
    forward_outputs = [o.value_id for o in graph.proto.outputs
                       if o.role not in (pb.PARAMETER_GRADIENT, pb.INPUT_GRADIENT)]
    needed, stack = set(once & set(forward)), [producer(v) for v in forward_outputs]
    while stack:
        n = stack.pop()
        if n is not None and n not in needed:
            needed.add(n)
            stack.extend(producer(v) for v in graph.node(n).inputs)
    for n in list(needed):  # what mutating nodes read must run before them
        stack = [producer(v) for v in graph.node(n).inputs]
        while stack:
            m = stack.pop()
            if m is not None and m not in needed:
                needed.add(m)
                stack.extend(producer(v) for v in graph.node(m).inputs)
    # A random node whose draws depend on values (multinomial, a custom Function's op that
    # draws) cannot be skipped (`ir.rng`): it draws in its own segment, before any random
    # node after it in graph order draws.
    random_order = rng.graph_order(graph)
    value_draws = [n for n in random_order if not graph.node(n).rng_shape_only]
    stack = [n for n in value_draws if graph.node(n).phase == pb.FORWARD]
    while stack:   # with what they read (a draw nothing reads: an output left out)
        n = stack.pop()
        if n is not None and n not in needed:
            needed.add(n)
            stack.extend(producer(v) for v in graph.node(n).inputs)
    position = {n: i for i, n in enumerate(random_order)}
    deferred: set[int] = set()  # with everything downstream of them (never a needed node)
    for n in forward:
        if n not in needed and (rnd.random() < defer_share
                                or any(producer(v) in deferred for v in graph.node(n).inputs)):
            deferred.add(n)

    sequence: list[int] = []
    done: set[int] = set()

    def ready(n):
        if n in position and any(m not in done for m in value_draws if position[m] < position[n]):
            return False
        return all(producer(v) is None or producer(v) in done for v in graph.node(n).inputs)

    def run_in_random_order(nodes):
        pending = list(nodes)
        while pending:
            choices = [n for n in pending if ready(n)]
            n = rnd.choice(choices)
            pending.remove(n)
            sequence.append(n)
            done.add(n)
            maybe_recompute()

    def maybe_recompute():
        if rnd.random() < recompute_share:
            candidates = [n for n in done if n not in once and graph.node(n).phase == pb.FORWARD]
            for n in rnd.sample(candidates, min(len(candidates), rnd.randint(1, 3))):
                sequence.append(n)

    run_in_random_order([n for n in forward if n not in deferred])
    forward_length = len(sequence)
    run_in_random_order([n for n in forward if n in deferred] + backward)
    has_random = any(graph.node(n).random for n in sequence)
    return ir.from_compute_sequence(graph, sequence, forward_length, name="random",
                                    solver="random", rng_replay=has_random)


#: A link on which every idle gap is wide open: transfers on the compute timeline, instant.
INSTANT = pb.HostLink(bandwidth_bytes_per_s=1e18, latency_s=0.0, overlapped=False)


def random_round_trips(graph: ir.Graph, schedule: pb.Schedule, rnd: random.Random,
                       share: float) -> pb.Schedule:
    """`schedule` with offload/free/prefetch round trips at random places inside a random
    share of its values' idle gaps (at least one), checked by the simulator."""
    gaps = idle_gaps(graph, schedule, link=INSTANT)
    assert gaps, "a schedule of a real model has idle values between forward and backward"
    picked = [o for o in gaps if rnd.random() < share] or [rnd.choice(gaps)]
    trips = []
    for o in picked:
        free_at = rnd.randint(o.free_at, o.prefetch_at - 1)
        trips.append(replace(o, after=rnd.randint(o.after, free_at - 1), free_at=free_at,
                             prefetch_at=rnd.randint(free_at + 1, o.prefetch_at)))
    moved, _ = with_round_trips(schedule, trips)
    ir.check(graph, moved)
    return moved
