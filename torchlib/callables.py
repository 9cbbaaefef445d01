"""Functions a model's modules hold, described so that a swap can be told apart.

A module that keeps a function in an attribute (`self.act = F.gelu`, a `forward`
assigned to an instance, a class whose `forward` was patched) computes what that
function computed when the model was traced: the graph holds its ops. Swapped after
lowering (`model.act = F.silu`), the graph silently ran the old one (a loss 0.135
against eager's 0.156). The frontend records each such function read while tracing by
`describe` (a string, so that the graph's metadata stays JSON and a graph loaded in
another process is checked alike); the runtime describes what the module holds at every
call and compares.

The description names the function (module, qualified name, where its code starts) and
the plain values its closure captured or a `functools.partial` binds, so that a lambda
re-made with another constant reads as another function. A bound method is its function.
"""

from __future__ import annotations

import functools
import hashlib
import types

#: The longest `repr` of a bound argument or captured value kept in a description.
_SHOWN = 80


def is_function(value) -> bool:
    """A function-like value a module may hold in place of a submodule."""
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                              types.BuiltinMethodType, functools.partial))


def describe(value) -> str:
    """`value` (a function-like object) as a string that changes when it does."""
    if isinstance(value, functools.partial):
        return (f"partial({describe(value.func)}, {_short(value.args)}, "
                f"{_short(sorted(value.keywords.items()))})")
    if isinstance(value, types.MethodType):
        # Not the class of what it is bound to: FSDP2's `fully_shard` gives each unit a
        # class of its own (FSDPLinear), whose forward is the same function.
        return describe(value.__func__)
    name = f"{getattr(value, '__module__', None) or ''}.{getattr(value, '__qualname__', None) or getattr(value, '__name__', '?')}"
    code = getattr(value, "__code__", None)
    if code is None:
        return name
    captured = [cell.cell_contents for cell in (value.__closure__ or ())
                if filled(cell) and (isinstance(cell.cell_contents, _PLAIN) or _plain_container(cell.cell_contents))]
    text = repr(captured)
    if len(text) > _SHOWN:   # whole, so that a change past what is shown tells
        text = f"{text[:_SHOWN - 30]}... (sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]})"
    return f"{name} at {code.co_filename}:{code.co_firstlineno}" + (f" with {text}" if captured else "")


_PLAIN = (bool, int, float, str, type(None))


def _plain_container(value) -> bool:
    """A list, tuple, dict or set of plain values (a closure's `cfg = {"scale": 1.0}`):
    its repr names it in every process, and one changed in place computes otherwise."""
    if type(value) not in (list, tuple, dict, set) or len(value) > 64:
        return False
    items = [*value.keys(), *value.values()] if type(value) is dict else value
    return all(isinstance(item, _PLAIN) for item in items)


def filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # an empty cell
        return False
    return True


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def attribute_at(owner, dotted: str, missing=None):
    """`owner.a.b` for the dotted name 'a.b' (an object a module holds, or one that object
    holds: `frontends/traced_reads.py` records a config's sub-config so), `missing` where a
    step of it is not there."""
    for name in dotted.split("."):
        owner = getattr(owner, name, missing)
        if owner is missing:
            return missing
    return owner
