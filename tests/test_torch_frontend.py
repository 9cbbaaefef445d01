"""What lowering a real model writes into the IR."""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

from remat_ir import ir
from remat_ir.lowering import lower_torch
from remat_ir.ir import pb
from remat_ir.ir.memory import is_view
from remat_ir.runtimes.profiling import RATES
from torch_models import gpt2, mlp, resnet


@pytest.fixture(scope="module")
def gpt2_model_and_graph():
    model, args, kwargs, _ = gpt2()
    return model, lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")


def test_gpt2_structure(gpt2_model_and_graph):
    model, g = gpt2_model_and_graph
    ir.validate(g)
    params = {e.name for e in g.proto.inputs if g.value(e.value_id).kind == pb.PARAMETER}
    # Parameters are bound by name, GPT-2's tied embedding under both of its names ...
    assert params == {n for n, _ in model.named_parameters(remove_duplicate=False)}
    # ... and each parameter tensor gets one gradient (the tied one's sums both uses).
    grads = [o.name for o in g.proto.outputs if o.role == pb.PARAMETER_GRADIENT]
    assert sorted(id(model.get_parameter(n)) for n in grads) == sorted(id(p) for p in model.parameters())
    # Dropout masks are drawn by random nodes (frontends/dropout_masks.py): embeddings,
    # attention probs, residuals of 2 layers, ... = 7
    assert sum(n.random for n in g.proto.nodes) == 7
    assert all(n.op == "aten.bernoulli.p" for n in g.proto.nodes if n.random)
    # Views share storages: fewer storages than values, counted once.
    assert len(g.proto.storages) < 0.7 * len(g.proto.values)
    # Most backward nodes know the forward node they differentiate.
    backward = [n for n in g.proto.nodes if n.phase == pb.BACKWARD]
    linked = [n for n in backward if n.HasField("forward_node_id")]
    assert len(linked) > 0.8 * len(backward)
    assert all(g.node(n.forward_node_id).phase == pb.FORWARD for n in linked)
    # Every node carries its executable arguments and where it came from.
    assert all(n.args or n.kwargs for n in g.proto.nodes)
    assert sum(bool(n.source) for n in g.proto.nodes) > 0.9 * len(g.proto.nodes)
    assert all(n.cost.source == pb.ANALYTIC and n.cost.time_s > 0 for n in g.proto.nodes)
    assert g.proto.provenance.frontend == "torch" and g.proto.provenance.cost_device == "cpu"
    # A view moves no bytes: it costs the fixed overhead of an op, a copy costs more.
    views = [n for n in g.proto.nodes if is_view(g, n) and not n.mutating]
    overhead = RATES["cpu"][2]
    assert len(views) > 50 and all(n.cost.bytes_accessed == 0 and n.cost.time_s == overhead
                                   for n in views)
    copies = [n for n in g.proto.nodes if n.op == "aten.clone.default"]
    assert copies and all(n.cost.bytes_accessed > 0 and n.cost.time_s > overhead for n in copies)


def test_batchnorm_running_statistics_are_buffer_updates():
    model, args, kwargs, _ = resnet()
    g = lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")
    updates = Counter(o.name.rsplit(".", 1)[1] for o in g.proto.outputs if o.role == pb.BUFFER_UPDATE)
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert updates == {"running_mean": n_bn, "running_var": n_bn, "num_batches_tracked": n_bn}


def test_isolated_costs_are_measured_once_per_distinct_op():
    model, args, _, _ = mlp()
    g = lower_torch(model, args, cost_model="isolated")
    assert all(n.cost.source == pb.PROFILED and n.cost.time_s > 0 for n in g.proto.nodes)
    signatures, nodes = {}, Counter()
    for n in g.proto.nodes:  # equal op and input shapes, strides and dtypes share one measurement
        inputs = tuple((tuple(g.value(v).shape), tuple(g.value(v).stride), g.value(v).dtype) for v in n.inputs)
        key = (n.op, inputs, tuple(str(a) for a in n.args[1:]))
        signatures.setdefault(key, set()).add(n.cost.time_s)
        nodes[key] += 1
    assert any(count > 1 for count in nodes.values())  # some op does repeat, so sharing is tested
    assert all(len(times) == 1 for times in signatures.values()), \
        {key: times for key, times in signatures.items() if len(times) > 1}


class _ConvMSE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x, target):
        return torch.nn.functional.mse_loss(self.conv(x), target)


def test_profiled_costs_record_what_the_allocator_holds():
    """Meta kernels give each output's exact size; the real kernels may hold more, and
    profiling records it. CPU `mse_loss` returns its 0-dim mean in the storage of the
    unreduced tensor (6 KB here, not 4 bytes): the loss's storage grows to that size.
    oneDNN convolutions allocate workspace beyond their outputs, which "flops" leaves out."""
    torch.manual_seed(0)
    model, args = _ConvMSE(), (torch.randn(2, 3, 16, 16), torch.randn(2, 8, 16, 16))
    real = torch.nn.functional.mse_loss(model.conv(args[0]), args[1]).untyped_storage().nbytes()
    loss_storage = {}
    for cost_model in ("profile", "flops"):
        g = lower_torch(model, args, cost_model=cost_model)
        loss = next(o.value_id for o in g.proto.outputs if o.role == pb.USER_OUTPUT)
        loss_storage[cost_model] = g.storage_bytes(g.value(loss).storage_id)
        workspace = {n.op: n.cost.workspace_bytes for n in g.proto.nodes}
        if cost_model == "flops":
            assert not any(workspace.values())
        elif torch.backends.mkldnn.is_available():
            assert workspace["aten.convolution_backward.default"] > 0
    assert loss_storage == {"profile": max(real, 4), "flops": 4}


def test_frontend_lowers_without_costs_and_the_facade_adds_them():
    """The frontend does not execute ops (profiling belongs to the runtimes): its graph has
    no costs, and `lower_torch` gives exactly what `estimate_costs` then adds."""
    from remat_ir.frontends.torch import lower
    from remat_ir.runtimes.profiling import estimate_costs

    model, args, _, _ = mlp()
    bare = lower(model, args)
    assert all(n.cost.time_s == 0 and n.cost.flops == 0 and n.cost.bytes_accessed == 0
               for n in bare.proto.nodes)
    assert bare.proto.provenance.cost_device == "cpu"
    estimate_costs(bare, "flops", torch.device("cpu"))
    facade = lower_torch(model, args, cost_model="flops")
    assert [(n.cost.time_s, n.cost.flops) for n in bare.proto.nodes] == \
        [(n.cost.time_s, n.cost.flops) for n in facade.proto.nodes]


def test_unknown_cost_model_is_refused_before_tracing():
    class Untraceable(torch.nn.Module):
        def forward(self, x):
            raise AssertionError("traced although the cost model is unknown")

    with pytest.raises(ValueError, match=r"cost_model must be 'profile' .* or 'flops' .*'flop'"):
        lower_torch(Untraceable(), (torch.randn(2),), cost_model="flop")
    from remat_ir.runtimes.profiling import estimate_costs

    model, args, _, _ = mlp()
    with pytest.raises(ValueError, match="not 'FLOPS'"):
        estimate_costs(lower_torch(model, args, cost_model=None), "FLOPS", torch.device("cpu"))


def test_user_inputs_record_the_callers_positions_and_argument_names():
    """Positions count every flat argument, the non-tensor flag the trace baked in too."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, double, target, *, mask):
            y = self.linear(x) * (2 if double else 1)
            return ((y - target) ** 2 * mask).mean()

    x, target, mask = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    g = lower_torch(Scaled(), (x, True, target), example_kwargs={"mask": mask}, cost_model=None)
    assert [(e.user_input_position, e.argument_name) for e in g.user_inputs()] == [
        (0, "args[0]"), (2, "args[2]"), (3, "mask")]
    ir.validate(g)


@torch.library.custom_op("remat_test::scaled_with_count", mutates_args=())
def _scaled_with_count(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x * 2, x.shape[-1]


@_scaled_with_count.register_fake
def _(x):
    return x * 2, x.shape[-1]


_scaled_with_count.register_autograd(lambda ctx, grad, _count: grad * 2,
                                     setup_context=lambda ctx, inputs, output: None)


class _CountingModel(torch.nn.Module):
    """Reads a number an op returns beside its tensor, as cuDNN attention's backward reads
    its forward's max_q and max_k on CUDA (bf16 SDPA on an H100)."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        y, n = torch.ops.remat_test.scaled_with_count(self.lin(x).tanh())
        return (self.out(y.tanh()).tanh() * n).sum()


def test_a_number_an_op_returns_beside_its_tensors_lowers_as_a_constant():
    """The number gets no IR value (only tensors are values); the ops reading it take it
    as a constant argument, and training through remat-ir is bitwise eager's."""
    from exactness import side_by_side

    from remat_ir import remat

    model, x = _CountingModel(), torch.randn(256, 8)
    graph = lower_torch(model, (x,), cost_model="flops")
    (op,) = [n for n in graph.proto.nodes if n.op == "remat_test.scaled_with_count.default"]
    assert len(op.outputs) == 1 and list(op.output_indices) == [0]
    errors = side_by_side(model, lambda m: remat(m, (x,), budget="80%", cost_model="flops",
                                                 time_limit_s=5), (x,), {}, lambda out: out)
    assert errors == {}, errors


@torch.library.custom_op("remat_ir_tests::ema_", mutates_args=("stat",))
def _ema_(stat: torch.Tensor, x: torch.Tensor) -> None:
    """A custom op writing a running statistic into a buffer it is given."""
    stat.mul_(0.9).add_(x.detach().mean(0), alpha=0.1)


@_ema_.register_fake
def _(stat, x):
    return None


class _RunningStatistic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("stat", torch.zeros(4))

    def forward(self, x):
        h = self.lin(x)
        _ema_(self.stat, h)
        return h.sum()


def test_a_custom_op_writing_into_its_arguments_is_refused_with_the_way_to_write_it():
    """Export wraps such an op in `auto_functionalized`, which the message named (with
    "not an aten-level op") instead of the user's op and what to do (found by a review)."""
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match=r"^custom op remat_ir_tests::ema_ in .*_RunningStatistic.* writes "
                                            r"into its arguments \(mutates_args=...\).*mutates_args=\(\)\) "
                                            r"and write it in the forward with a PyTorch op"):
        lower_torch(_RunningStatistic(), (torch.randn(3, 4),), cost_model="flops")


@torch.library.custom_op("remat_ir_tests::doubled", mutates_args=())
def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_doubled.register_fake
def _(x):
    return torch.empty_like(x)


# setup_context takes (ctx, inputs, output) by name: this one fails in eager's training call
_doubled.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, i, o: None)


class _DoubledOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return _doubled(self.lin(x)).sum()


def test_an_error_eager_raises_in_a_training_call_is_reported_as_the_models_own():
    """A custom op's `setup_context` runs only with gradients on: the check of whether eager
    runs the forward ran it without them, and the error was reported as one torch.export
    alone meets ("eager runs on these inputs: the forward takes another path"), sending the
    user to look for a tracing check that is not there (found by a review)."""
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match=r"^_DoubledOutput's forward raised TypeError at .*unexpected keyword "
                                            r"argument 'inputs' \(eager raises it too"):
        lower_torch(_DoubledOutput(), (torch.randn(2, 3),), cost_model="flops")


class _InPlaceWrite(torch.nn.Module):
    def __init__(self, write):
        super().__init__()
        self.lin, self.write = torch.nn.Linear(8, 8), write

    def forward(self, x):
        h = self.lin(x) * 1.5
        self.write(h)
        return h


def _setitem(target, source):
    def write(h):
        h[target(h)] = source(h)
    return write


_OVERLAPPING = {
    "shift": _setitem(lambda h: (slice(None), slice(1, None)), lambda h: h[:, :-1]),
    "shift through add_": lambda h: h[:, 1:].add_(h[:, :-1]),
    "shift augmented": lambda h: h[:, 1:].__iadd__(h[:, :-1]),
    "block from its transpose": _setitem(lambda h: (slice(0, 4), slice(0, 4)), lambda h: h[:4, :4].t()),
    "diagonal from a row": lambda h: h.diagonal(offset=1).copy_(h[0, :5]),
}
_DISJOINT = {
    "halves": lambda h: h[:, :4].add_(h[:, 4:]),
    "itself": lambda h: h.add_(h),
    "shift from a copy": _setitem(lambda h: (slice(None), slice(1, None)), lambda h: h[:, :-1].clone()),
    "every other column": lambda h: h[:, ::2].copy_(h[:, 1::2]),
}


@pytest.mark.parametrize("name", sorted(_OVERLAPPING) + sorted(_DISJOINT))
def test_a_write_from_an_overlapping_part_of_itself_is_refused_and_others_train_like_eager(name):
    """`h[:, 1:] = h[:, :-1]`: eager's kernel writes element by element (later elements read
    earlier writes), the traced graph reads the source whole first: outputs 2.3 off, a
    gradient 24 off, silently, on every schedule (found by a review). Refused naming the
    line; writes whose source shares no element with the target's other elements train
    bitwise like eager."""
    import remat_ir
    from exactness import side_by_side
    from remat_ir.frontends.errors import LoweringError

    x = torch.randn(5, 8)
    if name in _OVERLAPPING:
        with pytest.raises(LoweringError, match=r"^_InPlaceWrite's forward writes into a tensor from an overlapping "
                                                r"part of itself at .*test_torch_frontend\.py:\d+ .*\.clone\(\)"):
            lower_torch(_InPlaceWrite(_OVERLAPPING[name]), (x,), cost_model="flops")
        return
    errors = side_by_side(_InPlaceWrite(_DISJOINT[name]),
                          lambda m: remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops"),
                          (x,), {}, lambda y: y.square().sum())
    assert errors == {}


class _WritesUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            h[:, :3] = 0.
        g = h * 1
        with torch.no_grad():
            g[0] = 1.5
        return g.exp()


def test_a_number_written_under_no_grad_trains_like_eager():
    """Under `no_grad`, `h[:, :3] = 0.` makes the tensor of 0. inside the region export
    keeps as a submodule, and it was refused as a tensor "found nowhere (a closure's, a
    default argument's)" (found by a review)."""
    import remat_ir
    from exactness import side_by_side

    x = torch.randn(6, 8)
    errors = side_by_side(_WritesUnderNoGrad(), lambda m: remat_ir.remat(m, (x,), solver="recompute-all",
                                                                         cost_model="flops"),
                          (x,), {}, lambda y: y.square().sum())
    assert errors == {}


class _CountsUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.count = torch.zeros(())   # a plain attribute, not a buffer

    def forward(self, x):
        with torch.no_grad():
            self.count.add_(1)
        return (self.lin(x) * self.count).sum()


def test_a_held_tensor_written_under_no_grad_is_refused_by_line():
    """The write, inside the region export keeps as a submodule, was not seen: the graph
    held the count as traced, and three steps left it at 1 where eager counts 3, the loss
    scaled by it, silently (found while fixing the no_grad write above)."""
    from remat_ir.frontends.errors import LoweringError

    with pytest.raises(LoweringError, match=r"^_CountsUnderNoGrad's forward writes into a tensor that is neither a "
                                            r"parameter nor a buffer \(count of _CountsUnderNoGrad; aten::add_.Tensor "
                                            r"at .*test_torch_frontend\.py:\d+ in forward\).*register_buffer"):
        lower_torch(_CountsUnderNoGrad(), (torch.randn(2, 4),), cost_model="flops")



@pytest.mark.parametrize("collector_on", [True, False])
def test_the_garbage_collector_waits_while_tracing_and_is_put_back_as_it_was(collector_on, monkeypatch):
    """Lowering holds the collector off (`frontends/paused_collection.py`), as torch.export
    traces, and leaves it as the caller had it, after a refused model too: left off, every
    later reference cycle of the user's program would stay in memory."""
    import gc

    from remat_ir.frontends.torch import LoweringError, lower

    export, seen = torch.export.export, []

    def noting(*args, **kwargs):
        seen.append(gc.isenabled())
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", noting)
    was = gc.isenabled()
    (gc.enable if collector_on else gc.disable)()
    try:
        lower(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
        assert seen and not any(seen)
        assert gc.isenabled() == collector_on

        class DataSized(torch.nn.Linear):
            def forward(self, x):
                y = super().forward(x)
                return y[y > 0].sum()

        with pytest.raises(LoweringError):
            lower(DataSized(4, 4), (torch.randn(2, 4),))
        assert gc.isenabled() == collector_on
    finally:
        (gc.enable if was else gc.disable)()


def test_a_module_dropped_from_sys_modules_is_not_kept_alive_by_lowering(tmp_path, monkeypatch):
    """Lowering remembers which modules are the user's (`outside_state._USERS_MODULES`)
    but holds them weakly: a module a program drops (a plugin unloaded, a notebook's
    reloaded file) is freed with its globals, and one bound again under its name is
    judged again, so its globals are looked at."""
    import gc
    import importlib.util
    import sys
    import weakref

    from remat_ir.frontends import outside_state
    from remat_ir.frontends.torch import lower

    file = tmp_path / "users_settings_module.py"
    file.write_text("STEPS = [0]\n")
    spec = importlib.util.spec_from_file_location("users_settings_module", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "users_settings_module", module)
    monkeypatch.setattr(outside_state, "is_users_file", lambda path: path == str(file))
    monkeypatch.setattr(outside_state, "_USERS_MODULES", {})   # judged under this stand-in
    assert "users_settings_module" in dict(outside_state._namespaces())

    lower(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    gone = weakref.ref(module)
    del sys.modules["users_settings_module"], module
    gc.collect()
    assert gone() is None

    again = types.ModuleType("users_settings_module")   # no file: not the user's
    monkeypatch.setitem(sys.modules, "users_settings_module", again)
    assert "users_settings_module" not in dict(outside_state._namespaces())
