"""Calls inside `torch.nn.utils.parametrize.cached()`, refused for parametrized models.

Within `cached()`, eager computes each parametrized tensor once for the whole block, and
every call in it reads that one tensor: `spectral_norm`'s power iteration runs once for
two calls, and their gradients meet in one weight. A remat-ir step computes the
parametrization as its graph says, at every call (found by a review: spectral_norm's
`_u` 1.5e-2 off eager's after two calls, weight_norm's gradients off in the last bits,
silently). Tracing inside the block would also leave a traced tensor in parametrize's
cache. A model without parametrizations computes the same inside and out."""

from __future__ import annotations

import torch
from torch.nn.utils import parametrize


def cached_parametrizations(model: torch.nn.Module) -> str | None:
    """What to say of a call or lowering of `model` inside `parametrize.cached()` where
    the model has parametrized modules, else None."""
    if not getattr(parametrize, "_cache_enabled", 0):
        return None
    paths = [path for path, module in model.named_modules() if parametrize.is_parametrized(module)]
    if not paths:
        return None
    shown = ", ".join(repr(path) for path in paths[:3]) + (", ..." if len(paths) > 3 else "")
    return (f"the model (parametrized modules {shown}) is called inside "
            f"torch.nn.utils.parametrize.cached(), where eager computes each parametrized weight "
            f"once for every call in the block, and a remat-ir step computes it at each call as "
            f"its graph does: the weights' gradients and the parametrizations' state (spectral "
            f"norm's power iteration) would differ from eager's. Call it outside cached()")
