"""Recurrent modules whose weights carry a parametrization that draws random numbers or
changes its own state (weight dropout, DropConnect, `spectral_norm`'s power iteration),
refused at lowering.

Eager's `nn.RNNBase.forward` reads each weight several times per call, each read running
the parametrization again (`_update_flat_weights`: `hasattr` and `getattr` in
`_weights_have_changed`, then again in `_init_flat_weights`: four times for the first
parametrized weight, twice for the others, and on a module's first call after a copy
otherwise), where torch.export's trace reads them twice. A pure parametrization computes
the same each time (weight_norm, orthogonal: exact). One that draws or updates state does
not: the graph drew other masks than eager, and its generator state after the step was
another, silently (found by hunt58: LSTM gradients 2.4e-3 off eager's at the first step;
`spectral_norm` on `weight_hh_l0`: `_u` 2.8e-2 off after one step)."""

from __future__ import annotations

import torch
from torch.nn.utils import parametrize

from remat_ir.torchlib.generators import GeneratorStates


def stateful_rnn_parametrizations(model: torch.nn.Module) -> str | None:
    """What to say of the first weight of a recurrent module of `model` whose
    parametrization draws random numbers or changes a buffer when evaluated (in the
    model's mode), else None. Evaluates each such weight once, its state put back."""
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.RNNBase) or not parametrize.is_parametrized(module):
            continue
        for name, chain in module.parametrizations.items():
            effect = _evaluation_effect(module, name, chain)
            if effect is not None:
                kinds = ", ".join(type(p).__name__ for p in chain)
                kind = type(module).__name__.removeprefix("Parametrized")
                return (f"{type(model).__name__}'s {path or '<root>'} ({kind}) has a "
                        f"parametrization on {name} ({kinds}) that {effect} each time the weight is read. "
                        f"Eager's {kind} reads its weights several times per call "
                        f"(nn.RNNBase._update_flat_weights: four times for the first parametrized weight) "
                        f"and a traced graph fewer, so remat-ir's step would not compute eager's weights. "
                        f"Keep the weight unparametrized and compute it once in your forward, passing it "
                        f"with torch.func.functional_call(self.{path.rsplit('.', 1)[-1] or 'rnn'}, "
                        f"{{{name!r}: weight}}, (x,)) (remat-ir trains that as eager does), or train this "
                        f"module in eval mode")
    return None


def _evaluation_effect(module: torch.nn.Module, name: str, chain) -> str | None:
    """'draws random numbers' or 'changes its buffers' where evaluating `module.name`
    does so, else None; the generators and buffers put back as they were."""
    saved = [(buffer, buffer.detach().clone(), buffer._version) for buffer in chain.buffers()]
    devices = sorted({t.device for t in module.parameters() if t.device.type == "cuda"}, key=str)
    generators = GeneratorStates(devices)
    try:
        with torch.no_grad():
            getattr(module, name)
        if generators.moved_torch(GeneratorStates(devices)):
            return "draws random numbers"
        if any(buffer._version != version or not torch.equal(buffer, copy) for buffer, copy, version in saved):
            return "changes its buffers"
        return None
    finally:
        generators.restore()
        with torch.no_grad():
            for buffer, copy, _ in saved:
                if not torch.equal(buffer, copy):
                    buffer.copy_(copy)
