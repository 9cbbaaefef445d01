"""The memoised call signature (`runtimes/signatures.py` `SignatureMemo`) and the flat
inputs' fast path (`_Lowered.flat_inputs`) give what the general path gives, over
sequences of calls drawn to look alike (the memo must never hand one call another's
signature)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from torch.nn.attention import SDPBackend, sdpa_kernel

import remat_ir
from remat_ir.runtimes.signatures import SignatureMemo, call_signature

from exactness import side_by_side
from strategies import search

_BASE_SHAPES = ((2, 3), (3, 2), (2, 3, 4, 5), (1, 3))
#: Ways a tensor argument may differ from the first call's: in one property at a time.
_VARIANTS = ("same", "fresh", "transposed", "channels_last", "float64", "int64", "requires_grad",
             "non-leaf", "view", "alias")
#: Plain values that compare or hash alike but are described otherwise (0, 0.0, -0.0, False).
_PLAIN = (0, 1, True, False, 1.0, 0.0, -0.0, float("nan"), "a", "1", None, 2 ** 70)


def _variant(kind: str, shape: tuple, first: torch.Tensor, others: list) -> torch.Tensor:
    """A tensor of `shape` (or `first`, or another argument's) as `kind` says."""
    if kind == "same":
        return first
    if kind == "alias" and others:
        return others[0]
    if kind == "transposed" and len(shape) >= 2:
        return torch.zeros(shape[1], shape[0], *shape[2:]).transpose(0, 1)
    if kind == "channels_last" and len(shape) == 4:
        return torch.zeros(shape).contiguous(memory_format=torch.channels_last)
    if kind in ("float64", "int64"):
        return torch.zeros(shape, dtype=getattr(torch, kind))
    if kind == "requires_grad":
        return torch.zeros(shape, requires_grad=True)
    if kind == "non-leaf":
        return torch.zeros(shape, requires_grad=True) * 1
    if kind == "view":
        return torch.zeros(shape).view(shape)
    return torch.zeros(shape)


@st.composite
def _calls(draw) -> list:
    """2-8 calls of one structure (one to three positional and keyword arguments), each
    argument a tensor or a plain value that differs from the first call's in one way
    (`_VARIANTS`, `_PLAIN`); at times one argument held in a list (the general path),
    autocast on or another default dtype."""
    slots = draw(st.lists(st.sampled_from(["tensor", "plain"]), min_size=1, max_size=3))
    names = draw(st.lists(st.sampled_from(["x", "mask", "labels"]), max_size=len(slots) - 1,
                          unique=True))
    shapes = [draw(st.sampled_from(_BASE_SHAPES)) for _ in slots]
    firsts = [torch.zeros(shape) for shape in shapes]
    calls = []
    for _ in range(draw(st.integers(2, 8))):
        listed = draw(st.integers(0, 3)) == 0
        values: list = []
        for kind, shape, first in zip(slots, shapes, firsts):
            if kind == "tensor":
                others = [v for v in values if isinstance(v, torch.Tensor) and v.shape == shape]
                values.append(_variant(draw(st.sampled_from(_VARIANTS)), shape, first, others))
            else:
                values.append(draw(st.sampled_from(_PLAIN)))
        positional = values[:len(values) - len(names)]
        args = tuple([v] if listed and i == 0 else v for i, v in enumerate(positional))
        kwargs = dict(zip(names, values[len(positional):]))
        calls.append((args, kwargs, draw(st.sampled_from(["plain", "autocast", "float64 default",
                                                          "math attention"]))))
    return calls


def _under(state: str, fn):
    if state == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn()
    if state == "math attention":
        with sdpa_kernel(SDPBackend.MATH):
            return fn()
    if state == "float64 default":
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return fn()
        finally:
            torch.set_default_dtype(before)
    return fn()


@search(200)
@given(_calls())
def test_the_memoised_signature_is_the_call_signature(calls):
    memo = SignatureMemo(size=4)   # small: entries are also dropped and made again
    for args, kwargs, state in calls * 2:
        found = _under(state, lambda: memo(args, kwargs))
        expected = _under(state, lambda: call_signature(args, kwargs))
        assert found == expected and found.shown == expected.shown


@search(100)
@given(_calls(), st.data())
def test_flat_inputs_take_the_leaves_the_general_path_takes(calls, data):
    """A graph lowered for one call's inputs gets, from a call of that signature, the
    leaves pytree flattens, and refuses a call structured otherwise as before."""
    from torch.utils import _pytree as pytree

    from remat_ir.runtimes import torch as runtime
    for args, kwargs, _ in calls:
        order = data.draw(st.permutations(list(kwargs)))
        spec = pytree.tree_structure((args, {k: kwargs[k] for k in order}))
        lowered = object.__new__(runtime._Lowered)
        lowered.in_spec, lowered.keywords = spec, order
        lowered.flat_positional = runtime._flat_positional(spec)
        lowered.user_input_meta = []
        shuffled = {k: kwargs[k] for k in data.draw(st.permutations(list(kwargs)))}
        expected, _ = pytree.tree_flatten((args, {k: kwargs[k] for k in order}))
        found = lowered.flat_inputs(args, shuffled)
        assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected))
        for other_args, other_kwargs, _ in calls:
            try:
                general, other_spec = pytree.tree_flatten(
                    (other_args, {k: other_kwargs[k] for k in order} if set(other_kwargs) == set(order)
                     else other_kwargs))
            except KeyError:
                continue
            if other_spec != spec:
                try:
                    lowered.flat_inputs(other_args, other_kwargs)
                except runtime.RuntimeInputError:
                    continue
                raise AssertionError("a call structured otherwise was taken")
            assert all(a is b for a, b in zip(lowered.flat_inputs(other_args, other_kwargs), general))


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d)).square().mean()


@pytest.mark.parametrize("lowered_under, called_under", [(None, SDPBackend.MATH), (SDPBackend.MATH, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_call_under_other_attention_kernels_is_planned_for_them(lowered_under, called_under, dtype,
                                                                   capsys):
    """The trace holds the attention kernel it picked; eager picks per call, and
    `sdpa_kernel(SDPBackend.MATH)` around a call (or around the lowering) made the
    gradients differ from eager's, silently (found by a review: 9e-10 in float32, 6e-5
    under bfloat16 autocast). The kernels a call may pick are part of its signature."""
    def under(backend):
        return sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16)

    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(4, 64, 32)
    with under(lowered_under), autocast():
        scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops",
                                   cache_dir=False)
    with under(called_under):
        errors = side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss,
                              tolerance=1e-30, forward_context=autocast)
    assert errors == {}
    assert "remat-ir: new input signature (scaled dot product attention may use" in capsys.readouterr().err


class _OwnKernelAttention(torch.nn.Module):
    """Picks SDPA's math kernel for its attention itself (diffusers' `_native_math`
    attention backend), with a dropout or a boolean mask as `how` says, or as ATen's op
    itself ("aten")."""

    def __init__(self, how: str, kernels=SDPBackend.MATH):
        super().__init__()
        self.qkv, self.out, self.how = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32), how
        self.kernels = kernels

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool).tril() if self.how == "mask" else None
        attention = torch.ops.aten.scaled_dot_product_attention if self.how == "aten" else \
            F.scaled_dot_product_attention
        with sdpa_kernel(self.kernels):
            y = attention(q, k, v, attn_mask=mask, is_causal=self.how == "causal",
                          dropout_p=0.2 if self.how == "dropout" else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, t, d)).square().mean()


@pytest.mark.parametrize("how", ["causal", "mask", "dropout", "aten"])
def test_attention_kernels_a_forward_picks_for_itself_train_as_eagers(how):
    """Found by hunt55: `with sdpa_kernel(SDPBackend.MATH):` inside the forward, the graph
    ran the kernel AOTAutograd picked after the block had ended (the CPU flash one), and
    every gradient was 3.7e-9 off eager's, silently (hunt57: ATen's op called directly).
    Loss, gradients and generator state bitwise eager's over 3 steps."""
    torch.manual_seed(0)
    model, x = _OwnKernelAttention(how), torch.randn(4, 16, 32)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", cache_dir=False)
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30, steps=3) == {}


def test_attention_kernels_a_forward_picks_for_itself_under_autocast_are_refused_by_line():
    """Under bfloat16 autocast such a forward trained 6e-5 off eager's gradients, decomposed
    or not: refused, naming the line and the way out. Not where eager's call takes a fused
    kernel, the call's too (`[FLASH_ATTENTION, MATH]`: exact, and refused; hunt57)."""
    from remat_ir.frontends.errors import LoweringError

    torch.manual_seed(0)
    model, x = _OwnKernelAttention("causal"), torch.randn(4, 16, 32)
    said = r"picks attention kernels .* at .*test_signatures.py:\d+.* `sdpa_kernel` around the call"
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(LoweringError, match=said):
        remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", cache_dir=False)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    model = _OwnKernelAttention("causal", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    with autocast():
        scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", cache_dir=False)
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30,
                        forward_context=autocast) == {}


class _DiffusersAttention(torch.nn.Module):
    """Attention through diffusers' dispatch, which picks its kernel by a global backend."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).unbind(2)
        return self.out(dispatch_attention_fn(q, k, v).reshape(b, t, d)).square().mean()


def test_a_call_under_another_diffusers_attention_backend_is_planned_for_it(capsys):
    """Found by hunt55: diffusers' global attention backend switched after `remat`
    (`with attention_backend("_native_math"):`) ran the traced one, 1.5e-8 off eager's
    gradients, silently. It is part of the call's attention kernels now."""
    from diffusers.models.attention_dispatch import attention_backend

    torch.manual_seed(0)
    model, x = _DiffusersAttention(), torch.randn(4, 16, 32)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops", cache_dir=False)
    scheduled(x).backward()
    model.zero_grad()
    capsys.readouterr()
    with attention_backend("_native_math"):
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
    assert "diffusers' attention backend _native_math, lowered where it might use" in capsys.readouterr().err


def test_a_plan_without_a_planner_runs_under_another_thread_count_not_another_onednn_setting():
    """A graph loaded from a file (no planner to plan again) ran nowhere with another
    thread count than it was profiled with: the thread count changes oneDNN's workspaces,
    not its bits. oneDNN on or off does change bits (an LSTM's), so it is compared."""
    import dataclasses

    x = torch.randn(2, 3)
    lowered = dataclasses.replace(call_signature((x,), {}), cpu_kernels="oneDNN on, NNPACK on, 1 thread")
    for kernels, runs in [("oneDNN on, NNPACK on, 4 threads", True), ("oneDNN on, NNPACK off, 1 thread", True),
                          ("oneDNN off, NNPACK on, 1 thread", False)]:
        call = dataclasses.replace(lowered, cpu_kernels=kernels)
        assert call != lowered
        assert lowered.same_but_where(call) is runs
    on_cuda = dataclasses.replace(lowered, device="cuda", cpu_kernels="")
    assert lowered.same_but_where(on_cuda)


class _Concatenates(torch.nn.Module):
    """Concatenates its keyword features in the order they come, as a tabular model may."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, scale=1.0, **features):
        return self.lin(torch.cat(list(features.values()), dim=-1)) * scale


def test_keywords_a_forward_takes_as_kwargs_are_compared_in_the_order_passed(capsys):
    """Found by a review: keywords were compared by name alone, so another order ran the
    graph traced for the first (1.62 off eager's output, silently). A named parameter
    (`scale`) passed elsewhere in the order is the same call."""
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 5)
    scheduled = remat_ir.remat(_Concatenates(), (), example_kwargs={"a": a, "scale": 2.0, "b": b},
                               solver="recompute-all", cost_model="flops")
    scheduled(scale=2.0, a=a, b=b)
    assert len(scheduled.plans) == 1
    capsys.readouterr()
    out = scheduled(b=b, a=a, scale=2.0)
    assert "come in the order b, a, lowered in the order a, b" in capsys.readouterr().err
    assert torch.equal(out, scheduled.__dict__["_model"](b=b, a=a, scale=2.0))
