"""Forward pre-hooks that compute a weight and assign it to their module at every call:
`torch.nn.utils.weight_norm`, `spectral_norm` and `prune`'s methods (the forms before
`torch.nn.utils.parametrize`, still common in audio models and GAN discriminators).

torch.export traces the hook's computation into the graph where the hook runs (from
`weight_g` and `weight_v`; from `weight_orig` and the power iteration's vectors, which
it updates in place like any buffer; from `weight_orig` and `weight_mask`), so the graph's
weight is eager's, bit for bit; only the assignment is left out, which torch.export
undoes after tracing. Eager's call leaves the module holding the weight it computed,
and code reading `module.weight` afterwards (a log, `remove_weight_norm`,
`prune.remove`) must find that one, not the weight of the call that was traced:
`assign_weights` computes it again after a step's forward with the hook's own function,
from the parameters and buffers the call left (a norm or a product over the weight:
small beside the step).
"""

from __future__ import annotations

import contextlib
import typing

import torch
from torch.nn.utils import prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm


class Kind(typing.NamedTuple):
    """One kind of hook: what applies it, the parametrization computing the weight at
    every read instead, the hook's name for the weight, and its weight as the call left it."""
    applied: str
    instead: str
    name: typing.Callable
    weight: typing.Callable


_KINDS = {
    WeightNorm: Kind("torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm",
                     lambda hook: hook.name, lambda hook, module: hook.compute_weight(module)),
    # The call's power iteration has updated the vectors already: another would move them.
    SpectralNorm: Kind("torch.nn.utils.spectral_norm", "torch.nn.utils.parametrizations.spectral_norm",
                       lambda hook: hook.name,
                       lambda hook, module: hook.compute_weight(module, do_power_iteration=False)),
    prune.BasePruningMethod: Kind("torch.nn.utils.prune", "a mask through torch.nn.utils.parametrize",
                                  lambda hook: hook._tensor_name, lambda hook, module: hook.apply_mask(module)),
}


def kind(hook) -> Kind | None:
    """The hook's kind, or None for another hook."""
    return next((row for cls, row in _KINDS.items() if isinstance(hook, cls)), None)


def hook_reparametrizations(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, object]]:
    """"path.name" -> (module, hook) of each weight such a hook assigns."""
    found = {}
    for path, module in model.named_modules():
        for hook in module._forward_pre_hooks.values():
            row = kind(hook)
            if row is not None:
                name = row.name(hook)
                found[f"{path}.{name}" if path else name] = (module, hook)
    return found


def assign_weights(hooks: dict[str, tuple[torch.nn.Module, object]]) -> None:
    """Leave each module holding the weight its hook computed at the call just made, as
    eager's call does."""
    for module, hook in hooks.values():
        row = kind(hook)
        # The weight the call before left goes first: eager's hook computes the new one
        # while the module holds the old, as the forward starts and little else is live;
        # here, after the forward, both beside what the step keeps for its backward were
        # 16,640 B above a plan's peak (a soak, 2026-12-04). The hooks' functions read
        # their own parameters and buffers, never this attribute.
        setattr(module, row.name(hook), None)
        with _whole_parameters(module):
            weight = row.weight(hook, module)
        setattr(module, row.name(hook), weight)


@contextlib.contextmanager
def _whole_parameters(module: torch.nn.Module):
    """`module`'s parameters sharded by FSDP2 (DTensors) as whole tensors, put back on exit.

    Why: eager's FSDP call runs the hook while the unit is gathered, and leaves the module
    holding a whole weight; after remat-ir's step the unit is sharded again, and the hook's
    function failed on DTensor shards beside its plain buffers ("got mixed torch.Tensor and
    DTensor"). Gathering them here is a collective every rank runs in the same order."""
    sharded = {name: p for name, p in module._parameters.items() if hasattr(p, "full_tensor")}
    try:
        for name, p in sharded.items():
            module._parameters[name] = p.full_tensor()
        yield
    finally:
        module._parameters.update(sharded)
