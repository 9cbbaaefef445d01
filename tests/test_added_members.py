"""Members a forward adds while traced are taken out when lowering refuses it
(`frontends/added_members.py`).

A forward making a submodule, parameter or buffer for an input it has not met did so on
fake tensors; where lowering refused the call, the member stayed in the user's model with
FakeTensor weights, and the model was broken for every later use (hunt80 F3)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import remat_ir
from remat_ir.frontends.torch import LoweringError


class _MakesMembers(torch.nn.Module):
    """Makes a member for each input width it has not met, per `how`."""

    def __init__(self, how: str, widths=(16,)):
        super().__init__()
        self.how = how
        self.proj = torch.nn.ModuleDict({str(w): torch.nn.Linear(w, 8) for w in widths})

    def forward(self, x):
        width = x.shape[-1]
        if self.how == "submodule in a ModuleDict" and str(width) not in self.proj:
            self.proj[str(width)] = torch.nn.Linear(width, 8)
        elif self.how == "buffer registered" and not hasattr(self, f"scale{width}"):
            self.register_buffer(f"scale{width}", torch.ones(width))
        elif self.how == "parameter registered" and not hasattr(self, f"gain{width}"):
            self.register_parameter(f"gain{width}", torch.nn.Parameter(torch.ones(width)))
        elif self.how == "submodule assigned" and not hasattr(self, f"extra{width}"):
            setattr(self, f"extra{width}", torch.nn.Linear(width, width))
        x = x * getattr(self, f"scale{width}", 1.0) * getattr(self, f"gain{width}", 1.0)
        if hasattr(self, f"extra{width}"):
            x = getattr(self, f"extra{width}")(x)
        proj = self.proj[str(width)] if str(width) in self.proj else self.proj["16"]
        return proj(x[..., :proj.in_features]).tanh()


def _members(model):
    return ({name: p for name, p in model.named_parameters()}, {name: b for name, b in model.named_buffers()},
            dict(model.named_modules()))


def _unbroken(model, before, x):
    """The model holds what it held before, no fake tensor, and works as a plain module."""
    after = _members(model)
    for table_before, table_after in zip(before, after):
        assert table_after.keys() == table_before.keys()
        assert all(table_after[k] is table_before[k] for k in table_after)
    assert not any(isinstance(t, FakeTensor) for t in [*after[0].values(), *after[1].values()])
    assert type(model(x)) is torch.Tensor
    torch.save(model.state_dict(), io.BytesIO())


@pytest.mark.parametrize("how", ["submodule in a ModuleDict", "buffer registered", "parameter registered",
                                 "submodule assigned"])
def test_a_member_made_for_a_new_width_is_taken_out_when_the_call_is_refused(how):
    """The refusal names the member and the line making it (it named the member alone: hunt82)."""
    torch.manual_seed(0)
    model = _MakesMembers(how)
    x16, x24 = torch.randn(4, 16), torch.randn(4, 24)
    model(x16)   # its first call's setup, eager's
    scheduled = remat_ir.remat(model, (x16,), solver="recompute-all", cost_model="flops", cache_dir=False)
    scheduled(x16).sum().backward()
    before = _members(model)
    with pytest.raises(LoweringError, match=r"_MakesMembers's forward (makes (submodule|parameter) "
                                            r"'(proj\.24|gain24|extra24)' at .*test_added_members\.py:\d+ in "
                                            r"forward while traced: .*Call the model once|"
                                            r".*registers buffer 'scale24' of _MakesMembers at .*test_added_members)"):
        scheduled(x24)
    _unbroken(model, before, x24[..., :16] if how == "submodule in a ModuleDict" else x16)


def test_a_module_dict_filled_at_the_first_call_is_left_empty_when_remat_refuses_it():
    model = _MakesMembers("submodule in a ModuleDict", widths=())
    model.proj["16"] = torch.nn.Linear(16, 8)
    del model.proj["16"]
    before = _members(model)
    with pytest.raises(LoweringError, match=r"makes submodule 'proj\.24' at .*test_added_members\.py:\d+ in "
                                            r"forward while traced"):
        remat_ir.remat(model, (torch.randn(4, 24),), solver="recompute-all", cost_model="flops", cache_dir=False)
    after = _members(model)
    assert after[0] == {} and after[1] == {} and after[2].keys() == before[2].keys()


class _GrowsItsCache(torch.nn.Module):
    """An older transformers rotary cache: its table registered again for a longer batch."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.grow(8)

    def grow(self, length):
        self.cached = length
        self.register_buffer("table", torch.arange(length, dtype=torch.float32)[:, None] / length, persistent=False)

    def forward(self, x):
        if x.shape[1] > self.cached:
            self.grow(x.shape[1])
        return self.lin(x + self.table[:x.shape[1]])


def test_a_buffer_registered_again_with_another_shape_is_refused_by_line_and_the_model_left_as_it_was():
    """hunt80 F1: export carried the longer table back into the buffer of the old length,
    AOTAutograd failed ("expand 12 -> 8"), and the eager run meant to tell a model's own
    error ran on the length the trace had set with the old table: the refusal said that
    eager's forward raises too, which it does not. Grown before lowering, it trains."""
    torch.manual_seed(0)
    model, x8, x12 = _GrowsItsCache(), torch.randn(2, 8, 4), torch.randn(2, 12, 4)
    scheduled = remat_ir.remat(model, (x8,), solver="recompute-all", cost_model="flops", cache_dir=False)
    with pytest.raises(LoweringError, match=r"registers buffer 'table' of _GrowsItsCache again at "
                                            r".*test_added_members\.py:\d+, a \(12, 1\) torch\.float32 tensor "
                                            r"in place of its \(8, 1\).*call the model once with the longest"):
        scheduled(x12)
    assert model.cached == 8 and model.table.shape == (8, 1) and type(model.table) is torch.Tensor
    model(x12)   # grown as eager grows it
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x12,), solver="recompute-all", cost_model="flops", cache_dir=False)
    for x in (x12, x8):
        for module in (eager, scheduled):
            module(x).square().mean().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))
