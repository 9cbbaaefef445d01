"""NumPy scalars and torch's value types as forward arguments (`frontends/constant_arguments.py`).

torch.export refuses them as inputs; remat-ir refused such a model with torch.export's
words, "data-dependent control flow" (hunt80 F7), where eager trains. They are constants
of the trace, as a float is: a call with another value is lowered again for it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import remat_ir


def _handed_the_value(module, args):
    assert not isinstance(args[1], str), args[1]


class _Out(torch.nn.Linear):
    """Reads the scale too; a pre-hook checks that it is handed the value."""

    def __init__(self):
        super().__init__(32, 2)
        self.register_forward_pre_hook(_handed_the_value)

    def forward(self, h, scale):
        return super().forward(h) * float(scale)


class _Scaled(torch.nn.Module):
    """Scales, casts, places and loops by its non-tensor arguments."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(4, 32), _Out()
        self.register_forward_pre_hook(_handed_the_value)   # the root's too (hunt85 F2)

    def forward(self, x, scale, dtype=torch.float32, device=torch.device("cpu"), steps=np.int64(2)):
        h = self.lin(x).to(dtype=dtype, device=device)
        for _ in range(int(steps)):
            h = torch.tanh(h * scale)
        return self.out(h.float(), scale).sum()


#: Per case, the arguments of the three steps: a value changes at the third.
_CASES = {
    "numpy float32": [(np.float32(0.5),), (np.float32(0.5),), (np.float32(0.75),)],
    "numpy int64 and float64": [(np.float64(0.25), torch.float32, torch.device("cpu"), np.int64(3))] * 2
                               + [(np.float64(0.25), torch.float32, torch.device("cpu"), np.int64(1))],
    "dtype": [(0.5, torch.float64), (0.5, torch.float64), (0.5, torch.float32)],
    "device": [(0.5, torch.float32, torch.device("cpu"))] * 3,
    "numpy float16 after floats": [(0.5,), (0.5,), (np.float16(0.5),)],
}


@pytest.mark.parametrize("case, solver", [(case, "recompute-all") for case in sorted(_CASES)]
                         + [("numpy int64 and float64", None)])
def test_numpy_scalars_and_dtypes_train_as_eager(case, solver):
    torch.manual_seed(0)
    eager = _Scaled()
    model = copy.deepcopy(eager)
    calls = _CASES[case]
    x = torch.randn(64, 4)
    options = {"solver": solver} if solver else {"budget": 0.99}
    scheduled = remat_ir.remat(model, (x, *calls[0]), **options)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (eager, model)]
    for step, arguments in enumerate(calls):
        x = torch.randn(64, 4)
        losses = []
        for module, runner, optimizer in zip((eager, model), (eager, scheduled), optimizers):
            optimizer.zero_grad()
            loss = runner(x, *arguments)
            loss.backward()
            optimizer.step()
            losses.append(loss)
        assert torch.equal(losses[0], losses[1]), (case, step)
        for (name, a), b in zip(eager.named_parameters(), model.parameters()):
            assert torch.equal(a, b), (case, step, name)


def test_another_numpy_scalar_is_lowered_again():
    """The trace bakes the value in; a call with another value (or type) does not reuse it."""
    torch.manual_seed(0)
    model = _Scaled()
    x = torch.randn(64, 4)
    scheduled = remat_ir.remat(copy.deepcopy(model), (x, np.float32(0.5)), solver="recompute-all")
    for scale in (np.float32(0.5), np.float32(2.0), np.float64(0.5), 0.5):
        assert torch.equal(scheduled(x, scale), model(x, scale)), scale


class _Takes(torch.nn.Module):
    """Applies what it is passed as its second argument."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, how):
        h = self.lin(x)
        if isinstance(how, complex):
            return (h * how.real + how.imag).sum()
        if isinstance(how, (slice, type(Ellipsis))):
            return h[how].sum()
        if isinstance(how, range):
            return h[list(how)].sum()
        return how["apply"][0](h).sum()


@pytest.mark.parametrize("how", [0.5 + 2j, slice(1, 3), slice(None, None, 2), slice(np.int64(1), np.int64(3)),
                                 range(0, 3, 2), Ellipsis], ids=str)
def test_complex_numbers_and_slices_train_as_eager(how):
    """Slices of NumPy integers (bounds from a NumPy pipeline), ranges and `...` were
    refused with advice about pytree classes (hunt85 F7)."""
    torch.manual_seed(0)
    eager, x = _Takes(), torch.randn(3, 4)
    scheduled = remat_ir.remat(copy.deepcopy(eager), (x, how), solver="recompute-all")
    loss_e, loss_s = eager(x, how), scheduled(x, how)
    loss_e.backward(), loss_s.backward()
    assert torch.equal(loss_e, loss_s)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), scheduled.parameters()))


@pytest.mark.parametrize("given, said", [
    (torch.nn.Tanh(), r"a module \(Tanh\), .*hold it as a submodule of the model"),
    (torch.tanh, r"a function \(.*tanh\), .*hold it as an attribute of the model"),
    (b"bytes", r"a builtins.bytes, which torch.export cannot take as an input: pass its tensors"),
    (torch.Size([3, 2]), r"a torch.Size, which the trace takes as a tuple .*pass `tuple\(size\)`"),
], ids=["module", "function", "bytes", "torch.Size"])
def test_an_argument_no_trace_takes_is_refused_by_its_name(given, said):
    """hunt84 F1: a teacher module passed to a student's forward failed in AOTAutograd's
    words ("all flat_args must be KNOWN_TYPES"), a function in torch.export's, said as
    data-dependent control flow; neither named the argument. A torch.Size (hunt85 F7)
    was lowered as a tuple, and every call then failed planning again."""
    from remat_ir.frontends.torch import LoweringError

    with pytest.raises(LoweringError, match=r"_Takes's forward is passed argument \"how\['apply'\]\[0\]\", " + said):
        remat_ir.remat(_Takes(), (torch.randn(3, 4),), example_kwargs={"how": {"apply": [given]}},
                       solver="recompute-all")
