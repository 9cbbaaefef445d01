"""A forward's uses of autograd's own state (`frontends/autograd_state.py`): reading or
setting `.grad`, clearing gradients, turning a parameter's `requires_grad` on or off. The
graph would keep none of it (each found silent by a review), so each is refused naming the
model's line and what to do; setting a flag to the value it has, and an activation's flag
(transformers' `enable_input_require_grads`), train like eager."""

from __future__ import annotations

import pytest
import torch

import remat_ir
from remat_ir.frontends.torch import LoweringError

from exactness import side_by_side


class _Touching(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.how = how
        if how == "unfreeze":
            self.b.weight.requires_grad_(False)

    def forward(self, x):
        how = self.how
        if how == "read":
            scale = 1.0 if self.a.weight.grad is None else 2.0
            return self.b(self.a(x)) * scale
        if how == "assign":
            self.a.weight.grad = None
        elif how == "zero_grad":
            self.zero_grad()
        elif how == "freeze":
            self.a.requires_grad_(False)
        elif how == "flag":
            self.a.weight.requires_grad = False
        elif how == "unfreeze":
            self.b.weight.requires_grad_(True)
        elif how == "input":         # a saliency map: the caller reads x.grad
            x.requires_grad_()
        elif how == "same":          # the flags they have: no change
            self.a.requires_grad_(True)
            self.a.weight.requires_grad = True
        elif how == "activation":    # an activation's flag, as enable_input_require_grads sets it
            x = x.clone().requires_grad_(True)
        return self.b(self.a(x))


_SAID = {"read": r"it reads a gradient \(`.grad`\) at .*test_autograd_state.py:\d+.* read gradients outside the forward",
         "assign": r"it sets a gradient \(`.grad`\) at .*test_autograd_state.py:\d+; clear or set gradients outside",
         "zero_grad": r"it clears gradients \(`zero_grad\(\)`\) at .*test_autograd_state.py:\d+; clear them outside",
         "freeze": r"it turns requires_grad off for Linear's parameters at .*test_autograd_state.py:\d+.* freeze or "
                   r"unfreeze outside the forward",
         "flag": r"it turns requires_grad off for a parameter at .*test_autograd_state.py:\d+",
         "unfreeze": r"it turns requires_grad on for a parameter at .*test_autograd_state.py:\d+",
         "input": r"it turns requires_grad on for an input at .*test_autograd_state.py:\d+: .*set it on the "
                  r"input before the call"}


@pytest.mark.parametrize("how", sorted(_SAID))
def test_a_forward_using_gradients_or_changing_flags_is_refused_naming_its_line(how):
    """Before: under gradient accumulation a read `.grad` stayed what tracing saw (losses
    apart from the second micro-batch); gradients cleared in the forward accumulated across
    steps; a submodule frozen in the forward trained on, and a weight unfrozen there never
    got a gradient; an input whose flag it turned on got no gradient."""
    with pytest.raises(LoweringError, match=_SAID[how]):
        remat_ir.remat(_Touching(how), (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")


@pytest.mark.parametrize("how", ["same", "activation"])
def test_a_forward_setting_flags_it_does_not_change_trains_like_eager(how):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    assert side_by_side(_Touching(how), lambda m: remat_ir.remat(m, (x,), solver="recompute-all",
                                                                  cost_model="flops"),
                        (x,), {}, lambda out: out.square().mean()) == {}
