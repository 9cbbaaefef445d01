"""Where a model holds a tensor outside its parameters and buffers, and the digest of its
bytes: the frontend records both for the tensors it traced as constants
(`frontends/held_tensors.py`), and the runtime compares them before a call
(`runtimes/traced_reads.py`)."""

from __future__ import annotations

import hashlib

import torch

from .types import raw_bytes

#: A recorded place: module path, attribute, and the key of a dict or list item or None.
Place = tuple[str, str, object]


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's shape, dtype and bytes (row-major)."""
    return hashlib.sha256(f"{list(tensor.shape)} {tensor.dtype}".encode() + raw_bytes(tensor)).hexdigest()


def shown(path: str, name: str, key) -> str:
    """'encoder.scale', "prompt_tokens['default']"."""
    where = f"{path}.{name}" if path else name
    return where if key is None else f"{where}[{key!r}]"


def held_at(module, name: str, key):
    """The tensor at a recorded place of `module` (its submodule at the path), or None."""
    value = vars(module).get(name) if module is not None else None
    if key is not None:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, (list, tuple)) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            value = None
    return value if isinstance(value, torch.Tensor) else None
