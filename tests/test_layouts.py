"""Memory layouts: a model trained channels_last (PyTorch's recipe for fast convolutions
on CPU and GPU) runs as it was lowered, and a tensor whose layout changed after lowering
never runs through a graph traced for the old one (its `view`s fail deep inside, or read
the wrong elements)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import remat_ir
from exactness import side_by_side
from remat_ir import ir
from remat_ir.runtimes.memory import measure_peak
from remat_ir.runtimes.torch import RuntimeInputError, ScheduledModule

from strategies import search

CL = torch.channels_last


class SmallCNN(torch.nn.Module):
    """Convolutions, batch norm and a flatten (a `view` that holds the layout it was traced
    with) into a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.conv2, self.bn2 = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.conv3 = torch.nn.Conv2d(16, 8, 3, stride=4, padding=1)
        self.head = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, pixels, labels):
        x = F.relu(self.bn1(self.conv1(pixels)))
        x = self.conv3(F.relu(self.bn2(self.conv2(x))))
        return F.cross_entropy(self.head(x.flatten(1)), labels)


def _cnn(channels_last: bool):
    torch.manual_seed(0)
    model = SmallCNN()
    pixels, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))
    if channels_last:
        model, pixels = model.to(memory_format=CL), pixels.contiguous(memory_format=CL)
    return model, (pixels, labels)


def _step_equals_eager(eager, scheduled, args) -> int:
    """One step each: loss and gradients bitwise equal; returns the scheduled step's peak."""
    loss_e = eager(*args)
    loss_e.backward()

    def step():
        loss = scheduled(*args)
        loss.backward()
        return loss

    measured = measure_peak(step, "cpu")
    assert torch.equal(loss_e.detach(), measured.result.detach())
    for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
        assert torch.equal(p_e.grad, p_s.grad), name
    eager.zero_grad(set_to_none=True), scheduled.zero_grad(set_to_none=True)
    return measured.peak_bytes


def test_channels_last_model_trains_like_eager_within_its_budget():
    """The graph holds the channels_last strides it was traced with, the plan recomputes,
    and two steps are bitwise eager's (eager channels_last) within the budget."""
    model, args = _cnn(channels_last=True)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, args, budget="90%")
    graph, schedule = scheduled.graph, scheduled.schedule
    pixels = next(v for v in graph.proto.values if v.kind == ir.pb.USER_INPUT and len(v.shape) == 4)
    assert list(pixels.stride) == list(args[0].stride())
    assert ir.simulate(graph, schedule).recomputations > 0
    for _ in range(2):
        peak = _step_equals_eager(eager, scheduled, args)
        assert peak <= schedule.budget_bytes * 1.05, (peak, schedule.budget_bytes)


def test_input_in_another_layout_is_lowered_again(capsys):
    """`remat` lowered on a contiguous batch: a channels_last batch is a new signature,
    lowered and planned once with a notice naming the layout, and trains like eager."""
    model, args = _cnn(channels_last=False)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, args, budget=None, cost_model="flops")
    _step_equals_eager(eager, scheduled, args)
    assert "new input signature" not in capsys.readouterr().err
    moved = (args[0].contiguous(memory_format=CL), args[1])
    _step_equals_eager(eager, scheduled, moved)
    said = capsys.readouterr().err
    assert "new input signature (argument args[0] is tensor [8, 3, 16, 16] float32 channels_last" in said
    assert len(scheduled._plans) == 2


def test_scheduled_module_names_the_argument_in_another_layout():
    """Without a planner a call in another layout is refused before anything runs."""
    model, args = _cnn(channels_last=False)
    lowered = remat_ir.remat(model, args, budget=None, cost_model="flops")
    scheduled = ScheduledModule(model, lowered.graph, lowered.schedule)
    with pytest.raises(RuntimeInputError, match=r"argument args\[0\] is tensor \[8, 3, 16, 16\] "
                                                r"float32 channels_last, lowered for tensor"):
        scheduled(args[0].contiguous(memory_format=CL), args[1])


def test_model_moved_to_channels_last_after_lowering_is_planned_again(capsys):
    """Parameters are the model's own, read at every step: converting the model after
    `remat` was refused, naming the parameter and both layouts, instead of failing in a
    view; it is now lowered and planned again for the new layout (found by hunt56 with a
    weight assigned through `orthogonal`, whose way out was no user's), and trains as
    eager's."""
    model, args = _cnn(channels_last=False)
    scheduled = remat_ir.remat(model, args, budget=None, cost_model="flops")
    scheduled(*args).backward()
    model.zero_grad()
    scheduled.to(memory_format=CL)
    capsys.readouterr()
    assert side_by_side(model, lambda m: scheduled, args, {}, lambda loss: loss, tolerance=1e-30) == {}
    assert "other layout (parameter 'conv1.weight' is channels_last, was contiguous)" in capsys.readouterr().err


class Mixer(torch.nn.Module):
    """Reads its input through a transpose and a `view`, whose validity depends on strides."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.outer = torch.nn.Linear(3 * 4, 2)

    def forward(self, x):
        y = torch.tanh(self.inner(x.transpose(1, 2)))       # [2, 3, 4]
        return self.outer(y.reshape(2, -1)).square().sum()


@search(6)
@given(st.permutations(range(3)), st.permutations(range(3)))
def test_inputs_of_any_layout_train_like_eager(lowered_order, called_order):
    """Hypothesis: an input laid out by a random permutation of its dimensions, lowered in
    one layout and called in another, gives eager's loss and gradients bitwise."""
    torch.manual_seed(0)
    model = Mixer()
    base = torch.randn(2, 4, 3)

    def laid_out(order):
        shape = [base.shape[d] for d in order]
        storage = torch.empty(shape).permute(*[order.index(d) for d in range(3)])
        return storage.copy_(base)

    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (laid_out(lowered_order),), budget=None, cost_model="flops",
                               progress=None)
    x = laid_out(called_order)
    assert torch.equal(x, base)
    _step_equals_eager(eager, scheduled, (x,))


class OverlappingOutput(torch.nn.Module):
    """Returns a view whose elements share memory: the gradient of such an output arrives
    laid out otherwise (its elements each have their own), and copied into the traced
    layout it kept one of each set of shared elements' gradients (found by an op sweep)."""

    def __init__(self, view):
        super().__init__()
        self.linear, self.view = torch.nn.Linear(6, 6), view

    def forward(self, x):
        y = self.linear(x)
        if self.view == "unfold":
            return y.unfold(1, 3, 2)                    # (4, 2, 3), strides (6, 2, 1)
        if self.view == "as_strided":
            return y.as_strided((4, 4), (1, 1))
        return y.unsqueeze(1).expand(4, 3, 6)           # strides (6, 0, 1)


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
@pytest.mark.parametrize("view", ["unfold", "as_strided", "expand"])
@pytest.mark.parametrize("loss", ["weighted", "sum"])
def test_an_output_whose_elements_share_memory_trains_like_eager(view, solver, loss):
    """The bias gradient was 1.35x off eager's with `unfold`, under every schedule."""
    torch.manual_seed(0)
    model, x = OverlappingOutput(view), torch.randn(4, 6)
    weights = torch.randn(model(x).shape)

    def loss_of(out):
        return (out * weights).sum() if loss == "weighted" else out.sum()

    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), budget=None, solver=solver, cost_model="flops",
                               progress=None, cache_dir=False)
    for _ in range(2):
        loss_e, loss_s = loss_of(eager(x)), loss_of(scheduled(x))
        loss_e.backward(), loss_s.backward()
        assert torch.equal(loss_e, loss_s)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert torch.equal(p_e.grad, p_s.grad), name


class _PooledConv(torch.nn.Module):
    """Returns a channels_last feature map (a backbone whose head runs outside it)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(memory_format=CL)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return F.adaptive_avg_pool2d(self.norm(self.conv(x)), 3)


class _Transposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 5)

    def forward(self, x):
        return torch.tanh(self.linear(x)).sum(0)    # read by a reduction, not a view


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
@pytest.mark.parametrize("case", ["sum", "square-mean", "contiguous-weights", "transposed-gradient",
                                  "loss-on-a-transposed-head"])
def test_an_output_gradient_in_another_layout_than_traced_trains_like_eager(case, solver):
    """The gradient reaches the backward as it arrives, as eager's does: copied to the
    traced layout, the kernels reading it took their other layout's path (the convolution's
    weight gradient 1e-7 to 3e-7 off eager's for a plain `out.sum()`). A Linear head whose
    output the loss transposes (CLIP's symmetric loss) has its gradient viewed by `t` in
    the backward, which takes any layout: it was copied, and the bias gradient summed over
    the copy, 1.9e-6 off eager's (found by a review)."""
    torch.manual_seed(0)
    if case == "loss-on-a-transposed-head":
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        x, labels = torch.randn(64, 16), torch.randint(0, 64, (4,))

        def backward(out):
            F.cross_entropy(out.t(), labels).backward()
    elif case == "transposed-gradient":
        model, x = _Transposed(), torch.randn(4, 7, 6)
        seed = torch.randn(5, 7).t()                # the gradient arrives transposed

        def backward(out):
            out.backward(gradient=seed)
    else:
        model, x = _PooledConv(), torch.randn(4, 3, 20, 20).to(memory_format=CL)
        weights = torch.randn(4, 8, 3, 3)

        def backward(out):
            {"sum": out.sum, "square-mean": lambda: out.square().mean(),
             "contiguous-weights": lambda: (out * weights).sum()}[case]().backward()
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), budget=None, solver=solver, cost_model="flops",
                               progress=None, cache_dir=False)
    for _ in range(2):
        out_e, out_s = eager(x), scheduled(x)
        assert torch.equal(out_e, out_s)
        backward(out_e), backward(out_s)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert torch.equal(p_e.grad, p_s.grad), name


class _NormOverChannels(torch.nn.Module):
    """BatchNorm1d over a (batch, length, channels) tensor transposed to channels first and
    back, then flattened, as PatchTST normalizes its patches."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm = torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.norm(self.proj(x).transpose(1, 2)).transpose(1, 2)
        return self.head(F.gelu(h).reshape(-1, 16)).square().mean()


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_a_kernel_laying_out_its_result_otherwise_than_traced_trains_like_eager(solver, autocast):
    """Batch norm's fake kernel keeps a transposed input's strides, its CPU kernel returns a
    contiguous result: the `view` traced for the flatten failed at the first step ("view
    size is not compatible with input tensor's size and stride"). Under bfloat16 autocast
    its saved statistics are also float32 where the fake kernel says bfloat16. The graph
    takes the kernels' layouts and dtypes (`frontends/kernel_layouts.py`)."""
    import contextlib

    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    context = ((lambda: torch.autocast("cpu", dtype=autocast)) if autocast is not None
               else contextlib.nullcontext)
    errors = side_by_side(_NormOverChannels().train(),
                          lambda m: remat_ir.remat(m, (x,), solver=solver, cost_model="flops"),
                          (x,), {}, lambda out: out, tolerance=1e-30, steps=3,
                          forward_context=context)
    assert errors == {}


class _TransposedPrediction(torch.nn.Module):
    """Returns its loss and a prediction laid out transposed, which the loss also reads, as
    PatchTST's head returns (batch, horizon, channels) from (batch, channels, horizon)."""

    def __init__(self):
        super().__init__()
        self.proj, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 6)

    def forward(self, x, target):
        prediction = self.head(self.proj(x).tanh()).transpose(1, 2)   # (batch, 6, channels)
        return (prediction - target).square().mean(), prediction


@pytest.mark.parametrize("loss_of", ["inner", "outer_sum"])
def test_an_output_laid_out_otherwise_whose_gradient_arrives_broadcast_trains_like_eager(loss_of):
    """Its gradient arrives as a broadcast zero (the caller trains on the returned loss) or
    a broadcast one (`prediction.sum()`): the op adding it to the loss's gradient took the
    other operand's layout, and the `view` traced after it for the prediction's layout
    failed ("view size is not compatible"). Such a gradient now comes in the traced layout."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x, target = torch.randn(2, 3, 4), torch.randn(2, 6, 3)

    def loss(out):
        return out[0] if loss_of == "inner" else out[0] + out[1].sum()

    for solver in ("autograd", "recompute-all"):
        errors = side_by_side(_TransposedPrediction(), lambda m: remat_ir.remat(m, (x, target), solver=solver,
                                                                               cost_model="flops"),
                              (x, target), {}, loss, tolerance=1e-30)
        assert errors == {}, solver


def test_transformers_patchtst_for_prediction_trains_like_eager():
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    from exactness import side_by_side

    torch.manual_seed(0)
    config = PatchTSTConfig(num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
                            prediction_length=8, d_model=16, num_attention_heads=2, num_hidden_layers=1,
                            ffn_dim=32, dropout=0.1, path_dropout=0.1)
    batch = dict(past_values=torch.randn(2, 32, 3), future_values=torch.randn(2, 8, 3))
    errors = side_by_side(PatchTSTForPrediction(config), lambda m: remat_ir.remat(
        m, (), example_kwargs=batch, solver="recompute-all", cost_model="flops"), (), batch,
        lambda out: out.loss, tolerance=1e-30)
    assert errors == {}


def test_transformers_clip_whose_transposed_logits_no_loss_reads_trains_like_eager():
    """CLIP returns `logits_per_image`, the transpose of `logits_per_text`, beside its loss.
    Its gradient, a broadcast zero, leaves the ops after it in eager's layout; copying it
    into the traced layout instead (a first fix for PatchTST's failed view) made the
    `logit_scale` gradient 1.3e-7 off eager's from the second step."""
    import family_models

    from exactness import random_schedule, side_by_side
    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    model, args, kwargs, loss_of = family_models.FAMILIES["clip"]()
    graph = lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")
    schedule = random_schedule(graph, random.Random(1), recompute_share=0.8)
    torch.manual_seed(0)
    model, args, kwargs, loss_of = family_models.FAMILIES["clip"]()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the sweep found it: with more, the sums split otherwise
    try:
        errors = side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), args, kwargs, loss_of,
                              tolerance=1e-30)
    finally:
        torch.set_num_threads(threads)
    assert errors == {}


class _DrawAfterRelaidKernel(torch.nn.Module):
    """A draw over the result of a kernel that lays it out otherwise on CPU than its fake
    kernel says: batch norm over a transposed (batch, length, channels) tensor (contiguous
    on CPU, the input's strides traced), `torch.roll` and `channel_shuffle` of a
    channels-last tensor (channels-last on CPU, contiguous traced), or a linear layer
    there, whose `addmm` or `matmul` tracing picks by the layout."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.proj, self.norm = torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)
        self.conv, self.head = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.Linear(8, 8)

    def forward(self, x):
        if self.kind.startswith("norm"):
            h = self.norm(self.proj(x).transpose(1, 2)).transpose(1, 2)
        else:
            h = self.conv(x.to(memory_format=CL))
            h = torch.roll(h, 1, 2) if self.kind.startswith("roll") else F.channel_shuffle(h, 2)
        if self.kind.endswith("alpha-dropout"):
            h = F.alpha_dropout(h, 0.5, training=True)
        elif self.kind.endswith("linear"):
            h = self.head(h)
        else:
            h = F.dropout(h, 0.5)
        return h.square().mean()


@pytest.mark.parametrize("kind", ["norm-dropout", "norm-alpha-dropout", "roll-dropout",
                                  "shuffle-dropout", "norm-linear"])
@pytest.mark.parametrize("schedule", ["autograd", "random"])
def test_a_draw_after_a_kernel_laying_out_its_result_otherwise_than_traced_is_eagers(kind, schedule):
    """Eager draws a dropout's mask in its input's memory layout. The mask was drawn in the
    traced layout (rewrites decided on it before the graph took the kernel's), so every
    gradient was 0.2-1.7 relative off eager's under every schedule, with the generator
    left where eager's is. Fake tensors now take each kernel's layout while tracing
    (`kernel_layouts.traced_as_run`). Bitwise over two steps, in float32 and under
    bfloat16 autocast (where `addmm` and `matmul` round apart)."""
    import contextlib

    from exactness import random_schedule, side_by_side

    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    x = torch.randn(3, 5, 8) if kind.startswith("norm") else torch.randn(2, 4, 6, 6)

    for context in (contextlib.nullcontext, lambda: torch.autocast("cpu", dtype=torch.bfloat16)):
        def make(model):
            with context():
                if schedule == "autograd":
                    return remat_ir.remat(model, (x,), solver="autograd", cost_model="flops")
                graph = lower_torch(model, (x,), cost_model="flops")
            return ScheduledModule(model, graph, random_schedule(graph, random.Random(1), recompute_share=0.8))

        assert side_by_side(_DrawAfterRelaidKernel(kind), make, (x,), {}, lambda out: out,
                            tolerance=1e-30, forward_context=context) == {}


#: Tails a model's output may end in: some make the backward reuse a dying gradient's
#: buffer (`frontends/buffer_reuse.py`: the softmax backwards, elementwise ops).
_TAILS = {
    "linear": lambda h: h,
    "log-softmax-times-2": lambda h: F.log_softmax(h, -1) * 2,
    "log-of-softmax": lambda h: torch.log(F.softmax(h, -1) + 1e-8),
    "softmax": lambda h: F.softmax(h, -1) * 1.0,
    "tanh": torch.tanh,
}


class _Head(torch.nn.Module):
    def __init__(self, tail: str):
        super().__init__()
        self.tail = tail
        self.body, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 6)

    def forward(self, x):
        return _TAILS[self.tail](self.head(torch.tanh(self.body(x))))


#: Last ops on a feature map whose backward reads `out.sum()`'s broadcast gradient.
_MAP_TAILS = {
    "group_norm": lambda m, h: F.group_norm(h, 4, m.w, m.b),
    "group_norm then flatten": lambda m, h: F.group_norm(h, 4, m.w, m.b).flatten(1),
    "group_norm then silu": lambda m, h: F.silu(F.group_norm(h, 4, m.w, m.b)),
    "group_norm then a bias": lambda m, h: F.group_norm(h, 4) + m.b[:, None, None],
    "instance_norm": lambda m, h: F.instance_norm(h, weight=m.w, bias=m.b),
    "batch_norm": lambda m, h: F.batch_norm(h, None, None, m.w, m.b, training=True),
    "layer_norm": lambda m, h: F.layer_norm(h, (6, 6)),
    "max_pool": lambda m, h: F.max_pool2d(h, 2),
    "bilinear upsampling": lambda m, h: F.interpolate(h, scale_factor=2, mode="bilinear"),
    "reflect pad": lambda m, h: F.pad(h, (1, 1, 1, 1), mode="reflect"),
    "pixel_shuffle": lambda m, h: F.pixel_shuffle(h, 2),
    "log_softmax over channels": lambda m, h: h.log_softmax(1),
}


class _MapTail(torch.nn.Module):
    def __init__(self, tail: str):
        super().__init__()
        self.tail, self.conv = tail, torch.nn.Conv2d(3, 8, 3, padding=1)
        self.w, self.b = torch.nn.Parameter(torch.rand(8) + 0.5), torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return _MAP_TAILS[self.tail](self, F.gelu(self.conv(x)))


@pytest.mark.parametrize("tail, layout, loss", [(tail, torch.contiguous_format, "sum") for tail in sorted(_MAP_TAILS)]
                         + [("group_norm", CL, "sum")]
                         + [(tail, torch.contiguous_format, "permuted") for tail in sorted(_MAP_TAILS)
                            if tail.startswith("group_norm") and "flatten" not in tail], ids=str)
def test_a_last_op_handed_an_output_gradient_laid_out_otherwise_trains_like_eager(tail, layout, loss):
    """`model(x).sum().backward()` hands the output a broadcast gradient (all strides 0),
    and a loss reading the output permuted a permuted one; both are read as they arrive.
    Eager's formula for `native_group_norm` makes its gradient contiguous first; the joint
    graph, traced with a contiguous one, has no such copy, and the CPU kernel read the
    broadcast one past its one element (NaN and 1e35 gradients: hunt86 F0, also through a
    `flatten`) and a permuted one, passed on by a SiLU, as contiguous (10 to 140 off:
    hunt87 F1), silently. Its backward now runs on the gradient as eager's formula lays it
    out; the ops beside it read the gradient as it arrives (a bias's sum over a copy was
    1e-7 off: hunt87 F6)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6).to(memory_format=layout)
    model = _MapTail(tail).to(memory_format=layout)
    weights = torch.randn(2, 6, 6, 8)

    def loss_of(out):
        return out.sum() if loss == "sum" else (out.permute(0, 2, 3, 1) * weights).sum()

    assert side_by_side(model, lambda m: remat_ir.remat(m, (x,), solver="autograd", cost_model="flops"),
                        (x,), {}, loss_of, tolerance=1e-30) == {}


def _read(how: str, out: torch.Tensor, seed: int) -> None:
    """Backward through the output read as a loss reads it: each way hands the model's
    output a gradient laid out otherwise than its contiguous trace."""
    g = torch.Generator().manual_seed(seed)
    if how == "scaled-sum":          # a broadcast scalar: all strides 0
        (out.sum() * 0.1).backward()
    elif how == "sum-over-3":
        (out.sum() / 3).backward()
    elif how == "transposed":        # nll over (batch, classes, ...), CLIP's `logits.t()`
        classes = out.transpose(-1, -2) if out.dim() == 3 else out.t()
        target = torch.randint(0, classes.size(1), (classes.size(0),) + classes.shape[2:], generator=g)
        F.nll_loss(classes, target).backward()
    elif how == "permuted-gradient":
        out.backward(torch.randn(tuple(reversed(out.shape)), generator=g).permute(*reversed(range(out.dim()))))
    else:                            # "mT": a product with a transposed weight
        (out.mT * torch.randn(out.mT.shape, generator=g)).sum().backward()


@search(12, derandomize=True)
@given(tail=st.sampled_from(sorted(_TAILS)),
       how=st.sampled_from(["scaled-sum", "sum-over-3", "transposed", "permuted-gradient", "mT"]),
       rank=st.sampled_from([2, 3]), solver=st.sampled_from(["autograd", "recompute-all"]),
       seed=st.integers(0, 2 ** 16))
def test_output_gradients_of_any_layout_train_like_eager_through_reused_buffers(tail, how, rank, solver, seed):
    """An output's gradient that arrives laid out otherwise (a loss reading the output
    transposed, a scaled sum's broadcast scalar) is read as it arrives, through views that
    take any layout (a 3-d Linear's backward `view`, which runs as eager's `reshape`). The
    backward's buffer reuse wrote `_log_softmax_backward_data` into such a transposed
    buffer: every gradient wrong (0.11 off eager's 0.125), silently; the bias gradient of a
    3-d Linear head was copied first, 2.4e-7 off (both found by a review)."""
    torch.manual_seed(seed)
    model = _Head(tail)
    x = torch.randn((5, 8) if rank == 2 else (3, 4, 8))
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), budget=None, solver=solver, cost_model="flops",
                               cache_dir=False, progress=None)
    for step in range(2):
        out_e, out_s = eager(x), scheduled(x)
        assert torch.equal(out_e, out_s)
        _read(how, out_e, seed + step), _read(how, out_s, seed + step)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert torch.equal(p_e.grad, p_s.grad), (name, (p_e.grad - p_s.grad).abs().max().item())


@st.composite
def _views_of_size_one_dimensions(draw):
    """A tensor of 2-4 dimensions, some of size 1, permuted, and a chain of views of it:
    `view` to its dimensions split or merged (where the strides allow), `unsqueeze`,
    `squeeze`, `transpose`, `expand` of a size-1 dimension, `flatten`."""
    shape = draw(st.lists(st.sampled_from([1, 1, 2, 3, 4]), min_size=2, max_size=4))
    order = draw(st.permutations(range(len(shape))))
    steps = draw(st.lists(st.sampled_from(["view", "unsqueeze", "squeeze", "transpose", "expand",
                                           "flatten"]), min_size=1, max_size=4))
    seeds = draw(st.lists(st.integers(0, 2**16), min_size=len(steps), max_size=len(steps)))
    return shape, order, list(zip(steps, seeds))


def _view_step(tensor: torch.Tensor, step: str, seed: int) -> torch.Tensor:
    """One view of `tensor`, chosen by `step` and `seed` (the same for a real tensor and its fake)."""
    rng = random.Random(seed)
    dims = tensor.dim()
    if step == "view":
        shape = list(tensor.shape)
        if len(shape) > 1 and rng.random() < 0.5:   # merge two neighbours
            at = rng.randrange(len(shape) - 1)
            shape[at:at + 2] = [shape[at] * shape[at + 1]]
        else:                                         # split off a dimension of 1
            at = rng.randrange(len(shape) + 1)
            shape.insert(at, 1)
        try:
            return tensor.view(shape)
        except (RuntimeError, ValueError):   # ValueError: the fake kernel's word for it
            return tensor
    if step == "unsqueeze":
        return tensor.unsqueeze(rng.randrange(dims + 1))
    if step == "squeeze":
        return tensor.squeeze(rng.randrange(dims)) if dims > 1 else tensor
    if step == "transpose":
        return tensor.transpose(rng.randrange(dims), rng.randrange(dims))
    if step == "expand":
        ones = [d for d in range(dims) if tensor.shape[d] == 1]
        if not ones:
            return tensor
        shape = list(tensor.shape)
        shape[rng.choice(ones)] = 3
        return tensor.expand(shape)
    return tensor.flatten(rng.randrange(dims)) if dims > 1 else tensor


@given(case=_views_of_size_one_dimensions())
@search(60)
def test_views_while_tracing_have_eagers_strides_also_in_dimensions_of_size_one(case):
    """The fake kernels of `view` derive the strides of dimensions of size 1 otherwise than
    ATen (a (1, 8, 25) tensor transposed from (1, 25, 8), viewed as (1, 8, 5, 5): batch
    stride 200 traced, 8 in eager). Kernels choose from those strides (the next test), so
    while tracing (`traced_as_run`, under the Python dispatcher as torch.export runs) each
    view of a random chain has the strides eager's has."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remat_ir.frontends.kernel_layouts import traced_as_run

    shape, order, steps = case
    real = start = torch.randn(shape).permute(order)
    eagers = []
    for step, seed in steps:
        real = _view_step(real, step, seed)
        eagers.append((tuple(real.shape), real.stride()))
    with traced_as_run(), FakeTensorMode() as mode, enable_python_dispatcher():
        fake = mode.from_tensor(start)
        for (step, seed), eager in zip(steps, eagers):
            fake = _view_step(fake, step, seed)
            assert (tuple(fake.shape), fake.stride()) == eager, (step, seed)


class _ViewedBackToChannels(torch.nn.Module):
    """diffusers' attention over a feature map: (B, C, H, W) to (B, H*W, C), a linear, and
    back with a transpose and `reshape`; then a convolution and a dropout. For a batch of
    one, the view back has batch stride C in eager and C*H*W traced; `conv2d` then gives a
    contiguous result in eager and a channels-last one traced."""

    def __init__(self):
        super().__init__()
        self.q, self.conv, self.out = torch.nn.Linear(8, 8), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Linear(8, 8)

    def forward(self, x):
        b, c, h, w = x.shape
        hs = self.q(x.view(b, c, h * w).transpose(1, 2))
        hs = self.conv(hs.transpose(-1, -2).reshape(b, c, h, w))
        return self.out(F.dropout(hs.flatten(2).transpose(1, 2), 0.3)).square().mean()


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("schedule", ["autograd", "random"])
def test_a_draw_after_a_view_of_a_batch_of_one_is_eagers(batch, schedule):
    """For a batch of one, the dropout's mask was drawn in the traced (channels-last) layout
    where eager draws it contiguous: outputs 0.66 off, gradients up to 6.3 off, under every
    schedule, silently (a batch of two was exact). Views now take ATen's strides while
    tracing (`kernel_layouts._viewed_as_run`). Bitwise over two steps."""
    from exactness import random_schedule, side_by_side

    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    x = torch.randn(batch, 8, 5, 5)

    def make(model):
        if schedule == "autograd":
            return remat_ir.remat(model, (x,), solver="autograd", cost_model="flops")
        graph = lower_torch(model, (x,), cost_model="flops")
        return ScheduledModule(model, graph, random_schedule(graph, random.Random(1), recompute_share=0.8))

    assert side_by_side(_ViewedBackToChannels(), make, (x,), {}, lambda out: out, tolerance=1e-30) == {}


class _ConvDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.out = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.out(F.dropout(self.conv(x).flatten(2).transpose(1, 2), 0.3)).square().mean()


@pytest.mark.parametrize("lowered_first", [True, False])
def test_a_batch_of_one_whose_batch_stride_differs_from_traced_is_lowered_again(lowered_first, capsys):
    """A channels-last batch of one with batch stride C*H*W and the same batch with stride C
    (`x[0].unsqueeze(0)`) are the same elements, and were one signature. `conv2d` gives a
    contiguous result for the second and a channels-last one for the first, so a graph
    traced for one drew the dropout's mask in another layout than eager for the other
    (loss 0.2094 where eager gives 0.2083, silently). Strides of size-1 dimensions now
    belong to the signature (`types.describe_layout`): each is lowered for itself."""
    torch.manual_seed(0)
    wide = torch.randn(1, 5, 5, 8).permute(0, 3, 1, 2)
    narrow = wide[0].unsqueeze(0)
    assert (wide.stride(), narrow.stride()) == ((200, 1, 40, 8), (8, 1, 40, 8))
    first, second = (wide, narrow) if lowered_first else (narrow, wide)
    model = _ConvDropout()
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (first,), solver="recompute-all", cost_model="flops")
    for x in (first, second, first):
        losses = []
        for run in (eager, scheduled):
            torch.manual_seed(1)
            losses.append(run(x))
            losses[-1].backward()
        assert torch.equal(*losses)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert torch.equal(p_e.grad, p_s.grad), name
        eager.zero_grad(), scheduled.zero_grad()
    assert "new input signature" in capsys.readouterr().err
    assert len(scheduled._plans) == 2


class _PooledToOne(torch.nn.Module):
    """A (B, C, 1, 1) map pooled from a channels-last tensor, whose size-1 strides are
    channels-last while `is_contiguous()` calls it contiguous, per `kind`: a ReLU on it
    (contiguous strides in eager, the traced ones kept by its fake kernel) and a bilinear
    upsample, then tokens through a dropout; `torch.roll` over its channels (the other
    way round) and a nearest upsample with a dropout; tokens made into a map as hybrid
    decoders do, no channels-last anywhere, through the same head, into a linear."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin, self.conv, self.out = torch.nn.Linear(8, 8), torch.nn.Conv2d(8, 8, 1), torch.nn.Linear(8, 8)

    def forward(self, x):
        if self.kind == "roll":
            pooled = torch.roll(F.adaptive_avg_pool2d(x, 1), 1, dims=1)
            return self.conv(F.dropout(F.interpolate(pooled, scale_factor=4), 0.5)).square().mean()
        if self.kind == "tokens":
            x = self.lin(x).transpose(1, 2).reshape(x.shape[0], 8, 4, 4)
        up = F.interpolate(F.relu(self.conv(F.adaptive_avg_pool2d(x, 1))), size=(4, 4), mode="bilinear")
        tokens = up.flatten(2).transpose(1, 2)
        return self.out(tokens if self.kind == "tokens" else F.dropout(tokens, 0.5)).square().mean()


@pytest.mark.parametrize("kind, shape", [("relu-upsample", (1, 8, 4, 4)), ("roll", (2, 8, 4, 4)),
                                         ("tokens", (2, 16, 8))])
@pytest.mark.parametrize("schedule", ["autograd", "random"])
def test_ops_on_maps_of_size_one_laid_out_as_eager_lays_them_out(kind, shape, schedule):
    """Kernels were run for their layout only on tensors `is_contiguous()` calls
    non-contiguous, which ignores dimensions of size 1: the upsample after chose
    channels-last traced where eager chose contiguous (or the other way), and the dropout
    after drew other masks (outputs 0.25-0.55 off, silently), or the graph's `view` for
    a linear failed at the first step ("view size is not compatible"). Bitwise over two
    steps."""
    from exactness import random_schedule, side_by_side

    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    x = torch.randn(shape)
    x = x.to(memory_format=CL) if x.dim() == 4 else x

    def make(model):
        if schedule == "autograd":
            return remat_ir.remat(model, (x,), solver="autograd", cost_model="flops")
        graph = lower_torch(model, (x,), cost_model="flops")
        return ScheduledModule(model, graph, random_schedule(graph, random.Random(1), recompute_share=0.8))

    assert side_by_side(_PooledToOne(kind), make, (x,), {}, lambda out: out, tolerance=1e-30) == {}


class _ReturnsAView(torch.nn.Module):
    """Returns a view of a tensor it made, per `kind`: NHWC tokens permuted to NCHW (as
    ViT and ConvNeXt feature extractors do), or a channel slice of a channels-last map."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin, self.conv = torch.nn.Linear(8, 8), torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        if self.kind == "permuted":
            return self.lin(x).permute(0, 3, 1, 2)
        return self.conv(x)[:, :1]


@pytest.mark.parametrize("kind, x", [("permuted", lambda: torch.randn(1, 4, 4, 8)),
                                     ("channel slice", lambda: torch.randn(2, 8, 4, 4).to(memory_format=CL))])
def test_an_output_viewing_what_the_step_made_has_eagers_strides(kind, x):
    """The step hands such an output over as an alias autograd does not take for a view;
    that alias took new strides for its dimensions of size 1 (batch stride C where eager's
    is C*H*W; channel stride H*W where eager's is 1), and eager code after the model chose
    from them: a head's `conv2d` gave a contiguous result where eager's is channels-last,
    and its dropout drew other masks (found by a review: gradients up to 2.6 off). Strides
    as eager's, and an eager head with a dropout after it trains the model bitwise."""
    torch.manual_seed(0)
    x = x()
    model = _ReturnsAView(kind)
    head = torch.nn.Conv2d(8 if kind == "permuted" else 1, 4, 3, padding=1)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")
    strides = []
    for run in (eager, scheduled):
        out = run(x)
        strides.append(out.stride())
        torch.manual_seed(1)
        F.dropout(head(out), 0.5).square().mean().backward()
    assert strides[0] == strides[1]
    trained = [(name, p_e.grad, p_s.grad) for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters())
               if p_e.grad is not None or p_s.grad is not None]
    assert trained and all(torch.equal(e, s) for _, e, s in trained), [name for name, *_ in trained]
