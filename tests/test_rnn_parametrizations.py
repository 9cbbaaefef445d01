"""Parametrized weights of recurrent modules: eager's `nn.RNNBase` evaluates each several
times per call, a traced graph fewer. Pure parametrizations train as eager; one that
draws or changes state is refused at lowering (found by hunt58: silently other dropout
masks, other generator state, other `spectral_norm` vectors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

import remat_ir
from remat_ir.frontends.torch import LoweringError

from exactness import side_by_side


class _WeightDropout(torch.nn.Module):
    """DropConnect on a recurrent weight, as AWD-LSTM drops its hidden-to-hidden weights."""

    def forward(self, weight):
        return F.dropout(weight, 0.3, self.training)


class _Scaled(torch.nn.Module):
    def forward(self, weight):
        return weight * 0.5


class _Recurrent(torch.nn.Module):
    def __init__(self, kind: str, parametrization: str | None):
        super().__init__()
        self.rnn = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind](6, 8, num_layers=2)
        if parametrization == "dropout":
            parametrize.register_parametrization(self.rnn, "weight_hh_l0", _WeightDropout())
        elif parametrization == "spectral norm":
            torch.nn.utils.parametrizations.spectral_norm(self.rnn, "weight_hh_l0")
        elif parametrization == "weight norm":
            torch.nn.utils.parametrizations.weight_norm(self.rnn, "weight_hh_l1")
        elif parametrization == "scaled":
            parametrize.register_parametrization(self.rnn, "weight_hh_l0", _Scaled())

    def forward(self, x):
        return self.rnn(x)[0].square().mean()


@pytest.mark.parametrize("parametrization, said", [("dropout", r"_WeightDropout\) that draws random numbers"),
                                                   ("spectral norm", r"_SpectralNorm\) that changes its buffers")])
def test_a_recurrent_weights_random_or_stateful_parametrization_is_refused_and_left_as_it_was(parametrization, said):
    torch.manual_seed(0)
    model, x = _Recurrent("lstm", parametrization), torch.randn(5, 3, 6)
    generator = torch.get_rng_state()
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    with pytest.raises(LoweringError, match=rf"_Recurrent's rnn \(LSTM\) has a parametrization on weight_hh_l0 "
                                            rf"\({said} each time the weight is read.*functional_call"):
        remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    assert torch.equal(torch.get_rng_state(), generator)
    assert all(torch.equal(buffer, buffers[name]) for name, buffer in model.named_buffers())


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("parametrization", ["weight norm", "scaled", "dropout in eval mode"])
def test_a_recurrent_weights_pure_parametrization_trains_as_eager(kind, parametrization):
    torch.manual_seed(0)
    model, x = _Recurrent(kind, parametrization.removesuffix(" in eval mode")), torch.randn(5, 3, 6)
    if parametrization.endswith("eval mode"):
        model.eval()
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}


class _DropsOnce(torch.nn.Module):
    """The way out the refusal names: the weight dropped once per call, handed to the LSTM."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(6, 8, num_layers=2)

    def forward(self, x):
        weight = F.dropout(self.rnn.weight_hh_l0, 0.3, self.training)
        return torch.func.functional_call(self.rnn, {"weight_hh_l0": weight}, (x,))[0].square().mean()


def test_a_recurrent_weight_dropped_once_and_passed_with_functional_call_trains_as_eager():
    torch.manual_seed(0)
    model, x = _DropsOnce(), torch.randn(5, 3, 6)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}


class _AssignsDroppedWeight(torch.nn.Module):
    """AWD-LSTM's and fastai's weight dropout: the raw weight a parameter of its own, the
    dropped one assigned to the LSTM at each call."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(6, 8)
        raw = self.rnn.weight_hh_l0
        del self.rnn._parameters["weight_hh_l0"]
        self.rnn.register_parameter("weight_hh_l0_raw", torch.nn.Parameter(raw.detach().clone()))

    def forward(self, x):
        self.rnn.weight_hh_l0 = F.dropout(self.rnn.weight_hh_l0_raw, 0.3, self.training)
        return self.rnn(x)[0].square().mean()


def test_a_recurrent_weight_assigned_at_each_call_is_refused_naming_functional_call():
    """Found by hunt58: refused with advice on counters and random generators, which did
    not apply."""
    with pytest.raises(LoweringError, match=r"it assigns tensors to self\.rnn\.weight_hh_l0 \(a recurrent "
                                            r"module's weight.*functional_call\(self\.rnn, \{'weight_hh_l0'"):
        remat_ir.remat(_AssignsDroppedWeight(), (torch.randn(5, 3, 6),), cost_model="flops")
