"""Tracers and compilers wrapping a remat-ir module (hunt74): TorchScript records the model's
own ops, said once; FX's symbolic tracing and Dynamo's `fullgraph=True` are refused in
remat-ir's words, saying what works instead."""

from __future__ import annotations

import copy

import pytest
import torch

import remat_ir
from remat_ir.ir import RematIRError


def _pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 4))
    eager = copy.deepcopy(model)
    x = torch.randn(32, 8)
    return eager, model, remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops"), x


@pytest.mark.parametrize("how", ["trace", "script"])
def test_torchscript_of_a_remat_module_records_the_models_own_ops_said_once(how, capsys):
    """Found by hunt74: `torch.jit.trace` in training mode took each call for a new input
    signature and failed inside torch.export; `torch.jit.script` failed at the module's
    `forward(*args, **kwargs)`. Both now compile the model as it is, as its eager twin
    compiles: the same code, on the model's parameters (a trace, the same gradients)."""
    eager, model, scheduled, x = _pair()
    capsys.readouterr()
    compile_ = (lambda m: torch.jit.trace(m, (x,), check_trace=False)) if how == "trace" else torch.jit.script
    torch.manual_seed(1)
    theirs = compile_(eager)
    torch.manual_seed(1)
    ours = compile_(scheduled)
    said = capsys.readouterr().err
    assert said.count(f"remat-ir: {'traced by torch.jit.trace' if how == 'trace' else 'torch.jit.script'}") == 1
    assert "lowering and planning again" not in said
    assert ours.code == theirs.code
    assert [p.data_ptr() for p in ours.parameters()] == [p.data_ptr() for p in model.parameters()]
    if how == "script":   # two scripts of one model differ in their last bits (TorchScript's profiling)
        return
    for module in (ours, theirs):
        torch.manual_seed(2)
        module(x).square().sum().backward()
    for a, b in zip(eager.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_fx_symbolic_tracing_is_refused_and_a_leaf_of_the_tracer_trains_as_eager():
    """Found by hunt74: FX's tracer raised "Proxy object cannot be iterated" from the
    runtime's signature code (or "module is not installed as a submodule" around it). Now
    refused by name; marked a leaf, as the error says, it is called as it is and trains
    like eager."""
    eager, model, scheduled, x = _pair()
    outer = torch.nn.Sequential(torch.nn.Linear(8, 8), scheduled)
    with pytest.raises(RematIRError, match=r"torch.fx.symbolic_trace reached a remat-ir module \(of Sequential\)"
                                           r".*is_leaf_module"):
        torch.fx.symbolic_trace(outer)
    with pytest.raises(RematIRError, match="symbolic tracing cannot record"):
        torch.fx.symbolic_trace(scheduled)

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module, name):
            return module is scheduled or super().is_leaf_module(module, name)

    traced = torch.fx.GraphModule(outer, Tracer().trace(outer))
    twin = torch.nn.Sequential(copy.deepcopy(outer[0]), eager)
    for module in (traced, twin):
        torch.manual_seed(3)
        module(x).square().sum().backward()
    for a, b in zip(twin.parameters(), outer.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_torch_compile_with_fullgraph_is_refused_in_remat_irs_words():
    """Found by hunt74: Dynamo's error named `torch.compiler.disable` with "reason: None"
    and told the user to remove it. The reason now says why and what to do."""
    _, _, scheduled, x = _pair()
    with pytest.raises(Exception, match=r"reason: a remat-ir step runs its plan from autograd nodes.*without "
                                        r"fullgraph=True.*compiled already.*with the eager backend, pass "
                                        r"backend=\"inductor\""):
        torch.compile(scheduled, backend="eager", fullgraph=True)(x)
