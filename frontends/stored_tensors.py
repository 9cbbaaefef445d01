"""Tensors the forward stores on its modules, stored by every call as eager stores them.

Qwen2-VL's forward keeps the offsets of its multimodal positions for generation
(`self.rope_deltas = rope_deltas`). A graph keeps no assignment: torch.export puts the
attribute back after tracing, and lowering refused the model ("it assigns tensors to
self.model.rope_deltas"). Where such a tensor needs no gradient (computed from the
caller's token ids, not through the parameters), the traced forward returns it after the
model's own outputs (a forward hook adds them while tracing, `StoredTensors.hook`), the
graph's metadata names where each goes (`torch.stored_attributes`), and the runtime
assigns them there after every training call, so the model holds what eager's call
leaves on it. A tensor needing a gradient stays refused: eager's keeps the step's
autograd graph alive on the module, which a later call could differentiate through.
"""

from __future__ import annotations

import torch

from .errors import LoweringError

#: The graph's metadata: [[module path, attribute], ...], the graph's last outputs, in order.
METADATA = "torch.stored_attributes"


class StoredTensors:
    """The module attributes a traced forward assigned a tensor needing no gradient to."""

    def __init__(self):
        #: (module path, attribute) -> ('file:line' of the first assignment, the tensor's
        #: shape, dtype and device), in order.
        self.places: dict[tuple[str, str], tuple] = {}

    def note(self, path: str, key: str, value, where: str) -> bool:
        """Whether an assignment of `value` to `key` of the module at `path` is kept as a
        stored tensor (a tensor needing no gradient); noted if so."""
        if not isinstance(value, torch.Tensor) or value.requires_grad:
            return False
        self.places.setdefault((path, key), (where, tuple(value.shape), value.dtype, value.device))
        return True

    def stand_ins(self) -> dict[tuple[str, str], torch.Tensor]:
        """A tensor of each stored one's shape, dtype and device (zeros): what the model
        holds there after a call, to trace again with (`frontends/torch.py`)."""
        return {place: torch.zeros(shape, dtype=dtype, device=device)
                for place, (_, shape, dtype, device) in self.places.items()}

    def copy(self) -> StoredTensors:
        made = StoredTensors()
        made.places = dict(self.places)
        return made

    def described(self) -> list[str]:
        """Each place, said for an error: "attribute 'kept' of inner at model.py:12"."""
        return [f"attribute {key!r} of {path or '<root>'} at {where}"
                for (path, key), (where, *_) in self.places.items()]

    def named(self) -> set[str]:
        """The attributes' dotted names, as torch.export's warning names them."""
        return {f"{path}.{key}" if path else key for path, key in self.places}

    def hook(self, model: torch.nn.Module):
        """A forward hook for `model` returning `(output, (stored tensors...))` where the
        traced forward stored any."""
        def add_stored(module, inputs, output):
            if not self.places:
                return None
            modules = dict(model.named_modules())
            values = tuple(vars(modules[path]).get(key) for path, key in self.places)
            for (path, key), value in zip(self.places, values):
                if not isinstance(value, torch.Tensor) or value.requires_grad:
                    raise LoweringError(
                        f"{type(model).__name__}'s forward assigns a tensor to attribute {key!r} of "
                        f"{path or '<root>'} at {self.places[path, key][0]}, then {type(value).__name__} "
                        f"(a tensor needing gradients, or no tensor): a graph stores one tensor "
                        f"needing no gradient there per call; store a detached tensor once")
            return output, values
        return model.register_forward_hook(add_stored)

