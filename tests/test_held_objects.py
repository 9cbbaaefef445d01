"""Objects a model or its hooks hold, whose values the forward computes with through
paths the frontend did not follow: each, changed after `remat`, trained on with the
value traced, silently, until the step planned for it."""

from __future__ import annotations

import types

import pytest
import torch

import remat_ir

from exactness import side_by_side


def _remat(model, x):
    return remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")


class _ScaledByScheduler(torch.nn.Module):
    """A forward scaling by a learning-rate scheduler's rate, the scheduler held by the
    module or by a namespace it holds (found by hunt51: `get_last_lr()` reads the
    scheduler's private `_last_lr`, a library's table that was not recorded)."""

    def __init__(self, where: str):
        super().__init__()
        self.fc, self.where = torch.nn.Linear(6, 3), where
        self.optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda epoch: 2.0 / (1 + epoch))
        if where in ("module", "state_dict"):
            self.scheduler = scheduler
        else:
            self.state = types.SimpleNamespace(scheduler=scheduler)

    def forward(self, x):
        scheduler = self.scheduler if self.where != "namespace" else self.state.scheduler
        if self.where == "state_dict":   # hunt62: its tables handed through `__dict__`
            return (self.fc(x) * self.scheduler.state_dict()["_last_lr"][0]).square().mean()
        return (self.fc(x) * scheduler.get_last_lr()[0]).square().mean()


@pytest.mark.parametrize("where", ["module", "namespace", "state_dict"])
def test_a_schedulers_rate_read_by_the_forward_is_planned_for_as_it_steps(where, capsys):
    torch.manual_seed(0)
    model, x = _ScaledByScheduler(where), torch.randn(5, 6)
    scheduled = _remat(model, x)
    scheduler = model.scheduler if where != "namespace" else model.state.scheduler
    capsys.readouterr()
    for _ in range(2):
        model.optimizer.step()
        scheduler.step()
        assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, steps=1, tolerance=1e-30) == {}
    assert capsys.readouterr().err.count("lowering and planning again") == 2


class _Plain:
    def __init__(self):
        self.t = 1.0


class _ConfigsInTable:
    """A hook's object reading a config from a table it holds, by a name it does not
    spell (found by hunt53: `cfgs["a"].t = 3.0` trained on with the traced value, 1.31
    off, where a config the object held itself was compared)."""

    def __init__(self, kind: str):
        self.key = "t"
        self.configs = {"a": _Plain()} if kind == "dict" else [types.SimpleNamespace(t=1.0)]
        self.at = "a" if kind == "dict" else 0

    def hook(self, module, args, out):
        return out * getattr(self.configs[self.at], self.key)

    def change(self):
        self.configs[self.at].t = 3.0


class _Served:
    """A hook's object whose `__getattr__` serves values from a table it holds (found by
    hunt51: `_values["k"] = 0.5` after `remat` trained on with the traced value)."""

    def __init__(self):
        self._values = {"k": 2.0}

    def __getattr__(self, name):
        if name != "_values" and name in self.__dict__.get("_values", {}):
            return self.__dict__["_values"][name]
        raise AttributeError(name)

    def hook(self, module, args, out):
        return out / self.k

    def change(self):
        self._values["k"] = 0.5


class _Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).square().mean()


@pytest.mark.parametrize("holder", [lambda: _ConfigsInTable("dict"), lambda: _ConfigsInTable("list"), _Served],
                         ids=["config in a dict", "config in a list", "served by __getattr__"])
def test_a_value_a_hooks_object_reaches_changed_after_lowering_is_planned_for(holder, capsys):
    torch.manual_seed(0)
    model, x, state = _Hooked(), torch.randn(5, 6), holder()
    model.a.register_forward_hook(state.hook)
    scheduled = _remat(model, x)
    scheduled(x).backward()
    model.zero_grad()
    state.change()
    capsys.readouterr()
    assert side_by_side(model, lambda m: scheduled, (x,), {}, lambda loss: loss, tolerance=1e-30) == {}
    assert "lowering and planning again" in capsys.readouterr().err


_LOGGED_STEP = 0


def _log_step(message: str) -> str:
    return f"[step {_LOGGED_STEP}] {message}"


class _HoldsCallbacks(torch.nn.Module):
    """Holds logging callbacks it never calls in its forward (`calls`: it does, then)."""

    def __init__(self, calls: bool):
        super().__init__()
        self.fc, self.calls, self.callbacks = torch.nn.Linear(6, 1), calls, [_log_step]

    def forward(self, x):
        out = self.fc(x).square().mean()
        if self.calls:
            out = out * len(self.callbacks[0]("forward"))
        return out


@pytest.mark.parametrize("calls", [False, True])
def test_a_callback_the_forward_never_calls_is_no_read_of_the_step(calls):
    """Found by hunt67: a callback a module held and the forward never called, reading the
    loop's step counter, planned every step again and was refused at the fifth. Where the
    forward calls it, the counter it reads is the step's, planned for as it changes."""
    global _LOGGED_STEP
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    eager = _HoldsCallbacks(calls)
    model = _HoldsCallbacks(calls)
    model.load_state_dict(eager.state_dict())
    scheduled = _remat(model, x)
    try:
        for step in range(1, 7 if not calls else 4):
            _LOGGED_STEP = step * (10 if calls else 1)
            for m, run in ((eager, eager), (model, scheduled)):
                m.zero_grad()
                run(x).backward()
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))
    finally:
        _LOGGED_STEP = 0
    assert len(scheduled.plans) == (1 if not calls else 4)   # lowered at 0, planned again at 10, 20, 30


def _recursive_closure():
    def repeat(z, n):
        return z if n == 0 else repeat(z.sin(), n - 1)
    return repeat


_REPEAT = _recursive_closure()


class _Repeats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(_REPEAT(self.a(x), 2))


def test_a_nested_function_calling_itself_is_scanned_once_and_trains_like_eager():
    """hunt76 F6: its closure holds itself, and scanning the functions the forward reaches
    recursed until Python's limit (RecursionError from inside remat-ir)."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    assert side_by_side(_Repeats(), lambda m: remat_ir.remat(m, (x,), solver="recompute-all", cost_model="flops"),
                        (x,), {}, lambda out: out.sum(), steps=2) == {}
