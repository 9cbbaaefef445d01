"""Random ops given torch's default generator by name (`generator=torch.default_generator`,
a module's `self.gen = generator or torch.default_generator`): drawn as without it.

torch.export lifts a generator argument as a constant of the program, a copy of the
object, so the frontend could not tell it from a generator of the user's own and refused
it ("draws random numbers from a torch.Generator of its own"; found by hunt61), though
the op draws from the very generator the runtime replays. While the forward is exported,
`default_generators_dropped` takes the argument off such calls."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def _default(generator) -> bool:
    """Whether `generator` is torch's default generator of its device."""
    if generator is torch.default_generator:
        return True
    return isinstance(generator, torch.Generator) and generator.device.type == "cuda" and any(
        generator is default for default in getattr(torch.cuda, "default_generators", ()))


class default_generators_dropped(TorchFunctionMode):   # noqa: N801 - used as a context, like torch's modes
    """Within: a torch function called with `generator=` torch's default generator is
    called without it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "generator" in kwargs and _default(kwargs["generator"]):
            kwargs = {key: value for key, value in kwargs.items() if key != "generator"}
        return func(*args, **kwargs)
