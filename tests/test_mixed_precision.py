"""Mixed precision: the scheduled module follows the autocast state of each call, with
gradients bitwise equal to eager's under the same autocast (backward called outside
autocast, as PyTorch recommends). CUDA cases run where a GPU is present."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn as nn

import remat_ir

from exactness import DEVICES


class _Fp32Region(nn.Module):
    """A trainable layer the model runs with autocast off (an fp32 router or head)."""

    def __init__(self):
        super().__init__()
        self.a, self.r, self.b = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.norm = nn.LayerNorm(32)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        h = self.drop(torch.relu(self.a(x)))
        with torch.autocast(x.device.type, enabled=False):
            h = self.r(h.float()).tanh()
        return self.b(self.norm(h)).float().pow(2).mean()


def _llama(device):
    """Llama with grouped-query attention (two key/value heads for four query heads):
    traced, it repeated the keys and values where eager calls SDPA with `enable_gqa`,
    a bfloat16 last bit off eager's (frontends/transformers_masks.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_cache=False, attention_dropout=0.1)
    model = LlamaForCausalLM(config).train().to(device)
    ids = torch.randint(0, 128, (2, 16), device=device)
    return model, dict(input_ids=ids, labels=ids), lambda out: out.loss


def _gpt2(device):
    """Dropout 0.1 everywhere: 1/0.9 rounds in 16 bits, where eager's dropout backward
    multiplies by the rounded scale (`frontends/dropout_masks.py`)."""
    from torch_models import gpt2
    model, _, kwargs, loss_of = gpt2(n_layer=1)
    return model.to(device), {k: v.to(device) if torch.is_tensor(v) else v for k, v in kwargs.items()}, loss_of


def _mlp(device):
    torch.manual_seed(0)
    model = _Fp32Region().to(device)
    return model, dict(x=torch.randn(8, 16, device=device)), lambda out: out


def _step(model, batch, loss_of, autocast, seed, scaler=None):
    torch.manual_seed(seed)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        out = model(**batch)
        loss = loss_of(out)
    (scaler.scale(loss) if scaler else loss).backward()
    return out, loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [_mlp, _llama, _gpt2], ids=["fp32_region", "llama", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_follows_each_call_and_matches_eager(make, dtype, device, capsys):
    model, batch, loss_of = make(device)
    eager = copy.deepcopy(model)
    # Lowered in fp32; then called under autocast, then outside it again.
    scheduled = remat_ir.remat(model, batch, budget=None, solver="recompute-all", cost_model="flops")
    for step, autocast in enumerate((dtype, None, dtype)):
        out_e, loss_e = _step(eager, batch, loss_of, autocast, step)
        out_s, loss_s = _step(scheduled, batch, loss_of, autocast, step)
        assert loss_s.dtype == loss_e.dtype and torch.equal(loss_e, loss_s), (step, loss_e, loss_s)
        for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
            assert torch.equal(p_e.grad, p_s.grad), (step, name)
            p_e.grad = p_s.grad = None
    assert len(scheduled.plans) == 2
    assert capsys.readouterr().err.count(f"autocast is {device} {str(dtype)[6:]}, lowered under off") == 1


def test_fp16_with_grad_scaler_trains_like_eager():
    model, batch, loss_of = _mlp("cpu")
    eager = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.float16):
        scheduled = remat_ir.remat(model, batch, budget=None, solver="recompute-all", cost_model="flops")
    runs = []
    for m in (eager, scheduled):
        optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        losses = []
        for step in range(3):
            _, loss = _step(m, batch, loss_of, torch.float16, step, scaler)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            losses.append(loss.detach())
        runs.append((losses, [p.detach().clone() for p in m.parameters()], scaler.get_scale()))
    (losses_e, params_e, scale_e), (losses_s, params_s, scale_s) = runs
    assert all(torch.equal(a, b) for a, b in zip(losses_e, losses_s))
    assert all(torch.equal(a, b) for a, b in zip(params_e, params_s))
    assert scale_e == scale_s


class _SharedWeight(nn.Module):
    """One weight read by three matrix products (a weight shared between layers): cast
    there by autocast, or by the program itself (`explicit`), or also read directly
    (`direct` reads in float32, each a part of its gradient)."""

    def __init__(self, explicit: bool = False, direct: int = 0):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.explicit, self.direct = explicit, direct

    def forward(self, x):
        w = (lambda: self.w.to(torch.get_autocast_dtype("cpu"))) if self.explicit else (lambda: self.w)
        y = (((x @ w()).relu() @ w()).tanh() @ w()).float().square().sum()
        reads = (self.w.sum(), self.w.square().sum())[:self.direct]
        return y + sum(reads) if reads else y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("explicit, direct", [(False, 0), (True, 0), (False, 1), (False, 2)],
                         ids=["autocast_casts", "explicit_casts", "and_read_directly", "and_read_directly_twice"])
def test_a_weight_cast_for_several_ops_gets_eagers_gradient(dtype, explicit, direct):
    """Eager casts the weight once (autocast's cache) and sums its readers' gradients in
    the autocast dtype; the trace casts it per reader and sums in float32 (up to 0.06
    off in bfloat16) unless the lowering shares the cast (`frontends/autocast_casts.py`).
    Casts the program writes are not cached by eager and stay apart. A weight also read
    directly gets those parts added beside the cast back where eager's autograd adds
    them (an input so read by two products and `torch.cdist`: 3e-4 off before; read
    directly twice, it was left as traced with a warning until 2026-12-05)."""
    torch.manual_seed(0)
    model, x = _SharedWeight(explicit, direct), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=dtype):
        scheduled = remat_ir.remat(model, (x,), budget=None, solver="recompute-all", cost_model="flops")
    casts = [n for n in scheduled.graph.proto.nodes if n.op == "aten._to_copy.default"
             and scheduled.graph.value(n.inputs[0]).name == "w"]
    assert len(casts) == (3 if explicit else 1)
    for step in range(2):
        for m in (eager, scheduled):
            with torch.autocast("cpu", dtype=dtype):
                loss = m(x)
            loss.backward()
        assert torch.equal(eager.w.grad, model.w.grad), (step, (eager.w.grad - model.w.grad).abs().max())
        eager.w.grad = model.w.grad = None


class _CastToFloat(torch.autograd.Function):
    """PyTorch's recipe for a Function that must run in float32 under autocast."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.t() @ grad


class _Undecorated(torch.autograd.Function):
    """No decorator: eager runs its forward under the caller's autocast, its backward
    outside it."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.tanh(x @ w).float()

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        y = torch.tanh(x @ w)
        grad = grad * (1 - y * y)
        return grad @ w.t(), x.t() @ grad


class _WithFunction(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function, self.w = function, torch.nn.Parameter(torch.randn(16, 16) / 4)
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        # Under autocast the linear's output is bfloat16 and `w` float32: the Function that
        # casts its inputs gets both; the other gets float32 inputs.
        h = self.linear(x) if self.function is _CastToFloat else x
        return self.linear(self.function.apply(h, self.w)).float().pow(2).mean()


@pytest.mark.parametrize("function", [_CastToFloat, _Undecorated])
def test_a_custom_function_under_autocast_trains_like_eager(function):
    """A Function's forward is opaque to tracing, so the graph holds none of the casts
    autocast makes in it, and the runtime runs segments without autocast: undecorated, its
    matmul ran in float32 where eager's ran in bfloat16 (gradients 3e-3 off), and
    `custom_fwd(cast_inputs=torch.float32)` cast nothing, so bfloat16 met float32 in the
    matmul and the first step crashed. Its op now runs under the autocast state it was
    called under."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 16)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def lowered_under_autocast(model):
        # Not around the training: eager's cast cache lives until the outermost autocast
        # region ends, and would keep the first step's casts.
        with autocast():
            return remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")

    errors = side_by_side(_WithFunction(function), lowered_under_autocast, (x,), {},
                          lambda loss: loss, forward_context=autocast)
    assert errors == {}


class _ReadTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(torch.tanh(self.linear(x))).float().pow(2).mean()


def test_training_with_autocasts_cache_off_is_planned_for_it(capsys):
    """A weight read by two ops under autocast: with the cast cache on eager casts it once
    and sums its gradient in bfloat16 (the graph shares one cast); with it off, once per
    reader, summing in float32. A graph lowered with the cache on trained cache-off calls
    3.4e-3 off eager's; the cache's state is now part of the signature."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 16)

    def lowered(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")

    errors = side_by_side(_ReadTwice(), lowered, (x,), {}, lambda loss: loss,
                          forward_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16,
                                                                 cache_enabled=False))
    assert errors == {}
    assert "autocast's cast cache is off, lowered with it on" in capsys.readouterr().err


@torch.library.custom_op("remat_ir_tests::mm_tanh", mutates_args=())
def _mm_tanh(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A fused matrix product and tanh, given an autocast rule below."""
    return torch.tanh(x @ w)


_mm_tanh.register_fake(lambda x, w: x.new_empty(x.shape[0], w.shape[1]))


def _mm_tanh_backward(ctx, grad):
    x, w, out = ctx.saved_tensors
    g = grad * (1 - out * out)
    return g @ w.t(), x.t() @ g


_mm_tanh.register_autograd(_mm_tanh_backward,
                           setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs, output))
torch.library.register_autocast("remat_ir_tests::mm_tanh", "cpu", torch.bfloat16)


class _CustomOpReadsTwice(torch.nn.Module):
    """`inside`: the forward enters its own autocast block; otherwise the caller's."""

    def __init__(self, inside: bool):
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
        self.w = torch.nn.Parameter(torch.randn(16, 16) * 0.3)
        self.inside = inside

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.inside else contextlib.nullcontext():
            h = _mm_tanh(self.inner(x), self.w)
            return self.outer(h + _mm_tanh(h, self.w)).float().square().mean()


@pytest.mark.parametrize("inside", [False, True], ids=["callers-autocast", "forwards-autocast"])
def test_a_weight_two_custom_op_calls_cast_by_their_autocast_rule_trains_like_eager(inside):
    """A custom op's autocast rule (`torch.library.register_autocast`) casts with a plain
    `.to()`, which autocast's cache never sees: eager casts the weight once per call and
    sums its two gradients in float32. Taken as autocast's cached cast, one cast was shared
    and the gradients summed in bfloat16, 3.7e-4 off (found by hunt63); under an autocast
    block inside the forward, 2.4e-4 off (hunt65)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 8)
    caller = (contextlib.nullcontext if inside else lambda: torch.autocast("cpu", dtype=torch.bfloat16))

    def lowered(model):
        with caller():
            return remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")

    errors = side_by_side(_CustomOpReadsTwice(inside), lowered, (x,), {}, lambda loss: loss, tolerance=1e-30,
                          forward_context=caller)
    assert errors == {}


class _TwoRegions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = (x @ self.w).relu()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = h @ self.w
        return h.float().pow(2).mean()


def test_a_weight_cast_in_two_autocast_blocks_of_the_forward_trains_like_eager():
    """Eager's cast cache ends with each `torch.autocast` block: a weight read in two
    blocks is cast twice and its gradient summed in float32. The graph shared one cast
    across the blocks (2e-3 off eager's)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    errors = side_by_side(_TwoRegions(), lambda m: remat_ir.remat(m, (x,), cost_model="flops",
                                                                  solver="recompute-all"),
                          (x,), {}, lambda loss: loss)
    assert errors == {}


class _Rotary(nn.Module):
    """Rotary tables computed with autocast off (transformers 5.17's Llama), their
    product transposed: a result whose strides the kernel gives otherwise than traced."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.rand(8), persistent=False)

    def forward(self, x, positions):
        with torch.autocast("cpu", enabled=False):
            freqs = (self.inv_freq[None, :, None].expand(positions.shape[0], -1, 1)
                     @ positions[:, None, :].float()).transpose(1, 2)
            cos = freqs.cos()
        return (self.proj(x) * cos).float().square().mean()


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_a_region_with_autocast_off_lowered_under_autocast_trains_like_eager(solver):
    """Lowered under the caller's bfloat16 autocast, the layout check after tracing
    (`kernel_layouts.match_kernel_layouts`) ran the graph's float32 product of the region
    again under that autocast: it crashed inside torch ("Tensor dtype mismatch")."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x, positions = torch.randn(2, 16, 8), torch.arange(16).expand(2, 16) * 37
    errors = side_by_side(_Rotary(), lambda m: remat_ir.remat(m, (x, positions), cost_model="flops",
                                                              solver=solver),
                          (x, positions), {}, lambda loss: loss,
                          forward_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert errors == {}


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
@pytest.mark.parametrize("precision", ["bf16-autocast", "bf16", "fp16"])
def test_dropout_over_a_transposed_tensor_in_16_bits_trains_like_eager(precision, solver):
    """`nn.TransformerEncoderLayer(batch_first=True)` drops out attention's output, which
    arrives transposed: that dropout stays one op (its mask follows the layout), and its
    backward multiplied by the unrounded 1/(1-p) where eager's multiplies by the rounded
    one (gradients 6e-3 to 9e-3 relative off eager's in bfloat16, 1.3e-3 in float16)."""
    from exactness import side_by_side
    from remat_ir.runtimes.torch import ScheduledModule
    from remat_ir.lowering import lower_torch

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    x = torch.randn(3, 5, 16)
    autocast = precision == "bf16-autocast"
    if not autocast:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        layer, x = layer.to(dtype), x.to(dtype)

    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)

    with context():
        graph = lower_torch(layer, (x,), cost_model="flops")
    schedule = remat_ir.plan(graph, None, solver)
    weights = torch.randn(3, 5, 16)
    errors = side_by_side(layer, lambda m: ScheduledModule(m, graph, schedule), (x,), {},
                          lambda out: (out.float() * weights).sum(), forward_context=context,
                          tolerance=1e-1)
    assert errors == {}, errors


class _Pairs(nn.Module):
    """`nn.Bilinear` under the caller's autocast, or in a block with autocast off."""

    def __init__(self, off: bool):
        super().__init__()
        self.proj, self.pair, self.off = nn.Linear(4, 4), nn.Bilinear(4, 4, 3), off

    def forward(self, x):
        h = self.proj(x).float()
        if self.off:
            with torch.autocast("cpu", enabled=False):
                return self.pair(h, x).sum()
        return self.pair(h, x).sum()


def test_a_bilinear_under_autocast_is_refused_with_the_way_out():
    """Eager's `_trilinear` runs its products through autocast's casts; the graph runs it
    whole, outside autocast (output 6e-3 off eager's, silently). Refused naming the
    module; with autocast off around it, it trains like eager."""
    from exactness import side_by_side
    from remat_ir.frontends.errors import LoweringError

    torch.manual_seed(0)
    x = torch.randn(6, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(LoweringError, match=r"torch.nn.Bilinear \(aten._trilinear\) at pair "
                                                r"in _Pairs: .*enabled=False"):
            remat_ir.remat(_Pairs(off=False), (x,), cost_model="flops", cache_dir=False)

    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def make(m):
        with context():
            return remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops",
                                  cache_dir=False)

    errors = side_by_side(_Pairs(off=True), make, (x,), {}, lambda loss: loss,
                          forward_context=context)
    assert errors == {}, errors


class _WhollyUnderAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return torch.log_softmax(self.b(self.norm(torch.relu(self.a(x)))), -1).float().pow(2).mean()


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
@pytest.mark.parametrize("make, refused", [(_Fp32Region, True), (_WhollyUnderAutocast, False)],
                         ids=["a-region-with-autocast-off", "wholly-under-autocast"])
def test_backward_inside_the_autocast_block_trains_like_eager_or_is_refused(make, refused, solver):
    """Eager's backward called inside the autocast block runs under autocast, which casts
    the backward ops of a region the forward ran with autocast off (its matmuls in
    bfloat16); remat-ir's segments run without autocast, so such a step gave gradients
    1.2e-4 off eager's, silently (found by a review). It is refused before anything is
    computed, naming the op and the way out; a model whose backward autocast leaves as it
    is trains as eager's."""
    from exactness import side_by_side
    from remat_ir.ir.errors import RematIRError

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    if refused:
        scheduled = remat_ir.remat(make(), (x,), cost_model="flops", solver=solver)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = scheduled(x)
            with pytest.raises(RematIRError, match=r"^backward\(\) runs inside torch.autocast\('cpu', "
                                                   r"dtype=torch.bfloat16\): eager's backward would then run "
                                                   r"aten\.\w+\.default .*call backward\(\) after the autocast "
                                                   r"block"):
                loss.backward()
        assert all(p.grad is None for p in scheduled.parameters())
        return

    def inside(m):
        return remat_ir.remat(m, (x,), cost_model="flops", solver=solver)

    errors = side_by_side(make(), inside, (x,), {}, lambda loss: loss, backward_context=lambda: torch.autocast(
        "cpu", dtype=torch.bfloat16), forward_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert errors == {}


class _ReadsAutocastDtype(nn.Module):
    """Branches on the autocast dtype and opens an autocast block without a dtype (which
    takes the one set around the call), whether autocast is on or not."""

    def __init__(self):
        super().__init__()
        self.a, self.o = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        if torch.get_autocast_dtype("cpu") == torch.float16:
            h = h + 1
        with torch.autocast("cpu"):
            h = self.o(torch.tanh(h))
        return h.float().pow(2).mean()


def test_the_autocast_dtype_set_with_autocast_off_is_part_of_the_signature(capsys):
    """`torch.autocast("cpu", dtype=torch.float16, enabled=False)` around a call leaves
    autocast off but sets the dtype a forward reads and an inner block takes. The
    signature held the dtype only with autocast on, so the graph lowered outside autocast
    ran its traced branch: the loss 17.5 off eager's, silently (found by a review)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    errors = side_by_side(_ReadsAutocastDtype(), lambda m: remat_ir.remat(m, (x,), cost_model="flops",
                                                                          solver="recompute-all"),
                          (x,), {}, lambda loss: loss,
                          forward_context=lambda: torch.autocast("cpu", dtype=torch.float16, enabled=False))
    assert errors == {}, errors
    assert "autocast is cpu off with dtype float16, lowered under off" in capsys.readouterr().err


class _InnerBlockReadsTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.o = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
            h = self.a(torch.tanh(h)) + h
        return self.o(h.float()).pow(2).mean()


@contextlib.contextmanager
def _cache_off_globally():
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(True)


@pytest.mark.parametrize("context", [
    _cache_off_globally,
    lambda: torch.autocast("cpu", enabled=False, cache_enabled=False)], ids=["set-globally", "outer-block-off"])
def test_autocasts_cache_turned_off_outside_autocast_is_part_of_the_signature(context, capsys):
    """An autocast block inside the forward takes the cast cache's setting of the caller
    (`torch.is_autocast_cache_enabled()`), autocast being on around the call or not. The
    signature held it only with autocast on, so a graph lowered with the cache on shared
    the cast of a weight the block read twice where eager's casts it per reader: its
    gradient 3.1e-3 relative off eager's, silently (found by a review)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    errors = side_by_side(_InnerBlockReadsTwice(), lambda m: remat_ir.remat(m, (x,), cost_model="flops",
                                                                            solver="recompute-all"),
                          (x,), {}, lambda loss: loss, forward_context=context)
    assert errors == {}, errors
    assert "autocast's cast cache is off, lowered with it on" in capsys.readouterr().err


class _Factory(nn.Module):
    """A tensor made by a factory op, whose dtype the default dtype gives."""

    def __init__(self):
        super().__init__()
        self.a, self.o = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.o(torch.tanh(self.a(x)) * (torch.ones(16) * 1.1))


class _Promoted(nn.Module):
    """An integer tensor divided by a Python float: the result takes the default dtype."""

    def __init__(self):
        super().__init__()
        self.a, self.o = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.o(torch.tanh(self.a(x)) * (torch.arange(16) / 16.0 + 0.5))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return self.o(a.transpose(1, 2).reshape(b, t, d))


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _matmul_precision(precision):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def _flushing_denormals():
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


class _Denormal(nn.Module):
    """Computes denormal values (1e-39) that a recomputation with denormals flushed loses."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.b(torch.sin(self.a(x) * 1e-39 * 1e30))


_CHANGED_BEFORE_BACKWARD = {
    "default-dtype-float16-then-float32": (
        _Factory, (8, 16), lambda: _default_dtype(torch.float16), contextlib.nullcontext,
        r"^the default dtype is torch\.float32 in this backward, where this step's forward ran under "
        r"torch\.float16: the backward computes aten\.ones\.default .* again, .*call "
        r"torch\.set_default_dtype after backward\(\), or before the forward$"),
    "default-dtype-float64-in-backward": (
        _Promoted, (8, 16), contextlib.nullcontext, lambda: _default_dtype(torch.float64),
        r"^the default dtype is torch\.float64 in this backward, where this step's forward ran under "
        r"torch\.float32: the backward computes aten\.div\.Tensor "),
    "matmul-precision": (
        _Attention, (2, 8, 32), lambda: _matmul_precision("medium"), contextlib.nullcontext,
        r"^torch\.backends\.mkldnn\.matmul\.fp32_precision changed between this step's forward and its "
        r"backward \(from 'bf16' to 'ieee'; torch\.set_float32_matmul_precision sets it too\): .*change "
        r"it after backward\(\), or before the forward$"),
    "flush-denormal": (
        _Denormal, (64, 16), contextlib.nullcontext, _flushing_denormals,
        r"^torch\.set_flush_denormal\(True\) was called between this step's forward and its backward: "
        r".*denormal numbers would be flushed to zero .*set it before the forward, or after backward\(\)$"),
}


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
@pytest.mark.parametrize("case", list(_CHANGED_BEFORE_BACKWARD))
def test_a_setting_changed_between_forward_and_backward_is_refused_where_recomputed(case, solver):
    """The default dtype or the float32 matmul precision changed between a step's forward
    and its backward: eager's backward uses what its forward saved, while a plan computing
    forward values again in the backward computed them under the new setting: gradients
    1.1e-2 (a factory op in float32 for float16) or 9.5e-7 (a matmul in float32 for
    bfloat16) off eager's, silently, or a dtype error deep in the backward (float64 for
    float32), found by a review; so did denormals flushed (`torch.set_flush_denormal`) in
    the backward only (1.5e-8 off). Refused with the setting named; a plan that computes
    nothing again trains as eager's."""
    from remat_ir.ir.errors import RematIRError

    make, shape, forward_setting, backward_setting, refusal = _CHANGED_BEFORE_BACKWARD[case]
    torch.manual_seed(0)
    model = make()
    eager = copy.deepcopy(model)
    x = torch.randn(*shape)
    with forward_setting():
        scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver=solver,
                                   budget=None if solver == "autograd" else 10**7)
        out_e, out_s = eager(x), scheduled(x)
    assert torch.equal(out_e, out_s)
    with backward_setting():
        out_e.pow(2).sum().backward()
        if solver == "recompute-all":
            with pytest.raises(RematIRError, match=refusal):
                out_s.pow(2).sum().backward()
            assert all(p.grad is None for p in scheduled.parameters())
            return
        out_s.pow(2).sum().backward()
    for (name, p_e), p_s in zip(eager.named_parameters(), scheduled.parameters()):
        assert torch.equal(p_e.grad, p_s.grad), name


class _TargetUnderNoGrad(nn.Module):
    """Reads `a` once under no_grad (a target through the same weights, as
    self-distillation computes it) and twice with gradients."""

    def __init__(self):
        super().__init__()
        self.a, self.o = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x, x2):
        with torch.no_grad():
            target = self.a(x2)
        h = self.a(x)
        h = self.a(torch.tanh(h)) + h
        return self.o(h), target


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_a_weight_also_read_under_no_grad_shares_its_cast_as_eager(solver, recwarn):
    """Under autocast eager caches the casts made with gradients only: the two reads of
    `a` with gradients share one cast, their gradients summed in bfloat16, and the read
    under no_grad casts apart and adds no gradient. The graph counted the no_grad cast
    among the weight's casts, so it kept a cast per reader: 1.8e-3 relative off eager's,
    with a warning of a use that was not there (found by a review)."""
    from exactness import side_by_side

    torch.manual_seed(0)
    x, x2 = torch.randn(8, 16), torch.randn(8, 16)

    def lowered(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return remat_ir.remat(m, (x, x2), cost_model="flops", solver=solver)

    def loss_of(outputs):
        out, target = outputs
        return out.float().pow(2).mean() + (out.float() - target.float()[:, :4]).pow(2).mean()

    errors = side_by_side(_TargetUnderNoGrad(), lowered, (x, x2), {}, loss_of,
                          forward_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert errors == {}, errors
    assert not [w for w in recwarn if "cast by autocast" in str(w.message)]
