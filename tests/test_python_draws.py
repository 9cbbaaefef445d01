"""Numbers a forward draws from Python's `random` that only a comparison its range decides
reads (LayerDrop at 0.0: `frontends/python_draws.py`): lowered, and every training call
draws as many as eager's forward, so Python's generator is eager's after each step
(`side_by_side` compares it). Any other use is refused by line."""

from __future__ import annotations

import random

import pytest
import torch

import remat_ir
from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch

from exactness import side_by_side


class _LayerDrop(torch.nn.Module):
    """Layers skipped at random as MusicGen's decoder skips them: a number drawn from
    Python's generator per layer, compared with `layerdrop` (by `uniform` and `random`)."""

    def __init__(self, layerdrop: float = 0.0, use: str = "compare"):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.layerdrop, self.use = layerdrop, use

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            p = random.uniform(0, 1) if i % 2 else random.random()
            if self.use == "scale":
                x = x * p
            elif self.training and (p < self.layerdrop):
                continue
            x = torch.nn.functional.dropout(torch.tanh(layer(x)), 0.1, self.training) + x
        return x.square().mean()


@pytest.mark.parametrize("solver", ["autograd", "recompute-all"])
def test_layerdrop_off_drawn_from_pythons_generator_trains_like_eager(solver):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    state = random.getstate()
    graph = lower_torch(_LayerDrop(), (x,), cost_model="flops")
    assert random.getstate() == state   # lowering draws as eager, then puts the generator back
    assert graph.proto.metadata["torch.python_draws"] == "3"
    errors = side_by_side(_LayerDrop(), lambda m: remat_ir.remat(m, (x,), solver=solver, cost_model="flops"),
                          (x,), {}, lambda loss: loss, steps=3)
    assert errors == {}


@pytest.mark.parametrize("layerdrop,use,said", [
    (0.1, "compare", "with 0.1, which its range [0.0, 1.0] does not decide"),
    (0.0, "scale", "the forward computes with: a number drawn from Python's random generator"),
])
def test_a_draw_read_otherwise_is_refused_by_line(layerdrop, use, said):
    with pytest.raises(LoweringError) as refused:
        lower_torch(_LayerDrop(layerdrop, use), (torch.randn(4, 8),), cost_model="flops")
    assert said in str(refused.value)
    assert "test_python_draws.py:" in str(refused.value)   # the draw's line


class _Picks(torch.nn.Module):
    """Draws with a function whose range is not known here (`random.choice`)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x).square().mean() * random.choice([1.0, 1.0])


def test_other_draws_from_pythons_generator_are_refused_as_before():
    with pytest.raises(LoweringError, match="it draws from Python's random generator"):
        lower_torch(_Picks(), (torch.randn(4, 8),), cost_model="flops")


def test_musicgen_with_its_layerdrop_off_trains_like_eager():
    """transformers' MusicGen decoder draws `random.uniform(0, 1)` at every layer (it was
    refused); its generator state after each step is eager's."""
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()

    torch.manual_seed(0)
    config = MusicgenDecoderConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   ffn_dim=32, max_position_embeddings=16, num_codebooks=2, layerdrop=0.0,
                                   use_cache=False, pad_token_id=32, bos_token_id=32)
    model = MusicgenForCausalLM(config).train()
    labels = torch.randint(0, 32, (2, 8, 2))
    batch = dict(input_ids=labels.transpose(1, 2).reshape(4, 8), labels=labels)
    errors = side_by_side(model, lambda m: remat_ir.remat(m, batch, solver="recompute-all", cost_model="flops"),
                          (), batch, lambda out: out.loss, steps=2)
    assert errors == {}
