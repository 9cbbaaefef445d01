"""A user's class handed to a forward's code, whose class values (`class Cfg: t = 1.0`)
that code reads: changed after `remat`, the step must plan again, not train on with the
value traced. Found by hunt57: every spelling below but the class passed by its own name
trained on with the traced value, 0.48-2.27 off eager's, silently; hunt60 found the
spellings through what a module holds (a closure, a partial, a table, an object) and by a
string (`globals()["_Setting"]`, `getattr(module, "Setting")`)."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

import remat_ir

import class_configs
from exactness import side_by_side


class _Setting:
    t = 1.0
    step = 0   # a counter the loop advances, which no code of the forward names

    @classmethod
    def scaled(cls, h):
        return h * cls.t


class _Box:
    t = 1.0


def _scaler(setting):
    def scale(h):
        return h * setting.t
    return scale


class _Held:
    """A callable object a module holds, whose class's `__call__` the loop may replace."""

    def __call__(self, h):
        return h * 2.0


def _scaled(h, setting):
    return h * setting.t


def _scaled_by_default(h, setting=_Setting):
    return h * setting.t


_PARTIAL = functools.partial(_scaled, setting=_Setting)
_TABLE = {"setting": _Setting}
_TUPLE = (_Setting,)


class _Hands(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.fc, self.how, self.box, self.held, self.kind = torch.nn.Linear(6, 3), how, _Box(), _Held(), _Setting

    def forward(self, x):
        h, how = self.fc(x), self.how
        if how == "another file's class":
            h = _scaled(h, class_configs.Setting)
        elif how == "class method":
            h = _Setting.scaled(h)
        elif how == "class of a held object":
            h = _scaled(h, type(self.box))
        elif how == "default argument":
            h = _scaled_by_default(h)
        elif how == "partial":
            h = _PARTIAL(h)
        elif how == "table":
            h = _scaled(h, _TABLE["setting"])
        elif how == "tuple":
            h = _scaled(h, _TUPLE[0])
        elif how == "held class":
            h = h * self.kind.t
        else:
            h = self.held(h)
        return h.square().mean()


def _new_call(self, h):
    return h * 3.0


_CHANGED = {"another file's class": class_configs.Setting, "class of a held object": _Box,}


@pytest.mark.parametrize("how", ["another file's class", "class method", "class of a held object", "default argument",
                                 "partial", "table", "tuple", "held class", "held object's __call__",])
def test_a_class_handed_to_the_forward_changed_after_lowering_is_planned_for(how, capsys):
    changed = _CHANGED.get(how, _Setting)
    call = _Held.__call__
    try:
        torch.manual_seed(0)
        model, x = _Hands(how), torch.randn(5, 6)
        scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
        scheduled(x).backward()
        model.zero_grad()
        if how == "held object's __call__":
            _Held.__call__ = _new_call
        else:
            changed.t = 3.0
        capsys.readouterr()
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert "lowering and planning again" in capsys.readouterr().err
    finally:
        _Setting.t = _Box.t = class_configs.Setting.t = 1.0
        _Held.__call__ = call


def test_a_counter_on_a_handed_class_that_the_forward_never_names_plans_nothing_again(capsys):
    """Recorded are the class values the forward's code names (`t`), not the loop's
    counter beside them (`_Setting.step`), which planned every step again (hunt57)."""
    torch.manual_seed(0)
    model, x = _Hands("table"), torch.randn(5, 6)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    capsys.readouterr()
    try:
        for _ in range(3):
            _Setting.step += 1
            scheduled(x).backward()
    finally:
        _Setting.step = 0
    assert "planning again" not in capsys.readouterr().err


class _Kept:
    """A class that only what a module holds names (each forward below names no global
    class): the forward reaches it through that."""
    t = 1.0


class _Reaches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.box = torch.nn.Linear(6, 3), _Box()
        self.closure, self.partial = _scaler(_Kept), functools.partial(_scaled, setting=_Kept)
        self.table, self.box.setting = {"setting": _Kept}, _Kept


class _ByClosure(_Reaches):
    def forward(self, x):
        return self.closure(self.fc(x)).square().mean()


class _ByPartial(_Reaches):
    def forward(self, x):
        return self.partial(self.fc(x)).square().mean()


class _ByTable(_Reaches):
    def forward(self, x):
        return (self.fc(x) * self.table["setting"].t).square().mean()


class _ByHeldObject(_Reaches):
    def forward(self, x):
        return (self.fc(x) * self.box.setting.t).square().mean()


class _ByGlobalsName(_Reaches):
    def forward(self, x):
        return (self.fc(x) * globals()["_Kept"].t).square().mean()


class _ByModuleGetattr(_Reaches):
    def forward(self, x):
        return (self.fc(x) * getattr(sys.modules[__name__], "_Kept").t).square().mean()


class _ByImportModule(_Reaches):
    def forward(self, x):
        import importlib

        return (self.fc(x) * importlib.import_module(__name__)._Kept.t).square().mean()


class _ByClassBody(_Reaches):
    inner = _Kept

    def forward(self, x):
        return (self.fc(x) * type(self).inner.t).square().mean()


@pytest.mark.parametrize("how", [_ByClosure, _ByPartial, _ByTable, _ByHeldObject, _ByGlobalsName, _ByModuleGetattr,
                                 _ByImportModule, _ByClassBody])
def test_a_class_reached_through_what_a_module_holds_or_by_its_name_is_planned_for(how, capsys):
    """Found by hunt60: `_Kept.t = 3.0` after `remat` trained on with the traced value,
    1.74 off eager's loss, silently."""
    try:
        torch.manual_seed(0)
        model, x = how(), torch.randn(5, 6)
        scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
        scheduled(x).backward()
        model.zero_grad()
        _Kept.t = 3.0
        capsys.readouterr()
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
        assert "lowering and planning again" in capsys.readouterr().err
    finally:
        _Kept.t = 1.0
