"""Tensors and modules tracing cannot take, named where lowering fails (hunt73: each met
tracing's or torch's own words, "data-dependent control flow", "QuantizedMeta backend");
one the forward never reads is no cause of a refusal (hunt75)."""

from __future__ import annotations

import pytest
import torch

import remat_ir
from remat_ir.frontends.errors import LoweringError


class _Halves(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return out * 0.5 if func in (torch.Tensor.__mul__, torch.mul) else out


class _Holds(torch.nn.Module):
    """A tensor held as a plain attribute, not a parameter or buffer."""

    def __init__(self, held, use):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
        self.g, self.use = held, use

    def forward(self, x):
        return self.use(self, x)


_HELD = {
    "subclass": (lambda: torch.randn(8).as_subclass(_Halves), lambda s, x: s.l(x) * s.g,
                 r"_Halves, a torch.Tensor subclass"),
    "sparse": (lambda: torch.eye(8).to_sparse(), lambda s, x: torch.sparse.mm(s.g, s.l(x).t()).t(),
               r"torch.sparse_coo tensor"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.randn(8, 8), 0.05, 0, torch.qint8),
                  lambda s, x: s.l(x) @ s.g.dequantize(), r"quantized \(torch.qint8\) tensor"),
}


@pytest.mark.parametrize("kind", _HELD)
def test_a_held_tensor_tracing_cannot_take_is_named_where_lowering_fails(kind):
    make, use, said = _HELD[kind]
    torch.manual_seed(0)
    model, x = _Holds(make(), use), torch.randn(4, 8)
    model(x).sum().backward()   # eager trains
    with pytest.raises(LoweringError, match=rf"\(_Holds holds 'g', a .*{said} held as a plain attribute, "
                                            rf"which remat-ir's tracing cannot take"):
        remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")


@pytest.mark.parametrize("where", ["buffer", "parameter", "module"])
def test_quantized_members_and_modules_are_refused_by_name(where):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    weights = torch.quantize_per_tensor(torch.randn(8, 8), 0.05, 0, torch.qint8)
    if where == "buffer":
        model[1].register_buffer("qw", weights)
    elif where == "parameter":
        model[1].qw = torch.nn.Parameter(weights, requires_grad=False)
    else:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        model[0] = torch.nn.Linear(8, 8)   # a float layer to train
    if where != "module":   # read by the forward
        model[1].forward = lambda x, m=model[1]: torch.nn.functional.linear(x, m.qw.dequantize())
    pattern = (r"submodule '1', a torch.ao.nn.quantized.dynamic" if where == "module"
               else rf"{where} '1.qw', a quantized \(torch.qint8\) tensor")
    with pytest.raises(LoweringError, match=pattern + r".*train a quantized model as the float model"):
        remat_ir.remat(model, (torch.randn(4, 8),), solver="recompute-all", cost_model="flops")


@pytest.mark.parametrize("helper", ["FloatFunctional", "FXFloatFunctional", "unused-sparse-and-quantize"])
def test_float_helpers_and_what_the_forward_never_reads_are_no_cause_of_refusal(helper):
    """`FloatFunctional` (the add a quantizable ResNet calls) lives among the quantized
    modules and computes in float; a quantize module or a sparse tensor the forward never
    reads is no concern of the step (hunt75: refused by their module path or blamed)."""
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 4)
            self.add = getattr(torch.ao.nn.quantized, helper, torch.ao.nn.quantized.FloatFunctional)()
            if helper.startswith("unused"):
                self.quant = torch.ao.nn.quantized.Quantize(0.1, 0, torch.quint8)
                self.adjacency = torch.eye(4).to_sparse()

        def forward(self, x):
            return self.add.add(self.l(x), x)

    torch.manual_seed(0)
    model, x = Residual(), torch.randn(2, 4)
    eager = Residual()
    eager.load_state_dict(model.state_dict())
    remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")(x).sum().backward()
    eager(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))


@pytest.mark.parametrize("kind", ["Embedding", "EmbeddingBag"])
def test_a_sparse_embedding_with_padding_is_refused_naming_it_and_sparse_false(kind):
    """hunt76 F1: refused as a data-dependent `nonzero` "in the forward", with advice on
    masks; the `nonzero` is its sparse backward's, selecting the rows apart from padding."""

    class _Embeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = getattr(torch.nn, kind)(10, 8, sparse=True, padding_idx=1)
            self.head = torch.nn.Linear(8, 2)

        def forward(self, ids):
            return self.head(self.table(ids)).sum()

    with pytest.raises(LoweringError, match=rf"_Embeds's {kind} 'table' has sparse=True.*pass sparse=False"):
        remat_ir.remat(_Embeds(), (torch.tensor([[1, 2, 3], [4, 1, 5]]),), solver="recompute-all",
                       cost_model="flops")
