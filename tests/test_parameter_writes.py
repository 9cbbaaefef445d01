"""Parameters the forward writes in place under `no_grad` (a target network's EMA in
BYOL, MoCo and DINO, a clamped temperature), through the parameter itself or through an
alias of it.

Such a parameter's new value is copied in after the forward (`frontends/torch.py`,
a buffer update), so whatever reads its storage may not run again in the backward: it
would read the new value. Only the parameter's direct readers were kept from being
recomputed; an EMA written through `p.detach()`, `state_dict()`'s values or a view read
the storage through the alias, and a backward recomputing the update applied it twice:
the online network's gradients were 2.5 off eager's (hunt77 F10). Frozen targets are the
common case, and a target copied from the online network hid it (1e-8).
"""

from __future__ import annotations

import pytest
import torch

import remat_ir
from exactness import side_by_side

#: Ways to write a target parameter from the online one, in place.
_WRITES = {
    "itself": lambda p: p,
    "detach": lambda p: p.detach(),
    "view": lambda p: p.view(-1).view(p.shape),
    "alias": lambda p: torch.ops.aten.alias(p),
}


class _Momentum(torch.nn.Module):
    def __init__(self, write: str, frozen: bool):
        super().__init__()
        self.write = write
        self.online = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        self.target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        self.target.requires_grad_(not frozen)

    def forward(self, x1, x2):
        with torch.no_grad():
            if self.write == "state_dict":
                online = self.online.state_dict()
                for name, p in self.target.state_dict().items():
                    p.mul_(0.5).add_(online[name], alpha=0.5)
            else:
                for p, q in zip(self.target.parameters(), self.online.parameters()):
                    _WRITES[self.write](p).mul_(0.5).add_(q, alpha=0.5)
            t = self.target(x2)
        return self.online(x1) * t


@pytest.mark.parametrize("write", [*_WRITES, "state_dict"])
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "trainable"])
def test_a_target_networks_ema_written_through_an_alias_trains_like_eager(write, frozen):
    torch.manual_seed(0)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    errors = side_by_side(_Momentum(write, frozen),
                          lambda m: remat_ir.remat(m, (x1, x2), solver="recompute-all", cost_model="flops"),
                          (x1, x2), {}, lambda out: out.sum(), steps=3)
    assert errors == {}



class _ClampsItsTemperature(torch.nn.Module):
    """CLIP's way: the learnable temperature clamped in place, then returned for the loss."""

    def __init__(self):
        super().__init__()
        self.image, self.text = torch.nn.Linear(8, 4), torch.nn.Linear(6, 4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(4.7))
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, a, b, mask):
        with torch.no_grad():
            self.logit_scale.clamp_(0, 4.6052)
            self.seen.add_(1)
        mask.mul_(2)
        image = torch.nn.functional.normalize(self.image(a), dim=-1)
        return image, torch.nn.functional.normalize(self.text(b), dim=-1), self.logit_scale, self.seen, mask


def _contrastive(out):
    image, text, scale, _, _ = out
    logits = scale.exp() * image @ text.t()
    labels = torch.arange(image.shape[0])
    return (torch.nn.functional.cross_entropy(logits, labels)
            + torch.nn.functional.cross_entropy(logits.t(), labels)) / 2


def test_a_member_written_in_place_and_returned_is_handed_over_itself_as_eager_returns_it():
    """hunt77 F2/F3: the clamped temperature came back as a copy no gradient reached the
    parameter through (it never trained, and every other gradient drifted), an updated
    buffer as a snapshot, stale after the next call."""
    torch.manual_seed(0)
    a, b, mask = torch.randn(8, 8), torch.randn(8, 6), torch.ones(8)
    assert side_by_side(_ClampsItsTemperature(), lambda m: remat_ir.remat(m, (a, b, mask.clone()),
                                                                          solver="recompute-all",
                                                                          cost_model="flops"),
                        (a, b, mask), {}, _contrastive, steps=3) == {}
    model = _ClampsItsTemperature()
    scheduled = remat_ir.remat(model, (a, b, mask.clone()), solver="recompute-all", cost_model="flops")
    given = mask.clone()
    _, _, scale, seen, returned = scheduled(a, b, given)
    assert scale is model.logit_scale and seen is model.seen and returned is given
