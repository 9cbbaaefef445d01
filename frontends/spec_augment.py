"""transformers' SpecAugment masks traced as `remat_ir::spec_augment_mask`
(`torchlib/spec_augment.py`), drawn by eager's NumPy code at every step.

Why: the speech models' `_compute_mask_indices` draws its mask from NumPy's global
generator while training; torch.export ran it once, so the graph would have held one
mask for every step, and the model was refused (`trace_effects.py`: "set
mask_time_prob=0.0", fine-tuning without SpecAugment).

`spec_augment_as_ops`, while torch.export traces, makes that function, in every loaded
module of transformers' models defining it, return the op's traced result instead of
drawing; the forward's `torch.tensor(mask, device=..., dtype=torch.bool)` of it is the
tensor itself (cast as asked), not the copy, and its warning, that `torch.tensor` of a
tensor gives. Each op reads the mask drawn before it in the trace, so the step draws
them in eager's order. A call the op cannot stand for (other parameters than the
function has in transformers today) draws as before, and is refused as before.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch

from remat_ir.torchlib import spec_augment as op

from .transformers_paths import swapped_globals


@contextlib.contextmanager
def spec_augment_as_ops():
    """Within: transformers' `_compute_mask_indices` returns the traced op's mask."""
    drawn: list[torch.Tensor] = []   # the masks of this trace, in order
    tensor = torch.tensor

    def as_op(name, original):
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            return original
        if tuple(signature.parameters) != op.PARAMETERS:
            return original

        def traced(*args, **kwargs):
            # The module whose global the forward called, where the op looks it up at every
            # step (a function patched there after lowering is the traced reads' to see).
            caller = sys._getframe(1).f_globals
            module = caller["__name__"] if caller.get(op.FUNCTION) is traced else original.__module__
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            shape, prob, length, attention_mask, least = (bound.arguments[p] for p in op.PARAMETERS)
            if not 1 <= length <= shape[-1]:
                # Eager's ValueError, raised before any draw (a span longer than the frames).
                return original(*args, **kwargs)
            # Without an attention mask, any device: a graph's `Device` arguments are its step's.
            device = attention_mask.device if attention_mask is not None else torch.device("cpu")
            mask = torch.ops.remat_ir.spec_augment_mask(
                module, [int(size) for size in shape], float(prob), int(length), int(least),
                attention_mask, drawn[-1] if drawn else None, device)
            drawn.append(mask)
            return mask
        return traced

    def tensor_of_mask(data, *args, **kwargs):
        if isinstance(data, torch.Tensor) and any(data is mask for mask in drawn) and not args:
            return data.to(dtype=kwargs.get("dtype"), device=kwargs.get("device"), copy=True)
        return tensor(data, *args, **kwargs)

    torch.tensor = tensor_of_mask
    try:
        with swapped_globals("transformers.models.", (op.FUNCTION,), as_op):
            yield
    finally:
        torch.tensor = tensor
