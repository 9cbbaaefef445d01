"""Which ops draw from torch's generator: what the graph records as random nodes
(`frontends.torch`), found in the ops a preserved custom Function's forward runs
(`autograd_functions`), and the ops of such Functions whose forward draws."""

from __future__ import annotations

import torch


#: A preserved custom Function's op (its qualified name) -> its facts; `facts["draws"]`
#: is known once the op has been traced, after the op was registered without tags.
_FUNCTION_OPS: dict[str, dict] = {}


def note_function_op(name: str, facts: dict) -> None:
    """Register a custom Function's op (`autograd_functions`), whose draws are said by
    `facts["draws"]` rather than by a tag."""
    _FUNCTION_OPS[name] = facts


def draws_random(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether the op draws from the generator: tagged nondeterministic_seeded, and not an
    attention kernel called with dropout_p=0 (the common case, which draws nothing); a
    custom Function's op whose forward drew while it was traced."""
    facts = _FUNCTION_OPS.get(target._schema.name)
    if facts is not None:
        return facts["draws"]
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for i, argument in enumerate(target._schema.arguments):
        if argument.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", argument.default_value)
            return p != 0
    return True
