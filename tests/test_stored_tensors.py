"""Tensors a forward stores on its modules (`frontends/stored_tensors.py`): returned by
the graph after the outputs, stored by the runtime after every training call, so the
model holds what eager's call leaves on it (Qwen2-VL's `rope_deltas`)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn as nn

import remat_ir
from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import RuntimeInputError, ScheduledModule
from exactness import random_schedule, side_by_side

WIDTH = 8


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.kept = None   # what the last call found, for a later generation (Qwen2-VL's rope_deltas)

    def forward(self, x, mask):
        if self.kept is None or mask is not None:   # computed again whenever a mask is given
            self.kept = mask.sum(1, keepdim=True) - mask.shape[1]
        return torch.dropout(torch.tanh(self.a(x)), 0.2, True) * (self.kept + mask.shape[1]).unsqueeze(2)


class Storing(nn.Module):
    """Its submodule stores a tensor of the mask at every call; `reads_last` also computes
    with the tensor the previous call stored (a cache), `with_gradient` stores one that
    needs a gradient."""

    def __init__(self, reads_last: bool = False, with_gradient: bool = False):
        super().__init__()
        self.reads_last, self.with_gradient = reads_last, with_gradient
        self.inner, self.out = Inner(), nn.Linear(WIDTH, 2)

    def forward(self, x, mask):
        extra = self.inner.kept.float().mean() if self.reads_last and self.inner.kept is not None else 0.0
        h = self.inner(x, mask)
        if self.with_gradient:
            self.inner.pooled = h.mean(0)
        logits = self.out(h) + extra
        return {"loss": logits.square().mean(), "logits": logits}


def _batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, WIDTH, generator=generator)
    return x, (torch.rand(4, 6, generator=generator) > 0.3).long()


def _step(module, batch, seed: int):
    for p in module.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = module(*batch)["loss"]
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.parameters()], torch.get_rng_state()


@pytest.mark.parametrize("outputs", [None, ["loss"]])
def test_a_stored_tensor_is_left_on_the_model_as_eager_leaves_it(outputs):
    """Over steps with new masks: losses, gradients, generator and the stored tensor
    bitwise eager's, one plan (the forward's `self.kept is None` was None when lowered and
    a tensor after: either leads to the same graph, so it is not checked)."""
    torch.manual_seed(0)
    model = Storing()
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, _batch(0), budget=None, cost_model="flops", outputs=outputs)
    assert model.inner.kept is None   # lowering stored nothing
    for seed in (1, 2, 3):
        batch = _batch(seed)
        ours, theirs = _step(scheduled, batch, seed), _step(eager, batch, seed)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[2], theirs[2])
        assert all(map(torch.equal, ours[1], theirs[1]))
        assert torch.equal(model.inner.kept, eager.inner.kept) and not model.inner.kept.requires_grad
    assert len(scheduled.plans) == 1
    graph = scheduled.plans[0][0]
    assert graph.proto.metadata["torch.stored_attributes"] == '[["inner", "kept"]]'
    with torch.no_grad():   # evaluation runs the model as it is, which stores it itself
        scheduled(*_batch(4))
        eager(*_batch(4))
    assert torch.equal(model.inner.kept, eager.inner.kept)


def test_any_schedule_stores_it_after_every_call():
    torch.manual_seed(0)
    model = Storing()
    graph = lower_torch(copy.deepcopy(model), _batch(0), cost_model="flops")
    schedule = random_schedule(graph, random.Random(4), recompute_share=0.8)
    eager = copy.deepcopy(model)
    scheduled = ScheduledModule(model, graph, schedule)
    for seed in (5, 6):
        ours, theirs = _step(scheduled, _batch(seed), seed), _step(eager, _batch(seed), seed)
        assert torch.equal(ours[0], theirs[0]) and all(map(torch.equal, ours[1], theirs[1]))
        assert torch.equal(model.inner.kept, eager.inner.kept)


def test_a_stored_tensor_the_next_call_computes_with_is_checked_at_that_call():
    """A cache the next call reads: its first call's graph (lowered with nothing there)
    is not the second's, so without a planner the second call is refused by name."""
    torch.manual_seed(0)
    model = Storing(reads_last=True)
    graph = lower_torch(copy.deepcopy(model), _batch(0), cost_model="flops")
    scheduled = ScheduledModule(model, graph, random_schedule(graph, random.Random(1)))
    scheduled(*_batch(0))["loss"].backward()
    assert model.inner.kept is not None
    with pytest.raises(RuntimeInputError, match=r"'inner.kept' .* was None when the model was lowered"):
        scheduled(*_batch(1))


def test_a_stored_tensor_needing_a_gradient_stays_refused():
    with pytest.raises(LoweringError, match=r"assigns .*pooled"):
        lower_torch(Storing(with_gradient=True), _batch(0), cost_model="flops")


class _Cell(nn.Module):
    """A recurrent cell keeping its last state on itself (for generation), adding the one
    it holds (None in training: its caller resets it)."""

    def __init__(self):
        super().__init__()
        self.a, self.state = nn.Linear(WIDTH, WIDTH), None

    def forward(self, x):
        h = self.a(x)
        if self.state is not None:
            h = h + self.state
        self.state = torch.tanh(h)
        return self.state


class ResetsItsState(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.out = _Cell(), nn.Linear(WIDTH, 1)

    def forward(self, x):
        self.cell.state = None   # training: no state from the last call
        return self.out(self.cell(x)).square().mean()


def test_a_state_needing_a_gradient_that_each_call_resets_first_is_refused_saying_why():
    """hunt64: RecurrentGemma's RG-LRU stores its recurrent state (a tensor needing a
    gradient) at every call, after resetting it to None, and was refused with advice to
    run the model once, which could not help. Stored detached, a loss reading such a
    tensor after the call (a router's auxiliary loss) lost its gradient (hunt67: 3.78
    off), so it stays refused, saying why and what trains."""
    with pytest.raises(LoweringError, match=r"assigns module attribute 'state' of _Cell at .*after setting it "
                                            r"to a plain value earlier in the call.*cannot tell whether the loss "
                                            r"differentiates through it"):
        lower_torch(ResetsItsState(), (torch.randn(4, WIDTH),), cost_model="flops")


def _family_trained_like_eager(family: str):
    """A family's model bitwise eager's over steps under a random schedule (on a copy);
    then the model and a copy of it made before, after one more call each, for what they
    leave stored."""
    import family_models
    family_models.quiet()
    torch.manual_seed(0)
    model, args, kwargs, loss_of = family_models.FAMILIES[family]()
    eager = copy.deepcopy(model)
    graph = lower_torch(copy.deepcopy(model), args, example_kwargs=kwargs, cost_model="flops")
    schedule = random_schedule(graph, random.Random(1), recompute_share=0.8)
    assert side_by_side(copy.deepcopy(model), lambda m: ScheduledModule(m, graph, schedule), args, kwargs,
                        loss_of) == {}
    loss_of(ScheduledModule(model, graph, schedule)(*args, **kwargs)).backward()
    loss_of(eager(*args, **kwargs)).backward()
    return model, eager


def test_qwen2_vl_trains_bitwise_and_keeps_its_rope_deltas_as_eager():
    """Refused before (its image grid split by `.tolist()`, `repeat_interleave` by the
    grid, and `self.rope_deltas = ...`): bitwise eager's under a random schedule, with the
    rope deltas eager leaves on the model."""
    model, eager = _family_trained_like_eager("qwen2_vl")
    assert model.model.rope_deltas is not None and torch.equal(model.model.rope_deltas, eager.model.rope_deltas)


class StoresItsInput(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.a = kind, nn.Linear(WIDTH, WIDTH)

    def forward(self, x, mask):
        self.last = mask if self.kind == "input" else self.a.weight.detach()
        return self.a(x).sum()


@pytest.mark.parametrize("kind, what", [("input", "an input of the step"),
                                        ("parameter", "a view of an input of the step")])
def test_storing_an_input_or_a_parameter_itself_is_refused_saying_where(kind, what):
    """The graph cannot return its own inputs (eager stores the very tensor): refused, the
    error naming the attribute and the line, not an output the model never returned."""
    with pytest.raises(LoweringError, match=rf"StoresItsInput's forward stores on attribute 'last' of <root> "
                                            rf"at .*test_stored_tensors.py:\d+ a tensor that is {what}.*"
                                            rf"Store a copy there"):
        lower_torch(StoresItsInput(kind), _batch(0), cost_model="flops")


def test_qwen2_vl_given_its_positions_runs_one_graph_for_every_padding():
    """Its rope index reads each row's token types and attention mask as integers: every
    padding is a new value (planned again, refused past 4). Computed before the call and
    passed as `position_ids`, as the refusal says, one graph runs them all, bitwise."""
    import family_models
    family_models.quiet()
    torch.manual_seed(0)
    model, args, kwargs, _ = family_models.FAMILIES["qwen2_vl"]()
    eager = copy.deepcopy(model)
    rows, length = kwargs["input_ids"].shape

    def padded(pad):
        batch = dict(kwargs, attention_mask=torch.ones(rows, length, dtype=torch.long))
        batch["attention_mask"][0, length - pad:] = 0
        batch["position_ids"] = eager.model.get_rope_index(
            batch["input_ids"], image_grid_thw=batch["image_grid_thw"],
            attention_mask=batch["attention_mask"], mm_token_type_ids=batch["mm_token_type_ids"])[0]
        return batch
    scheduled = remat_ir.remat(model, args, example_kwargs=padded(1), cost_model="flops", outputs=["loss"])
    for pad in (1, 2, 3):
        torch.manual_seed(pad)
        ours = scheduled(**padded(pad)).loss
        torch.manual_seed(pad)
        assert torch.equal(ours, eager(**padded(pad)).loss)
    assert len(scheduled.plans) == 1


class ReadsWhatItStored(nn.Module):
    """Branches on what it stored at the previous call: its shape (`shape`), or whether it
    stored anything, found in the module's `__dict__` (`dict`)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.a = kind, nn.Linear(WIDTH, 2)
        if kind == "shape":
            self.prev = None

    def forward(self, x, mask):
        loss = self.a(x).square().mean()
        if self.kind == "shape" and self.prev is not None and self.prev.shape[0] > 4:
            loss = loss * 2
        if self.kind == "dict" and "prev" in self.__dict__:
            loss = loss * 2
        self.prev = mask.sum(1)
        return {"loss": loss}


def test_a_branch_on_the_shape_of_what_was_stored_is_planned_for():
    """Found by a review: the read `self.prev is None` was forgotten once a tensor of the
    first stored shape gave the same graph, and a later call whose stored tensor had
    another shape reused it (0.195 where eager's loss was 0.390). What the attribute
    holds is now checked by its shape, dtype and device."""
    torch.manual_seed(0)
    model = ReadsWhatItStored("shape")
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, _batch(0), cost_model="flops")
    for rows in (4, 6, 4, 6):
        batch = (torch.randn(rows, 6, WIDTH), torch.ones(rows, 6, dtype=torch.long))
        ours, theirs = _step(scheduled, batch, rows), _step(eager, batch, rows)
        assert torch.equal(ours[0], theirs[0]) and all(map(torch.equal, ours[1], theirs[1]))


def test_a_store_found_out_otherwise_than_by_reading_it_is_refused_saying_to_call_once_first():
    with pytest.raises(LoweringError, match=r"computes otherwise once it has stored a tensor on attribute 'prev' "
                                            r".*call the model once before remat"):
        lower_torch(ReadsWhatItStored("dict"), _batch(0), cost_model="flops")


class ReplacesItsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("last", torch.zeros(WIDTH))

    def forward(self, x, mask):
        h = self.a(x)
        self.last = h.detach().mean((0, 1))
        return {"loss": h.square().mean()}


def test_a_new_tensor_assigned_to_a_buffer_is_refused_saying_to_write_in_place():
    """Found by a review: it was refused as "then NoneType (a tensor needing gradients, or
    no tensor)", a buffer not being in the module's `__dict__`."""
    with pytest.raises(LoweringError, match=r"assigns a new tensor to buffer 'last' of ReplacesItsBuffer .*"
                                            r"self.last.copy_"):
        lower_torch(ReplacesItsBuffer(), _batch(0), cost_model="flops")


class _TableAndStatistic(nn.Module):
    """A table cached on an attribute, built where it is None or of another length, and a
    statistic stored for logging, which the forward never reads."""

    def __init__(self):
        super().__init__()
        self.lin, self.pe, self.stats = nn.Linear(8, 8), None, None

    def forward(self, x):
        if self.pe is None or self.pe.shape[0] != x.shape[1]:
            self.pe = torch.arange(x.shape[1], dtype=torch.float32)[:, None] / x.shape[1]
        h = self.lin(x + self.pe)
        self.stats = h.detach().mean()
        return h.tanh()


def test_a_statistic_stored_beside_a_table_rebuilt_where_none_is_not_blamed_for_the_tables_branch():
    """hunt80 F5: traced again with both stored, the program changed (the table's branch,
    which the forward reads), and lowering refused, blaming the statistic it never reads.
    The unread one is traced again alone: the lengths train bitwise like eager."""
    torch.manual_seed(0)
    model = _TableAndStatistic()
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (torch.randn(2, 8, 8),), solver="recompute-all", cost_model="flops",
                               cache_dir=False)
    for length in (8, 12, 8):
        x = torch.randn(2, length, 8)
        for module in (eager, scheduled):
            module(x).square().mean().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))
        assert torch.equal(eager.stats, model.stats)
