"""A forward reading a list of more numbers than are recorded one by one (a schedule of
learning rates or noise levels, read by step): one item changed after `remat` trained on
with the traced value, silently (found by hunt51); so did a long dict, list of pairs or of
lists, and a hook's long list of configs (hunt60). Such a container is recorded by a
digest of what it holds (`torchlib.described_values.values_digest`): a list of numbers by
their bits."""

from __future__ import annotations

import dataclasses
import functools
import types

import pytest
import torch

import remat_ir

from exactness import side_by_side

#: Longer than the lists recorded item by item (`frontends/traced_reads.py` `_MAX_ITEMS`).
_LENGTH = 300
_SCHEDULE = [1.0] * _LENGTH
_SETTINGS = types.SimpleNamespace(schedule=[1.0] * _LENGTH)


def _divided(h, settings):
    return h / settings.schedule[3]


class _ReadsSchedule(torch.nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.fc, self.where = torch.nn.Linear(6, 3), where
        self.schedule, self.settings = [1.0] * _LENGTH, types.SimpleNamespace(schedule=[1.0] * _LENGTH)

    def forward(self, x):
        h = self.fc(x)
        if self.where == "global":
            h = h / _SCHEDULE[3]
        elif self.where == "global's attribute":
            h = h / _SETTINGS.schedule[3]
        elif self.where == "global passed along":
            h = _divided(h, _SETTINGS)
        elif self.where == "module attribute":
            h = h / self.schedule[3]
        else:
            h = h / self.settings.schedule[3]
        return h.square().mean()


def _stepped_once(model: torch.nn.Module, x: torch.Tensor):
    """`model` scheduled by `remat`, one step taken with it (its gradients cleared): the
    value a test changes next is read by a graph already in use."""
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    scheduled(x).backward()
    model.zero_grad()
    return scheduled


def _schedule_of(model: _ReadsSchedule) -> list:
    return {"global": _SCHEDULE, "global's attribute": _SETTINGS.schedule, "global passed along": _SETTINGS.schedule,
            "module attribute": model.schedule, "held object's attribute": model.settings.schedule}[model.where]


@pytest.mark.parametrize("value", [0.5, 1])
@pytest.mark.parametrize("where", ["global", "global's attribute", "global passed along", "module attribute",
                                   "held object's attribute"])
def test_one_number_of_a_long_list_changed_after_lowering_is_planned_for(where, value, capsys):
    """`value`: another number; or 1, an int of the same value, which computes as the
    float did (not planned again)."""
    try:
        torch.manual_seed(0)
        model, x = _ReadsSchedule(where), torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        capsys.readouterr()
        _schedule_of(model)[3] = value
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        notice = capsys.readouterr().err
        if value == 1:
            assert "planning again" not in notice
        else:
            assert f"{_LENGTH} numbers #" in notice and "lowering and planning again" in notice
    finally:
        _SCHEDULE[3] = _SETTINGS.schedule[3] = 1.0


_IDS = [2 ** 60 + i for i in range(_LENGTH)]


class _ReadsLongTables(torch.nn.Module):
    """A memory bank of tensors in a long list (no numbers: not digested), and a long list
    of 64-bit ids (digested as integers: as doubles, 2**60 + 5 and 2**60 + 6 are one)."""

    def __init__(self):
        super().__init__()
        self.fc, self.bank = torch.nn.Linear(6, 3), [torch.full((3,), float(i)) for i in range(_LENGTH)]

    def forward(self, x):
        return ((self.fc(x) + self.bank[3]) * (_IDS[5] - 2 ** 60)).square().mean()


def test_a_long_list_of_tensors_trains_and_a_long_list_of_big_integers_is_compared_as_integers(capsys):
    """Found by hunt60: the list of tensors raised out of the digest, inside `remat`; an
    id of a list of big integers changed by one went unseen."""
    try:
        torch.manual_seed(0)
        model, x = _ReadsLongTables(), torch.randn(5, 6)
        scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        capsys.readouterr()
        _IDS[5] += 1
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert "lowering and planning again" in capsys.readouterr().err
    finally:
        _IDS[5] = 2 ** 60 + 5


_BY_STEP = {step: 1.0 for step in range(_LENGTH)}
_BY_NAME = {f"class{i}": 1.0 for i in range(_LENGTH)}
_PAIRS = [(1.0, 0.9)] * _LENGTH
_NESTED = [[1.0] for _ in range(_LENGTH)]


class _ReadsLongContainer(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind, self.t = torch.nn.Linear(6, 3), kind, 5
        self.by_step = {step: 1.0 for step in range(_LENGTH)}

    def forward(self, x):
        scale = {"dict by step": lambda: _BY_STEP[self.t], "dict by name": lambda: _BY_NAME["class5"],
                 "list of pairs": lambda: _PAIRS[self.t][0], "list of lists": lambda: _NESTED[self.t][0],
                 "module's dict": lambda: self.by_step[self.t]}[self.kind]()
        return (self.fc(x) * scale).square().mean()


def _change(model: _ReadsLongContainer, value: float) -> None:
    if model.kind == "dict by step":
        _BY_STEP[5] = value
    elif model.kind == "dict by name":
        _BY_NAME["class5"] = value
    elif model.kind == "list of pairs":
        _PAIRS[5] = (value, 0.9)
    elif model.kind == "list of lists":
        _NESTED[5][0] = value
    else:
        model.by_step[5] = value


@pytest.mark.parametrize("kind", ["dict by step", "dict by name", "list of pairs", "list of lists", "module's dict"])
def test_one_item_of_a_long_container_changed_after_lowering_is_planned_for(kind, capsys):
    """Found by hunt60: each trained on with the traced item, 1.74 off eager's loss."""
    try:
        torch.manual_seed(0)
        model, x = _ReadsLongContainer(kind), torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        capsys.readouterr()
        _change(model, 3.0)
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        notice = capsys.readouterr().err   # a dict by 0, 1, ... is digested as a list of numbers
        assert f"{_LENGTH} items #" in notice or f"{_LENGTH} numbers #" in notice
    finally:
        _change(model, 1.0)


@dataclasses.dataclass
class _LayerConfig:
    t: float = 1.0


class _ScalesOutput:
    """A forward hook holding one config per layer: more than are compared one by one."""

    def __init__(self, layers: int):
        self.configs = [_LayerConfig() for _ in range(layers)]

    def __call__(self, module, args, output):
        return output * self.configs[0].t


@pytest.mark.parametrize("layers", [20, 300])
def test_a_hooks_long_list_of_configs_changed_after_lowering_is_planned_for(layers):
    """Found by hunt60: with 300 configs, `configs[0].t = 2.0` trained on with the traced
    value, 0.65 off eager's loss (20 were compared item by item)."""
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(6, 3)), torch.randn(5, 6)
    hook = _ScalesOutput(layers)
    model[0].register_forward_hook(hook)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda y: y.square().mean(), tolerance=1e-30) == {}
    hook.configs[0].t = 2.0
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda y: y.square().mean(), tolerance=1e-30) == {}


_Pair = __import__("collections").namedtuple("_Pair", "lr momentum")


@dataclasses.dataclass(slots=True)
class _Slotted:
    lr: float = 1.0


class _Lr(float):
    """A tagged hyper-parameter: a float subclass."""


class _ReadsLongOfKinds(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind = torch.nn.Linear(6, 3), kind
        self.items = {"named tuples": lambda: [_Pair(1.0, 0.9) for _ in range(_LENGTH)],
                      "slotted configs": lambda: [_Slotted() for _ in range(_LENGTH)],
                      "tuple of names": lambda: tuple(f"act{i}" for i in range(_LENGTH)),
                      "float subclass": lambda: _Lr(1.0)}[kind]()

    def forward(self, x):
        if self.kind == "float subclass":
            return (self.fc(x) * self.items).square().mean()
        if self.kind == "tuple of names":
            return (self.fc(x) * len(self.items[3])).square().mean()
        return (self.fc(x) * self.items[5].lr).square().mean()


@pytest.mark.parametrize("kind", ["named tuples", "slotted configs", "float subclass"])
def test_long_containers_of_named_tuples_and_slotted_objects_and_float_subclasses_are_compared(kind):
    """Found by hunt62: each changed after lowering trained on with the traced value."""
    torch.manual_seed(0)
    model, x = _ReadsLongOfKinds(kind), torch.randn(5, 6)
    scheduled = _stepped_once(model, x)
    if kind == "named tuples":
        model.items[5] = _Pair(3.0, 0.9)
    elif kind == "slotted configs":
        model.items[5].lr = 3.0
    else:
        model.items = _Lr(3.0)
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}


def test_a_long_tuple_of_names_plans_once(capsys):
    """Found by hunt62: digested as a tuple when lowered and as a list at the call, it
    never matched, and the first call raised."""
    model, x = _ReadsLongOfKinds("tuple of names"), torch.randn(5, 6)
    assert side_by_side(model, lambda m: remat_ir.remat(m, (x,), cost_model="flops", solver="recompute-all"),
                        (x,), {}, lambda loss: loss, steps=3, tolerance=1e-30) == {}
    assert "planning again" not in capsys.readouterr().err


def _times(k: float):
    return lambda h: h * k


_FUNCTIONS = [_times(1.0) for _ in range(_LENGTH)]


class _PicksAFunction(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.i = torch.nn.Linear(6, 3), 7

    def forward(self, x):
        return _FUNCTIONS[self.i](self.fc(x)).square().mean()


@pytest.mark.parametrize("replacement", ["closure", "partial", "builtin"])
def test_a_function_of_a_long_list_replaced_after_lowering_is_planned_for(replacement, capsys):
    """Found by hunt62: a list of 300 functions the forward picks from by index, one
    replaced after `remat` (another closure's value, a partial, a builtin), trained on with
    the traced function, silently."""
    try:
        torch.manual_seed(0)
        model, x = _PicksAFunction(), torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        capsys.readouterr()
        _FUNCTIONS[7] = {"closure": _times(3.0), "partial": functools.partial(torch.mul, other=3.0),
                         "builtin": torch.tanh}[replacement]
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert f"{_LENGTH} items #" in capsys.readouterr().err
    finally:
        _FUNCTIONS[7] = _times(1.0)


class _Setting:
    def __init__(self):
        self.k, self.step = 1.0, 0


def _by_setting(setting: _Setting):
    return lambda h: h * setting.k


_PAIRS_OF_FUNCTIONS = [(1.0, _by_setting(_Setting())) for _ in range(_LENGTH)]


class _ReadsPairs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        rate, scale = _PAIRS_OF_FUNCTIONS[4]
        return (scale(self.fc(x)) * rate).square().mean()


def test_a_long_list_of_rates_and_functions_holding_objects_is_compared_by_its_rates(capsys):
    """Found by hunt65: digesting what the functions' closures hold (an object each) took
    the list past the digest's budget, so it went uncompared and a rate's change was
    missed, silently; and an attribute of those objects that no code reads, changed at
    every step, planned every step again. Functions are digested by their code and the
    plain values and functions they hold."""
    old = _PAIRS_OF_FUNCTIONS[4]
    try:
        torch.manual_seed(0)
        model, x = _ReadsPairs(), torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        for pair in _PAIRS_OF_FUNCTIONS:   # what no code reads, changed: nothing to plan
            pair[1].__closure__[0].cell_contents.step += 1
        capsys.readouterr()
        scheduled(x).backward()
        model.zero_grad()
        assert "lowering and planning again" not in capsys.readouterr().err
        _PAIRS_OF_FUNCTIONS[4] = (3.0, old[1])
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert f"{_LENGTH} items #" in capsys.readouterr().err
    finally:
        _PAIRS_OF_FUNCTIONS[4] = old


class _Multiplier:
    def __init__(self, k: float):
        self.k = k

    def times(self, h):
        return h * self.k

    def __call__(self, h):
        return h * self.k


_METHODS = [_Multiplier(1.0).times for _ in range(_LENGTH)]
_CALLABLES = [_Multiplier(1.0) for _ in range(_LENGTH)]


class _PicksAMethod(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.i, self.kind = torch.nn.Linear(6, 3), 7, kind

    def forward(self, x):
        picked = (_METHODS if self.kind.startswith("method") else _CALLABLES)[self.i]
        return picked(self.fc(x)).square().mean()


@pytest.mark.parametrize("change", ["method replaced", "method's object changed", "callable replaced",
                                    "callable's attribute changed"])
def test_a_method_or_callable_of_a_long_list_changed_after_lowering_is_planned_for(change, capsys):
    """Found by hunt65: a list of 300 bound methods or callable objects the forward picks
    from by index, one replaced or its object's `k` changed after `remat`, trained on with
    the traced one, 2.5 off, silently: only functions and partials were digested."""
    held = _METHODS if change.startswith("method") else _CALLABLES
    try:
        torch.manual_seed(0)
        model, x = _PicksAMethod(change), torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        capsys.readouterr()
        if change == "method replaced":
            held[7] = _Multiplier(3.0).times
        elif change == "callable replaced":
            held[7] = _Multiplier(3.0)
        else:
            getattr(held[7], "__self__", held[7]).k = 3.0
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert f"{_LENGTH} items #" in capsys.readouterr().err
    finally:
        held[7] = _Multiplier(1.0).times if held is _METHODS else _Multiplier(1.0)


_SCALE = 1.0


def _scaled(offset: float):
    return lambda h: h * _SCALE + offset


class _HoldsFunctions(torch.nn.Module):
    """Functions handed in a list or a dict, read by index; they read a global. (Made in
    `__init__`, their code was scanned as `__init__`'s.)"""

    def __init__(self, picks):
        super().__init__()
        self.fc, self.i, self.picks = torch.nn.Linear(6, 3), 1, picks

    def forward(self, x):
        return self.picks[self.i](self.fc(x)).square().mean()


_ACTIVATIONS = {"scaled": _scaled(1.0)}


class _PicksFromAGlobalDict(torch.nn.Module):
    """A function picked from a module-level dict (`ACTS["scaled"](h)`)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return _ACTIVATIONS["scaled"](self.fc(x)).square().mean()


@pytest.mark.parametrize("kind", ["list", "dict", "global dict"])
def test_a_global_read_by_a_function_a_module_holds_in_a_container_is_planned_for(kind, capsys):
    """Found by hunt65: a function held in a module's list, read by index, computing with a
    global (`h * _SCALE`): the global changed after `remat` trained on with the traced
    value, 2.5 off, silently (functions held directly were scanned for globals only); and
    one picked from a module-level dict, 3.57 off (hunt67)."""
    global _SCALE
    try:
        torch.manual_seed(0)
        picks = [_scaled(0.0), _scaled(1.0)] if kind == "list" else {1: _scaled(1.0)}
        model = _PicksFromAGlobalDict() if kind == "global dict" else _HoldsFunctions(picks)
        x = torch.randn(5, 6)
        scheduled = _stepped_once(model, x)
        capsys.readouterr()
        _SCALE = 3.0
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert "global _SCALE" in capsys.readouterr().err
    finally:
        _SCALE = 1.0

