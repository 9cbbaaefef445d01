"""Where a model holds a tensor outside its parameters and buffers, and the digest of its
bytes: the frontend records both for the tensors it traced as constants
(`frontends/held_tensors.py`), and the runtime compares them before a call
(`runtimes/traced_reads.py`)."""

from __future__ import annotations

import hashlib

import torch

from .namespaces import namespace
from .types import raw_bytes

#: A recorded place: module path, attribute, and the key of a dict or list item or None.
#: The attribute may be a dotted chain through plain objects the module holds
#: ("rope_embedder.freqs_cis": diffusers' Z-Image caches its rotary tables there).
Place = tuple[str, str, object]


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's shape, dtype and bytes (row-major)."""
    return hashlib.sha256(f"{list(tensor.shape)} {tensor.dtype}".encode() + raw_bytes(tensor)).hexdigest()


def shown(path: str, name: str, key) -> str:
    """'encoder.scale', "prompt_tokens['default']", "tables['a'][0]" (a key path: a list
    or tuple of keys, for a container inside a container)."""
    where = f"{path}.{name}" if path else name
    if key is None:
        return where
    return where + "".join(f"[{k!r}]" for k in (key if isinstance(key, (list, tuple)) else [key]))


def held_at(module, name: str, key):
    """The tensor at a recorded place of `module` (its submodule at the path), or None: its
    own attribute, or else its class's (`calls = torch.zeros(())` in the class body), then
    the attributes of plain objects along a dotted name."""
    first, *rest = name.split(".")
    value = vars(module).get(first, getattr(type(module), first, None)) if module is not None else None
    for attribute in rest:
        value = vars(value).get(attribute) if hasattr(value, "__dict__") else None
    for step in (() if key is None else key if isinstance(key, (list, tuple)) else [key]):
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, (list, tuple)) and isinstance(step, int) and -len(value) <= step < len(value):
            value = value[step]
        else:
            value = None
    return value if isinstance(value, torch.Tensor) else None


def global_at(module_name: str, name: str, where) -> torch.Tensor | None:
    """The tensor global `name` of Python module `module_name` holds (`where` None), or its
    attribute (`where` ["attr", attribute]: a class attribute read as `Class.attribute`);
    None where the module is not imported or holds no tensor there."""
    module = namespace(module_name)
    value = module.get(name) if module is not None else None
    if where is not None:   # a dotted name reads an attribute's attribute (`CFG.inner.table`)
        for part in where[1].split("."):
            value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def shown_global(module_name: str, name: str, where) -> str:
    """'global COUNTER of train', 'global Scaler.calls of train'."""
    return f"global {name if where is None else f'{name}.{where[1]}'} of {module_name}"
