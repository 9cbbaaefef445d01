"""A forward that sets itself up at its first call, behind a flag it then sets (Glow's
ActNorm initialises its scale and shift from the first batch: `if not self.inited: ...;
self.inited = True`). Refused before as a counter (hunt61). The first trace's graph runs
while the flag is as it was, the runtime sets it after that call as eager's call leaves it
(`torch.assigned_after`), and the next call plans again for the flag set."""

from __future__ import annotations

import pytest
import torch

import remat_ir
from remat_ir.frontends.errors import LoweringError

from exactness import side_by_side


class _ActNorm(torch.nn.Module):
    """Glow's activation normalisation: scale and shift set from the first batch's
    statistics, under no_grad, then trained."""

    def __init__(self, channels: int):
        super().__init__()
        self.loc = torch.nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.logs = torch.nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.inited = False

    def forward(self, x):
        if self.training and not self.inited:
            with torch.no_grad():
                self.loc.copy_(-x.mean((0, 2, 3), keepdim=True))
                self.logs.copy_(-torch.log(x.std((0, 2, 3), keepdim=True) + 1e-6))
            self.inited = True
        return (x + self.loc) * torch.exp(self.logs), x.shape[2] * x.shape[3] * self.logs.sum()


class _Flow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(3, 3, 1), _ActNorm(3)

    def forward(self, x):
        return self.norm(torch.tanh(self.conv(x)))


def _loss(out):
    z, logdet = out
    return 0.5 * z.square().sum() - logdet


@pytest.mark.parametrize("solver", ["recompute-all", "sqrt"])
def test_a_first_calls_setup_behind_a_flag_trains_like_eager(solver, capsys):
    torch.manual_seed(0)
    model, x = _Flow(), torch.randn(2, 3, 4, 4)
    assert side_by_side(model, lambda m: remat_ir.remat(m, (x,), solver=solver), (x,), {}, _loss, steps=3,
                        tolerance=1e-30) == {}
    assert model.norm.inited is True
    assert capsys.readouterr().err.count("planning again") == 1   # for the flag set, once


def test_lowering_leaves_the_flag_as_it_was():
    """The trace ran the setup once: the first training call, not `remat`, sets the flag."""
    torch.manual_seed(0)
    model, x = _Flow(), torch.randn(2, 3, 4, 4)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all")
    assert model.norm.inited is False and torch.equal(model.norm.loc, torch.zeros(1, 3, 1, 1))
    _loss(scheduled(x)).backward()
    assert model.norm.inited is True and not torch.equal(model.norm.loc, torch.zeros(1, 3, 1, 1))


class _Toggles(torch.nn.Module):
    """Flips a flag at every call: no setup that settles, still refused."""

    def __init__(self):
        super().__init__()
        self.linear, self.odd = torch.nn.Linear(4, 4), False

    def forward(self, x):
        h = self.linear(x) * (2.0 if self.odd else 1.0)
        self.odd = not self.odd
        return h.sum()


def test_a_flag_flipped_at_every_call_is_still_refused():
    with pytest.raises(LoweringError, match=r"assigns module attribute 'odd'"):
        remat_ir.remat(_Toggles(), (torch.randn(2, 4),), solver="recompute-all")


class _FlagAbsentFirst(torch.nn.Module):
    """The flag does not exist before the first call, read per `how`."""

    def __init__(self, how: str):
        super().__init__()
        self.loc, self.how = torch.nn.Parameter(torch.zeros(1, 3, 1, 1)), how

    def forward(self, x):
        inited = {"getattr": lambda: getattr(self, "_inited", False), "hasattr": lambda: hasattr(self, "_inited"),
                  "__dict__": lambda: self.__dict__.get("_inited")}[self.how]()
        if not inited:
            with torch.no_grad():
                self.loc.copy_(-x.mean((0, 2, 3), keepdim=True))
            self._inited = True
        return (x + self.loc).square().sum()


@pytest.mark.parametrize("how", ["getattr", "hasattr"])
def test_a_flag_absent_before_the_first_call_trains_like_eager(how):
    """Found by hunt62: its read was recorded as either value, so no call planned again,
    and every step initialised again from its batch (2.08 off eager, silently)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    assert side_by_side(_FlagAbsentFirst(how), lambda m: remat_ir.remat(m, (x,), solver="recompute-all"), (x,), {},
                        lambda loss: loss, steps=3, tolerance=1e-30) == {}


def test_a_flag_read_where_no_read_is_recorded_is_still_refused():
    """`self.__dict__.get`: no read the runtime compares, so no call would plan again."""
    with pytest.raises(LoweringError, match=r"assigns module attribute '_inited'"):
        remat_ir.remat(_FlagAbsentFirst("__dict__"), (torch.randn(2, 3, 4, 4),), solver="recompute-all")


class _FlagInADict(torch.nn.Module):
    """ActNorm whose flag is an item of a dict it holds (`self.state["inited"]`)."""

    def __init__(self):
        super().__init__()
        self.fc, self.loc, self.state = torch.nn.Linear(8, 8), torch.nn.Parameter(torch.zeros(8)), {"inited": False}

    def forward(self, x):
        h = self.fc(x)
        if not self.state["inited"]:
            with torch.no_grad():
                self.loc.copy_(-h.mean(0))
            self.state["inited"] = True
        return (h + self.loc).square().mean()


def test_a_flag_kept_in_a_dict_is_refused_naming_the_item_and_trains_once_the_model_ran():
    """hunt61: a first call's flag kept in a dict was refused as "it changes module
    attribute 'state'", and no more. The refusal names the item and two ways out; the
    first, one call before `remat`, trains like eager."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with pytest.raises(LoweringError, match=r"it changes module attribute 'state' of <root> \(item 'inited': "
                                            r"False, then True\): a flag its first call sets\? Call the model "
                                            r"once before remat_ir.remat, or keep the flag in a plain attribute"):
        remat_ir.remat(_FlagInADict(), (x,), solver="recompute-all")
    model = _FlagInADict()
    model(x)
    model.zero_grad()
    assert side_by_side(model, lambda m: remat_ir.remat(m, (x,), solver="recompute-all"), (x,), {},
                        lambda loss: loss, steps=3, tolerance=1e-30) == {}
