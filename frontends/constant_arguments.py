"""Forward arguments torch.export takes no constant of, handed to it as names.

torch.export takes a tensor, int, float, bool, str or None as an argument leaf and refuses
any other value: a NumPy scalar (`np.float32(0.5)`, `np.int64(3)`, what a data pipeline
built with NumPy hands over) or a `torch.dtype` (`model(x, dtype=torch.bfloat16)`) was
refused with its words, "data-dependent control flow or an unsupported construct"
(hunt80 F7), where eager trains. Such a value is immutable, and its repr names it whole
(`np.float32(0.5)`, `torch.bfloat16`), so it is a constant of the trace as a float is: the
call's signature (`runtimes/signatures.py`, the leaf's repr) is lowered again for another.

torch.export is handed a name in its place (a str, one leaf as the value was, so every
input keeps its position), and a forward pre-hook of the model's, run before its others
while export runs, takes the value back: the model's hooks and code see the value.
AOTAutograd traces the exported graph with the same names. Complex numbers, slices of
integers (Python's or NumPy's), ranges and `...` are taken so too.

Any other argument no trace can take (a module, a function, a `torch.Size`, an object
of a class pytree does not know) is refused before tracing, by its argument's name, with what to do
(`refuse_untakable_arguments`).
"""
from __future__ import annotations

import contextlib
import enum
import sys

import torch
from torch.utils import _pytree as pytree

from remat_ir.torchlib.types import argument_name

from .errors import LoweringError

#: Immutable values a forward may take as arguments whose repr names them whole:
#: torch's own value types, complex numbers.
_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format, complex)


def _held_constant(leaf) -> bool:
    numpy = sys.modules.get("numpy")
    integers = (int, type(None), *((numpy.integer,) if numpy is not None else ()))
    ends = (leaf.start, leaf.stop, leaf.step) if isinstance(leaf, slice) else ()
    # A slice's ends may be NumPy integers (bounds from a NumPy pipeline: hunt85 F7); a
    # range holds ints alone.
    return isinstance(leaf, (*_VALUES, range, type(Ellipsis))) or (
        numpy is not None and isinstance(leaf, numpy.generic)) or (
        isinstance(leaf, slice) and all(isinstance(end, integers) for end in ends))


#: Leaves a forward's arguments may hold as they are: torch.export takes them.
_TAKEN = (bool, int, float, str, type(None), enum.Enum)


def refuse_untakable_arguments(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """LoweringError naming the first argument no trace can take: a module (torch.export
    takes it as a constant, and AOTAutograd failed in its words, "all flat_args must be
    KNOWN_TYPES", no argument named: hunt84 F1, a teacher passed to a student's forward),
    a function, or any other value torch.export refuses ("Unsupported input type", said
    as data-dependent control flow)."""
    with_paths, _ = pytree.tree_flatten_with_path((args, kwargs), is_leaf=lambda node: isinstance(node, torch.Size))
    for path, leaf in with_paths:
        if isinstance(leaf, (torch.Tensor, *_TAKEN)) or _held_constant(leaf) or isinstance(leaf, torch.ScriptObject):
            continue
        said = f"{type(model).__name__}'s forward is passed argument {argument_name(path)!r}"
        if isinstance(leaf, torch.Size):
            # torch.export's input spec holds a tuple in its place, and every call was then
            # taken for another signature and failed planning again (hunt85 F7).
            raise LoweringError(
                f"{said}, a torch.Size, which the trace takes as a tuple (torch's pytree), so that no call would "
                f"match the lowered one: pass `tuple(size)` (or the sizes as separate integers)")
        if isinstance(leaf, torch.nn.Module):
            own = path[1].key if path[0].idx == 1 and str(path[1].key).isidentifier() else "module"
            raise LoweringError(
                f"{said}, a module ({type(leaf).__name__}), which remat-ir cannot take as an input (a trace "
                f"takes tensors and plain values): hold it as a submodule of the model (`self.{own} = "
                f"{own}` in `__init__`, frozen with `requires_grad_(False)` if it is not trained), or call "
                f"it outside the forward and pass what it returns")
        if callable(leaf) and not isinstance(leaf, type):
            raise LoweringError(
                f"{said}, a function ({getattr(leaf, '__qualname__', type(leaf).__name__)}), which remat-ir "
                f"cannot take as an input (a trace takes tensors and plain values): hold it as an attribute "
                f"of the model (remat-ir compares the functions a model holds at every call), or call it "
                f"outside the forward and pass what it returns")
        raise LoweringError(
            f"{said}, a {type(leaf).__module__}.{type(leaf).__qualname__}, which torch.export cannot take "
            f"as an input: pass its tensors and plain values (numbers, strings, dtypes) instead, or "
            f"register its class with torch.utils._pytree (`torch.export.register_dataclass` for a "
            f"dataclass), whose fields are then the inputs")


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
    """`model`'s call takes `table`'s values back for their names while in the block: a
    forward pre-hook run before the others, whose arguments the others, the forward and
    the forward hooks are handed (a hook branching on the name had its branch baked in:
    hunt85 F2)."""
    if not table:
        yield
        return

    def values_back(module, args, kwargs):
        return pytree.tree_map_only(str, lambda leaf: table.get(leaf, leaf), (args, kwargs))

    handle = model.register_forward_pre_hook(values_back, prepend=True, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
