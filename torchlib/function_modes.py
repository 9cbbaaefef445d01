"""The user's `TorchFunctionMode`s active around a call.

Such a mode sees the torch functions a forward calls (`F.linear`) and may change what
they return (a numerics emulation, an instrumentation that scales). remat-ir traces and
runs ATen ops, below that layer, so a mode active around a training call changed what
eager computed and not the step: 0.05 off eager's loss, silently (hunt66). Torch's own
modes (`with torch.device(...)`, tracing's) are not the user's.
"""

from __future__ import annotations

import torch


def user_function_modes() -> list[str]:
    """The classes of the active `TorchFunctionMode`s that are not torch's own, by name."""
    stack = torch.overrides._get_current_function_mode_stack()
    return [f"{type(mode).__module__}.{type(mode).__qualname__}" for mode in stack
            if not type(mode).__module__.startswith("torch.")]
