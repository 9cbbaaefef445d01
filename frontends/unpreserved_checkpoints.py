"""`torch.utils.checkpoint(..., use_reentrant=False, preserve_rng_state=False)` around
random draws, refused while tracing.

Eager recomputes such a block in the backward with the generator as it is then: the
gradients are of other draws (a fresh dropout mask) than the forward's loss, and the
generator advances during the backward. The trace holds one draw, which the graph's
backward reads as any other activation: remat-ir trained with the forward's mask and left
the generator elsewhere than eager, without a word (found by a review: a gradient 3.3e-2
off, generator state unequal). Neither is what a user of the flag wants to change (it
saves the state's copy, for speed), so such a block is refused naming its line, with
what to do. A block that draws nothing computes the same either way and is traced.

Hooked at `_checkpoint_without_reentrant_generator`, which `checkpoint` looks up at each
call, so that models holding their own reference to `checkpoint` (transformers'
`_gradient_checkpointing_func`) are seen too; the draws are seen at the fake tensors'
dispatch (`fake_dispatch`)."""

from __future__ import annotations

import contextlib
import traceback

import torch
import torch.utils.checkpoint as checkpointing

from .errors import LoweringError
from .fake_dispatch import wrapped_fake_dispatch
from .model_lines import model_line


@contextlib.contextmanager
def unpreserved_checkpoints_refused():
    """Within: a checkpointed block that does not preserve the RNG state and draws is
    refused (module docstring)."""
    original = checkpointing._checkpoint_without_reentrant_generator
    blocks: list[list] = []   # per block entered and not left: the draws seen in it

    def generator(fn, preserve_rng_state=True, *args, **kwargs):
        inner = original(fn, preserve_rng_state, *args, **kwargs)
        return inner if preserve_rng_state else watched(inner, model_line(traceback.extract_stack()))

    def watched(inner, line):
        next(inner)   # checkpoint's own work before the block runs
        blocks.append([])
        try:
            yield     # the block runs
        finally:
            drawn = blocks.pop()
        if drawn:
            raise LoweringError(
                f"torch.utils.checkpoint with preserve_rng_state=False at {line or 'a line of the model'} "
                f"around random draws ({', '.join(sorted(set(drawn)))}): eager's backward computes "
                f"that block again with other draws than its forward made, so its gradients are "
                f"not of the loss it returned, and a remat-ir step reads the forward's draws. "
                f"Pass preserve_rng_state=True (the default), or remove the checkpoint: remat-ir "
                f"plans recomputation itself, with eager's draws")
        next(inner, None)

    def wrap(dispatch):
        def seen(mode, func, types, args=(), kwargs=None):
            if blocks and torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                blocks[-1].append(str(func.overloadpacket.__name__))
            return dispatch(mode, func, types, args, kwargs)
        return seen

    checkpointing._checkpoint_without_reentrant_generator = generator
    try:
        with wrapped_fake_dispatch(wrap):
            yield
    finally:
        checkpointing._checkpoint_without_reentrant_generator = original
