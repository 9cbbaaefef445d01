"""Attention layers eager runs on PyTorch's inference fast path (eval mode, no gradient
asked of them) and a trace runs on their plain ops: refused at lowering, naming the layer
and the way out (`frontends/fast_paths.py`; found by hunt58, a frozen eval encoder with a
padding mask 0.03 off eager's loss, silently)."""

from __future__ import annotations

import pytest
import torch

import remat_ir
from remat_ir.frontends.torch import LoweringError

from exactness import side_by_side


class _SuperAttention(torch.nn.MultiheadAttention):
    """A subclass whose forward calls torch's, which takes the fast path."""

    def forward(self, query, key, value, **kwargs):
        return super().forward(query, key, value, **kwargs)


class _FrozenEncoderHead(torch.nn.Module):
    """A frozen eval encoder (or attention layer) under a trainable head: the usual
    frozen-backbone setup."""

    def __init__(self, layer: str, batch_first: bool = True, heads: int = 2):
        super().__init__()
        self.layer = layer
        if layer == "encoder":
            block = torch.nn.TransformerEncoderLayer(8, heads, 16, dropout=0.0, batch_first=batch_first)
            self.body = torch.nn.TransformerEncoder(block, 2)
        else:
            kind = _SuperAttention if layer == "subclass calling super" else torch.nn.MultiheadAttention
            self.body = kind(8, heads, batch_first=batch_first)
        self.body.requires_grad_(False).eval()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x, padding):
        if self.layer == "encoder":
            h = self.body(x, src_key_padding_mask=padding)
        else:
            h = self.body(x, x, x, need_weights=False)[0]
        return self.head(h).square().mean()


def _inputs(batch_first: bool = True):
    x = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, 3:] = True
    return x, padding


@pytest.mark.parametrize("layer, named", [("encoder", r"body \(TransformerEncoder\)"),
                                          ("attention", r"body \(MultiheadAttention\)"),
                                          ("subclass calling super", r"body \(_SuperAttention\)")])
def test_a_frozen_eval_attention_layer_eager_runs_fast_is_refused_naming_the_way_out(layer, named):
    """A subclass whose forward calls torch's takes the fast path too: taken for one with
    a forward of its own, it trained 1.1e-7 off eager's on an AVX-512 CPU, silently."""
    torch.manual_seed(0)
    with pytest.raises(LoweringError, match=rf"_FrozenEncoderHead's {named} runs in eval mode with no gradient "
                                            r"asked of it.*torch\.backends\.mha\.set_fastpath_enabled\(False\)"):
        remat_ir.remat(_FrozenEncoderHead(layer), _inputs(), cost_model="flops")


@pytest.mark.parametrize("layer", ["encoder", "attention"])
def test_with_the_fast_path_off_a_frozen_eval_attention_layer_trains_as_eager(layer):
    torch.manual_seed(0)
    model, args = _FrozenEncoderHead(layer), _inputs()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        scheduled = remat_ir.remat(model, args, cost_model="flops", solver="recompute-all")
        assert side_by_side(model, lambda m: scheduled, args, {}, lambda loss: loss, tolerance=1e-30) == {}
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


@pytest.mark.parametrize("why", ["sequence first", "odd heads"])
def test_a_frozen_eval_attention_layer_eager_runs_plain_trains_as_eager(why):
    """PyTorch's own conditions decide: sequence-first inputs and an odd number of heads
    take no fast path, in eager or traced."""
    torch.manual_seed(0)
    batch_first = why != "sequence first"
    model = _FrozenEncoderHead("attention", batch_first=batch_first, heads=1 if why == "odd heads" else 2)
    args = _inputs(batch_first)
    scheduled = remat_ir.remat(model, args, cost_model="flops", solver="recompute-all")
    assert side_by_side(model, lambda m: scheduled, args, {}, lambda loss: loss, tolerance=1e-30) == {}


class _OwnAttention(torch.nn.MultiheadAttention):
    """A subclass with a forward of its own, which takes no fast path of torch's."""

    def forward(self, query, key, value, **kwargs):
        return torch.nn.functional.multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), self.embed_dim, self.num_heads,
            self.in_proj_weight, self.in_proj_bias, None, None, False, 0.0, self.out_proj.weight,
            self.out_proj.bias, training=self.training, need_weights=False)[0].transpose(0, 1), None


class _FrozenPlain(torch.nn.Module):
    """Frozen eval layers that eager runs on their plain ops (hunt60: refused at first)."""

    def __init__(self, case: str):
        super().__init__()
        self.case = case
        if case == "silu encoder":
            block = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=torch.nn.functional.silu,
                                                     batch_first=True)
            self.body = torch.nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        elif case == "subclass":
            self.body = _OwnAttention(8, 2, batch_first=True)
        else:
            self.body = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.body.requires_grad_(False).eval()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x, padding):
        if self.case == "silu encoder":
            h = self.body(x, src_key_padding_mask=padding)
        elif self.case == "positional float mask":
            h = self.body(x, x, x, None, False, torch.zeros(5, 5))[0]
        else:
            h = self.body(x, x, x)[0]
        return self.head(h).square().mean()


@pytest.mark.parametrize("case", ["silu encoder", "subclass", "positional float mask"])
def test_frozen_eval_layers_eager_runs_plain_are_not_refused(case):
    torch.manual_seed(0)
    model, args = _FrozenPlain(case), _inputs()
    scheduled = remat_ir.remat(model, args, cost_model="flops", solver="recompute-all")
    assert side_by_side(model, lambda m: scheduled, args, {}, lambda loss: loss, tolerance=1e-30) == {}


def test_the_fast_path_turned_on_again_after_lowering_plans_again_and_is_refused():
    """Found by hunt60: lowered with the fast path off, then trained with it on, the step
    computed the plain ops where eager took the fused ones, 7.1e-2 off, silently."""
    torch.manual_seed(0)
    model, args = _FrozenEncoderHead("encoder"), _inputs()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        scheduled = remat_ir.remat(model, args, cost_model="flops", solver="recompute-all")
        scheduled(*args).backward()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    with pytest.raises(LoweringError, match=r"the attention layers' fast path off.*runs in eval mode with no "
                                            r"gradient asked of it"):
        scheduled(*args)
