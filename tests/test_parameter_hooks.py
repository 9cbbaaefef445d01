"""Gradient hooks on parameters under a remat-ir step: they see eager's gradients, in the
order the plan hands them over; one that draws random numbers is refused as it draws
(`runtimes/parameter_hooks.py`; found by hunt59: silently other noise per parameter)."""

from __future__ import annotations

import copy

import pytest
import torch

import remat_ir
from remat_ir.ir import RematIRError


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _noisy(grad):
    return grad + 0.1 * torch.randn_like(grad)


def _noisy_update(parameter):
    with torch.no_grad():
        parameter.add_(torch.randn_like(parameter), alpha=1e-3)


@pytest.mark.parametrize("kind", ["register_hook", "register_post_accumulate_grad_hook"])
def test_a_parameter_hook_drawing_random_numbers_is_refused_naming_the_parameter(kind):
    model, x = _model(), torch.randn(4, 6)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    for parameter in model.parameters():
        getattr(parameter, kind)(_noisy if kind == "register_hook" else _noisy_update)
    with pytest.raises(RematIRError, match=r"a gradient hook on parameter '[02]\.(weight|bias)' draws random "
                                           r"numbers.*Draw it after backward\(\) returns"):
        scheduled(x).square().mean().backward()
    # The original model, called as it is, runs the same hooks without a word.
    model.zero_grad()
    model(x).square().mean().backward()


def test_a_parameter_hook_drawing_nothing_sees_eagers_gradients():
    model, x = _model(), torch.randn(4, 6)
    eager = copy.deepcopy(model)
    seen: dict = {}
    for tag, module in (("eager", eager), ("scheduled", model)):
        for name, parameter in module.named_parameters():
            parameter.register_hook(lambda g, key=(tag, name): seen.setdefault(key, g.clone()).clamp(-0.1, 0.1))
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    for module in (eager, scheduled):
        module(x).square().mean().backward()
    for name, parameter in model.named_parameters():
        assert torch.equal(seen["eager", name], seen["scheduled", name])
        assert torch.equal(dict(eager.named_parameters())[name].grad, parameter.grad)
