"""Outputs that are the step's own inputs as they are: a parameter (open_clip's SigLIP
returns its `logit_bias`), a buffer, or the caller's tensor (a VAE returns its input beside
its reconstruction). Eager's forward returns the objects themselves, and so does the step
(found by hunt59: refused at lowering, asking for a `.clone()` that library code cannot
add)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import remat_ir

from exactness import side_by_side


class _SigLIPLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image, self.text = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
        self.logit_scale, self.logit_bias = torch.nn.Parameter(torch.tensor(2.3)), torch.nn.Parameter(torch.tensor(-1.0))
        self.register_buffer("temperature", torch.tensor(0.5))

    def forward(self, image, text):
        return {"image": F.normalize(self.image(image), dim=-1), "text": F.normalize(self.text(text), dim=-1),
                "logit_scale": self.logit_scale.exp(), "logit_bias": self.logit_bias,
                "temperature": self.temperature}


def _siglip_loss(out):
    logits = out["image"] @ out["text"].t() * out["logit_scale"] * out["temperature"] + out["logit_bias"]
    return -F.logsigmoid(logits * (2 * torch.eye(logits.shape[0]) - 1)).mean() + out["logit_bias"].square()


class _VAELike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encode, self.decode = torch.nn.Linear(6, 4), torch.nn.Linear(4, 6)

    def forward(self, x):
        h = self.encode(x)
        return [self.decode(torch.tanh(h)), x, h.mean(0)]


def _vae_loss(out):
    recon, x, mu = out
    return (recon - x).square().mean() + mu.square().mean()


@pytest.mark.parametrize("options", [{"solver": "recompute-all"}, {}])
def test_a_parameter_and_a_buffer_returned_as_they_are_train_as_eager(options):
    torch.manual_seed(0)
    model, args = _SigLIPLike(), (torch.randn(4, 6), torch.randn(4, 6))
    scheduled = remat_ir.remat(model, args, cost_model="flops", **options)
    out = scheduled(*args)
    assert out["logit_bias"] is model.logit_bias and out["temperature"] is model.temperature
    assert side_by_side(model, lambda m: scheduled, args, {}, _siglip_loss, tolerance=1e-30) == {}


@pytest.mark.parametrize("needs_gradient", [False, True])
def test_the_callers_input_returned_as_it_is_trains_as_eager(needs_gradient):
    torch.manual_seed(0)
    model, x = _VAELike(), torch.randn(5, 6).requires_grad_(needs_gradient)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    assert scheduled(x)[1] is x
    assert side_by_side(model, lambda m: scheduled, (x,), {}, _vae_loss, tolerance=1e-30) == {}
