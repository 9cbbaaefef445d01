"""TorchScript functions called by a forward (`frontends/script_functions.py`): traced as
their Python originals, every gradient kept, whether or not eager's executor has warmed
up; one without a Python original is refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

import remat_ir
from remat_ir.frontends.torch import LoweringError


#: The function `_Calling` calls, a global as a model's module-level helper would be (a
#: module holding a ScriptFunction cannot be deep-copied).
_FUNCTION = None


class _Calling(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        global _FUNCTION
        _FUNCTION = function
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(_FUNCTION(self.a(x)))


def _gradients(model, x) -> dict:
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("warm_steps", [0, 2])
def test_a_scripted_function_keeps_every_gradient(warm_steps):
    """Found by a review: after two eager steps had warmed TorchScript's executor, tracing
    saw the function's ops without their autograd history, and `a` trained without a
    gradient, silently. Cold, eager's autograd runs aten's formulas, as the graph does:
    bitwise; warm, eager's executor runs TorchScript's own (a warning says so): close."""

    @torch.jit.script
    def scaled_tanh(h):
        return h.tanh() * 2

    torch.manual_seed(0)
    model, x = _Calling(scaled_tanh), torch.randn(4, 8)
    for _ in range(warm_steps):
        _gradients(model, x)
    eager = copy.deepcopy(model)
    with pytest.warns(UserWarning, match=r"traces TorchScript function .*scaled_tanh as its Python source"):
        scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")
    ours, theirs = _gradients(scheduled, x), _gradients(eager, x)
    assert set(ours) == set(theirs) and all(g is not None for g in ours.values())
    for name in ours:
        if warm_steps:
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(ours[name], theirs[name]), name


def test_a_scripted_function_without_python_source_is_refused_by_name():
    unit = torch.jit.CompilationUnit("def doubled(h):\n    return h * 2\n")
    with pytest.raises(LoweringError, match=r"calls TorchScript function .*doubled, which has no Python "
                                            r"source .* call a Python function instead"):
        remat_ir.remat(_Calling(unit.doubled), (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")


def _branches(h):
    if torch.jit.is_scripting():
        return h.tanh()
    return h * 10.0


def test_a_scripted_function_branching_on_is_scripting_takes_the_scripted_branch():
    """Eager runs the compiled function, where `torch.jit.is_scripting()` is True: traced as
    its Python source, the branch went the other way (a loss 35.9 off, found by a review)."""
    scripted = torch.jit.script(_branches)
    torch.manual_seed(0)
    model, x = _Calling(scripted), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="as its Python source"):
        scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")
    torch.testing.assert_close(scheduled(x), eager(x), rtol=0, atol=0)


def _doubled(h):
    return h * 2


def test_a_function_torch_jit_trace_made_is_refused_by_name():
    """Its graph fixed what it was traced with; with the hook that runs scripted functions
    as their source in place, export traced a traced function's source too (a global
    changed since: a loss 26.4 off, found by a review)."""
    traced = torch.jit.trace(_doubled, (torch.randn(4, 8),))
    with pytest.raises(LoweringError, match=r"calls .*_doubled, a function torch.jit.trace made: .* call "
                                            r"the Python function instead"):
        remat_ir.remat(_Calling(traced), (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")
