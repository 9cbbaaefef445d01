"""`torch.nn.utils.weight_norm`'s forward pre-hooks: what the graph computes of them, and
what a step leaves on the module.

The hook (a `WeightNorm`) computes the weight from its parameters `name_g` and `name_v`
and assigns it to the module before every call. torch.export traces that computation
into the graph where the hook runs, so the graph's weight is eager's, bit for bit; only
the assignment is left out, which torch.export undoes after tracing. Eager's call leaves
the module holding the weight it computed (from the parameters before the optimizer's
step), and code reading `module.weight` afterwards (a log, a tied head outside the
model, `remove_weight_norm`'s caller) must find that one, not the weight of the call
that was traced: `assign_weights` computes it again with eager's own function after a
step's forward (a norm over the weight: small beside the step).
"""

from __future__ import annotations

import torch
from torch.nn.utils.weight_norm import WeightNorm


def hook_weight_norms(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, WeightNorm]]:
    """"path.name" -> (module, hook) of each weight a `WeightNorm` hook assigns."""
    return {f"{path}.{hook.name}" if path else hook.name: (module, hook)
            for path, module in model.named_modules()
            for hook in module._forward_pre_hooks.values() if isinstance(hook, WeightNorm)}


def assign_weights(norms: dict[str, tuple[torch.nn.Module, WeightNorm]]) -> None:
    """Leave each module holding the weight its hook computes now, as eager's call does."""
    for module, hook in norms.values():
        setattr(module, hook.name, hook.compute_weight(module))
