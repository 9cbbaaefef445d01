"""What a module's parameter slot holds, whatever it is.

`torch.func.functional_call` puts the tensors it is given in the parameter slots of a
module for the call: often plain tensors (MAML's fast weights, a hypernetwork's output),
which `nn.Module.get_parameter` refuses ("is not an nn.Parameter"). Lowering and
binding read the slot, as the model's forward does.
"""

from __future__ import annotations

import torch


def parameter_slot(model: torch.nn.Module, name: str) -> torch.Tensor:
    """What parameter `name` ("block.fc.weight") of `model` holds now; AttributeError where
    it holds none."""
    owner, _, attribute = name.rpartition(".")
    tensor = model.get_submodule(owner)._parameters.get(attribute)
    if tensor is None:
        raise AttributeError(f"{type(model).__name__} has no parameter {name!r}")
    return tensor
