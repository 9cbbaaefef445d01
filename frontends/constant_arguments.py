"""Forward arguments torch.export takes no constant of, handed to it as names.

torch.export takes a tensor, int, float, bool, str or None as an argument leaf and refuses
any other value: a NumPy scalar (`np.float32(0.5)`, `np.int64(3)`, what a data pipeline
built with NumPy hands over) or a `torch.dtype` (`model(x, dtype=torch.bfloat16)`) was
refused with its words, "data-dependent control flow or an unsupported construct"
(hunt80 F7), where eager trains. Such a value is immutable, and its repr names it whole
(`np.float32(0.5)`, `torch.bfloat16`), so it is a constant of the trace as a float is: the
call's signature (`runtimes/signatures.py`, the leaf's repr) is lowered again for another.

torch.export is handed a name in its place (a str, one leaf as the value was, so every
input keeps its position), and the forward, patched on the instance while export runs,
takes the value back before the model's code sees it. AOTAutograd traces the exported
graph with the same names. A forward pre-hook of the root module sees the name (it runs
before the forward); the model's code and its submodules' hooks see the value.
"""
from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch.utils import _pytree as pytree

#: torch's own value types a forward may take as arguments (each compares by value).
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _held_constant(leaf) -> bool:
    numpy = sys.modules.get("numpy")
    return isinstance(leaf, _TORCH_VALUES) or (numpy is not None and isinstance(leaf, numpy.generic))


def constants_named(args: tuple, kwargs: dict) -> tuple[tuple, dict, dict[str, object]]:
    """(args, kwargs) with each such value a name, and {name: value}; the arguments as
    they are where none is (the same names for the same arguments: export and
    AOTAutograd must see one program's inputs)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    table = {}
    for index, leaf in enumerate(leaves):
        if _held_constant(leaf):
            name = f"__remat_ir_constant_argument_{index}__"
            table[name] = leaf
            leaves[index] = name
    if not table:
        return args, kwargs, table
    named_args, named_kwargs = pytree.tree_unflatten(leaves, spec)
    return named_args, named_kwargs, table


@contextlib.contextmanager
def constants_bound(model: torch.nn.Module, table: dict[str, object]):
    """`model`'s forward takes `table`'s values back for their names while in the block."""
    if not table:
        yield
        return
    original = model.forward
    own = "forward" in vars(model)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        args, kwargs = pytree.tree_map_only(str, lambda leaf: table.get(leaf, leaf), (args, kwargs))
        return original(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        if own:
            model.forward = original
        else:
            del model.forward
