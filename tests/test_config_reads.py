"""A search over where a forward or a hook finds its configuration, how it reads it and
what it is: a number changed after `remat` must be trained on as eager does (planned
again), never with the value traced.

Each draw builds a tiny network reading a scale from a config object (a SimpleNamespace,
a dataclass, a slots dataclass, a plain class, a dict, a class whose `t` is a property
over a private attribute, a class holding its values as class attributes) held by a
module, a global, a class body, a hook's closure, the object a hook is bound to or a
partial's argument, read by attribute, one object down, by `getattr`, through a helper,
`vars`, `attrgetter`, `dataclasses.asdict`, a local alias or a copy (`copy.copy`,
`copy.deepcopy`: 8 of their 84 cases, a module's config, were silent at 73eda14). Run as a grid on the code
of stop 113, 68 of its 264 cases (the first five kinds) trained on with the traced
value after a change, 0.65 off eager's gradients, silently. That grid held every draw's
config in the global and the class body too, whatever the draw's place: a hook's config
was compared as the global's, which hid the hooks' own holes. Held only where drawn,
the grid over all seven kinds found 144 of 378 cases silent at eb1f917
(a hook whose helper uses `getattr` anywhere compared its bound object one level deep;
properties, class values, `vars()` of a module's config); all 378 are exact now."""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import remat_ir
from strategies import search


@dataclasses.dataclass
class _Config:
    t: float = 1.0
    sub: object = None


@dataclasses.dataclass(slots=True)
class _SlotsConfig:
    t: float = 1.0
    sub: object = None


class _PlainConfig:
    def __init__(self, t=1.0, sub=None):
        self.t, self.sub = t, sub


class _PropertyConfig:
    """Its `t` a property over a private attribute: the config's code reads `self._t`."""

    def __init__(self, t=1.0, sub=None):
        self._t, self.sub = t, sub

    @property
    def t(self):
        return self._t

    @t.setter
    def t(self, value):
        self._t = value


def _class_valued():
    """A config whose values its class holds (`class Cfg: t = 1.0`), a class of its own
    at each level, made afresh for each draw: changed as `type(cfg).t = 3.0`."""
    sub = type("_ClassValued", (), {"t": 1.0})()
    return type("_ClassValued", (), {"t": 1.0, "sub": sub})()


def _config(kind: str):
    if kind == "class values":
        return _class_valued()
    if kind == "namespace":
        return types.SimpleNamespace(t=1.0, sub=types.SimpleNamespace(t=1.0))
    if kind == "dict":
        return {"t": 1.0, "sub": {"t": 1.0}}
    made = {"dataclass": _Config, "slots dataclass": _SlotsConfig, "plain": _PlainConfig,
            "property": _PropertyConfig}[kind]
    return made(1.0, made(1.0))


def _temperature(config):
    return config["t"] if isinstance(config, dict) else config.t


#: How a read finds the scale, and whether it is one object down.
_DEEP = {"attribute": False, "one down": True, "getattr": False, "getattr by a computed name": False,
         "helper": True, "vars": False, "attrgetter": True, "asdict": False, "alias": True,
         "copy": False, "deepcopy": True}


def _read(config, how: str) -> float:
    if how in ("copy", "deepcopy"):   # read from a copy, an object nothing else holds
        config = copy.copy(config) if how == "copy" else copy.deepcopy(config)
    if isinstance(config, dict):
        return config["sub"]["t"] if _DEEP[how] else config["t"]
    if how in ("attribute", "copy"):
        return config.t
    if how in ("one down", "deepcopy"):
        return config.sub.t
    if how == "getattr":
        return getattr(config, "t", 1.0)
    if how == "getattr by a computed name":
        return getattr(config, "".join(["t"]))
    if how == "helper":
        return _temperature(config.sub)
    if how == "vars":
        return vars(config)["t"] if "t" in getattr(config, "__dict__", {}) else config.t
    if how == "attrgetter":
        return operator.attrgetter("sub.t")(config)
    if how == "asdict":
        return dataclasses.asdict(config)["t"] if dataclasses.is_dataclass(config) else config.t
    inner = config.sub
    return inner.t


#: The config a global holds (`where == "global"`).
_GLOBAL: dict = {}


class _Reads(torch.nn.Module):
    #: The config a class body holds (`where == "class body"`).
    CLASS_HELD: dict = {}

    def __init__(self, where: str, how: str, config):
        super().__init__()
        self.l1, self.l2, self.where, self.how = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), where, how
        if where == "module":
            self.config = config

    def forward(self, x):
        h = torch.relu(self.l1(x))
        if self.where == "module":
            h = h * _read(self.config, self.how)
        elif self.where == "global":
            h = h * _read(_GLOBAL["config"], self.how)
        elif self.where == "class body":
            h = h * _read(type(self).CLASS_HELD["config"], self.how)
        return self.l2(h)


class _Holder:
    def __init__(self, config, how: str):
        self.config, self.how = config, how

    def hook(self, module, args, out):
        return out * _read(self.config, self.how)


def _scaling(config, how, module, args, out):
    return out * _read(config, how)


def _built(where: str, how: str, kind: str):
    config = _config(kind)
    # Held only where the draw says: a config a global also held was compared as the
    # global's, whatever the hook did with it.
    _GLOBAL["config"] = config if where == "global" else None
    _Reads.CLASS_HELD["config"] = config if where == "class body" else None
    model = _Reads(where, how, config)
    if where == "hook closure":
        model.l1.register_forward_hook(lambda module, args, out: out * _read(config, how))
    elif where == "bound hook":
        model.l1.register_forward_hook(_Holder(config, how).hook)
    elif where == "partial hook":
        model.l1.register_forward_hook(functools.partial(_scaling, config, how))
    return model, config


def _changed(config, how: str) -> None:
    owner = (config["sub"] if isinstance(config, dict) else config.sub) if _DEEP[how] else config
    if isinstance(owner, dict):
        owner["t"] = 3.0
    elif type(owner).__name__ == "_ClassValued":
        type(owner).t = 3.0
    else:
        owner.t = 3.0


@search(16)
@given(where=st.sampled_from(["module", "global", "class body", "hook closure", "bound hook", "partial hook"]),
       how=st.sampled_from(sorted(_DEEP)),
       kind=st.sampled_from(["namespace", "dataclass", "slots dataclass", "plain", "dict", "property",
                             "class values"]))
def test_a_config_changed_after_remat_trains_as_eager_wherever_it_lives_and_however_it_is_read(where, how, kind):
    """Loss and gradients bitwise eager's at every step, before and after the change (the
    model called directly is eager: `remat` wraps it)."""
    torch.manual_seed(0)
    model, config = _built(where, how, kind)
    x = torch.randn(4, 8)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all")
    for step in range(3):
        if step == 1:
            _changed(config, how)
        loss = scheduled(x).square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(x).square().mean()
        expected.backward()
        assert torch.equal(loss, expected), (step, loss.item(), expected.item())
        for got, p in zip(grads, model.parameters()):
            assert torch.equal(got, p.grad), step
        model.zero_grad()


class _Counting:
    """A config of the user's class with a counter beside its scale: public (`step`) and
    private, read by a method the loop calls (`tick()`), not by the forward."""

    def __init__(self):
        self.scale, self.step, self._calls = 1.0, 0, 0

    def tick(self):
        self._calls += 1
        return self._calls


@dataclasses.dataclass
class _Scheduled:
    step: int = 0


class _Bound:
    """A hook's object: a config it hands to `asdict`, a scheduler it never reads."""

    def __init__(self):
        self.config, self.sched = _Config(1.0), _Scheduled()

    def hook(self, module, args, out):
        return out * dataclasses.asdict(self.config)["t"]


_COUNTING: dict = {}


class _ReadsCounting(torch.nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.l1, self.where = torch.nn.Linear(8, 8), where
        if where == "module":
            self.config = _Counting()

    def forward(self, x):
        h = self.l1(x)
        if self.where == "module":
            return h * self.config.scale
        if self.where == "global passed along":
            return h * _temperature_scale(_COUNTING["config"])
        return h


def _temperature_scale(config):
    return config.scale


@pytest.mark.parametrize("where", ["module", "hook handing a config to asdict"])
def test_a_counter_the_step_never_reads_plans_nothing_again(where, capsys):
    """Found by a review of this search's fixes: a counter beside the config (a module's
    config's `step` and a private `_calls` a method moves, a sibling scheduler of a hook's
    `asdict` config) made every call plan again, then refused the fifth: each trained
    before, and trains now, with one plan. (A global config passed along whole is
    compared by every attribute its class's code reads: a helper may call any method.)"""
    torch.manual_seed(0)
    model, x = _ReadsCounting(where), torch.randn(4, 8)
    config = model.config if where == "module" else _Counting()
    # Held by the global only where drawn. (A public counter of a global passed along
    # whole still counts: what the helper reads of it is not known.)
    _COUNTING["config"] = config if where == "global passed along" else None
    bound = _Bound()
    if where.startswith("hook"):
        model.l1.register_forward_hook(bound.hook)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all")
    capsys.readouterr()
    for _ in range(6):
        config.step += where != "global passed along"
        config.tick()
        bound.sched.step += 1
        scheduled(x).square().mean().backward()
    assert "planning again" not in capsys.readouterr().err
    assert len(scheduled.plans) == 1


class _Private:
    def __init__(self):
        self._t = 1.0


class _PrivateViaHelper:
    def __init__(self):
        self.config, self.key, self.one = _Private(), "one", 1.0

    def hook(self, module, args, out):
        return out * _private_temperature(self.config) * getattr(self, self.key)


def _private_temperature(config):
    return config._t


def _hooks_change_is_trained_on(hook, change) -> None:
    """A forward hook `hook` on a tiny network's first layer, changed by `change()` after
    `remat` and a first call: the next call computes what eager's does."""
    torch.manual_seed(0)
    model, x = _Reads("module", "attribute", _config("namespace")), torch.randn(4, 8)
    model.l1.register_forward_hook(hook)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all")
    scheduled(x)
    change()
    assert torch.equal(scheduled(x), model(x))


def test_a_private_attribute_a_hooks_helper_reads_is_compared_where_it_reads_any():
    """`getattr(self, self.key)` made the object's attributes those any reader may read,
    which dropped the private `_t` its helper reads: a change trained on with the traced
    value, 1.31 off (found by a review)."""
    holder = _PrivateViaHelper()
    _hooks_change_is_trained_on(holder.hook, lambda: setattr(holder.config, "_t", 3.0))


class _Scaler:
    def __init__(self):
        self.t = 1.0

    def __call__(self, out):
        return out * self.t


class _CallsWhatGetattrGives:
    def __init__(self):
        self.scaler = _Scaler()

    def hook(self, module, args, out):
        return getattr(self, "scaler")(out)


def test_a_hooks_callable_reached_through_getattr_is_compared():
    """`getattr(self, "scaler")(o)` did not follow `scaler`'s `__call__`: changed after
    `remat`, it trained on with the traced value, silently (hunt51 O3)."""
    holder = _CallsWhatGetattrGives()
    _hooks_change_is_trained_on(holder.hook, lambda: setattr(holder.scaler, "t", 3.0))


class _MethodOverPrivate:
    """Its number behind a method over a private attribute, or a property delegating to one."""

    def __init__(self):
        self._t = 1.0

    def temperature(self):
        return self._t

    @property
    def t(self):
        return self._computed()

    def _computed(self):
        return self._t


_METHOD_CONFIG: dict = {}


def _by_method(config):
    return config.temperature()


def _by_property(config):
    return config.t


class _PassesAlong(torch.nn.Module):
    def __init__(self, read):
        super().__init__()
        self.l1, self.read = torch.nn.Linear(8, 8), read

    def forward(self, x):
        return self.l1(x) * (_by_method(_METHOD_CONFIG["c"]) if self.read == "method"
                             else _by_property(_METHOD_CONFIG["c"]))


@pytest.mark.parametrize("read", ["method", "property over a method"])
def test_a_global_configs_private_number_behind_a_method_is_compared(read):
    """Narrowed to what properties read, a method (or a property calling one) returning
    `self._t` of a global config passed along was not compared: 1.31 off, silently
    (found by a review)."""
    torch.manual_seed(0)
    _METHOD_CONFIG["c"] = config = _MethodOverPrivate()
    model, x = _PassesAlong(read), torch.randn(4, 8)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all")
    scheduled(x)
    config._t = 3.0
    assert torch.equal(scheduled(x), model(x))


class _Accessed:
    def __init__(self):
        self._config = _Config(1.0)

    def config(self):
        return self._config

    def hook(self, module, args, out):
        return out * dataclasses.asdict(self.config())["t"]


def test_a_config_handed_to_asdict_through_an_accessor_is_compared():
    """Only the attributes a hook's code names were described where it hands objects to
    `asdict`: one reached through an accessor method was not, 1.31 off (a review)."""
    holder = _Accessed()
    _hooks_change_is_trained_on(holder.hook, lambda: setattr(holder._config, "t", 3.0))
