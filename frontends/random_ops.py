"""Which ops draw from torch's generator: what the graph records as random nodes
(`frontends.torch`) and what a preserved custom Function may not do in its forward
(`autograd_functions`)."""

from __future__ import annotations

import torch


def draws_random(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether the op draws from the generator: tagged nondeterministic_seeded, and not an
    attention kernel called with dropout_p=0 (the common case, which draws nothing)."""
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for i, argument in enumerate(target._schema.arguments):
        if argument.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", argument.default_value)
            return p != 0
    return True
