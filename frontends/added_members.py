"""The model's submodules, parameters and buffers as they were, after a trace that failed.

A forward that makes a submodule, parameter or buffer for an input it has not met
(`self.proj[str(width)] = nn.Linear(width, 8)`, `register_buffer(f"mask{T}", ...)`) makes it
while traced on fake tensors. Where lowering then refused the call (a new signature mid
training, or `remat` itself), the new member stayed in the user's model with FakeTensor
weights: a plain call of the model returned a FakeTensor, `torch.save(model.state_dict())`
raised, and the next call of that shape failed deep inside torch (hunt80 F3). Module
attributes the trace assigned are put back by name (`frontends/torch.py` `_put_back`); the
tables `add_module`, `register_parameter` and `register_buffer` write are not attributes,
so `members_kept` keeps a copy of each module's tables and puts them back when the trace
raises. A trace that made a new member and went through (a parameter registered for a
width: the graph took the fake one as a weight, and the next call met it in the model)
is refused, naming the member: eager's first call at that shape makes it for real.
"""

from __future__ import annotations

import contextlib
import traceback

import torch

from .errors import LoweringError
from .model_lines import model_line, passing

_KINDS = ("submodule", "parameter", "buffer")


def _tables(module: torch.nn.Module) -> tuple:
    return module._modules, module._parameters, module._buffers, module._non_persistent_buffers_set


@contextlib.contextmanager
def _lines_noted(lines: dict):
    """Within: the model's line that gives a module a submodule or parameter it did not
    hold (assigned, `add_module`, `register_parameter`, a ModuleDict's item) goes into
    `lines`, (module id, name) -> 'file:line in function': the refusal names where (a
    review, hunt82: it named the member alone)."""
    setattr_, add_module, register_parameter = (torch.nn.Module.__setattr__, torch.nn.Module.add_module,
                                                torch.nn.Module.register_parameter)

    def note(module, name, value):
        if isinstance(value, (torch.nn.Module, torch.nn.Parameter)) and (id(module), name) not in lines \
                and name not in module.__dict__.get("_modules", {}) \
                and name not in module.__dict__.get("_parameters", {}):
            lines[id(module), name] = model_line(traceback.extract_stack()[:-2])

    @passing
    def noting_setattr(module, name, value):
        note(module, name, value)
        setattr_(module, name, value)

    @passing
    def noting_add_module(module, name, value):
        note(module, name, value)
        return add_module(module, name, value)

    @passing
    def noting_register_parameter(module, name, value):
        note(module, name, value)
        return register_parameter(module, name, value)

    torch.nn.Module.__setattr__, torch.nn.Module.add_module, torch.nn.Module.register_parameter = (
        noting_setattr, noting_add_module, noting_register_parameter)
    try:
        yield
    finally:
        torch.nn.Module.__setattr__, torch.nn.Module.add_module, torch.nn.Module.register_parameter = (
            setattr_, add_module, register_parameter)


@contextlib.contextmanager
def members_kept(model: torch.nn.Module):
    """Within: where the block raises, every module of `model` gets back the submodules,
    parameters and buffers it held before; where it made a new one, they are put back and
    the block refused with `LoweringError` saying so, where, also in place of a refusal of
    what making it did (a new Linear's `__init__` assigning `in_features` was named instead)."""
    paths = {id(module): path for path, module in model.named_modules()}
    before = [(module, [table.copy() for table in _tables(module)]) for module in model.modules()
              if all(isinstance(table, (dict, set)) for table in _tables(module))]   # not TorchScript's
    lines: dict = {}
    try:
        with _lines_noted(lines):
            yield
    except LoweringError as refused:
        error = _made(model, before, paths, lines)
        _put_back(before)
        if error is None or any(repr(name) in str(refused) for name in error.names):
            raise   # a refusal naming the member already says it (a buffer registered, by line)
        raise error from None
    except BaseException:
        _put_back(before)
        raise
    if (error := _made(model, before, paths, lines)) is not None:
        _put_back(before)
        raise error


def _made(model: torch.nn.Module, before: list, paths: dict, lines: dict) -> LoweringError | None:
    """The refusal of the members the block made, if it made any."""
    # A buffer registered is refused by line where it is traced (`trace_effects`), later.
    made = [(kind, paths[id(module)], name, lines.get((id(module), name))) for module, copies in before
            for kind, table, copy in zip(_KINDS, _tables(module), copies) for name in table
            if name not in copy and kind != "buffer"]
    if not made:
        return None
    added = [f"{kind} {'.'.join(filter(None, (path, name)))!r}" + (f" at {line}" if line else "")
             for kind, path, name, line in made]
    error = LoweringError(
        f"{type(model).__name__}'s forward makes {', '.join(added)} while traced: a member made "
        f"in the forward is made on tracing's fake tensors, which no step can hold. Call the "
        f"model once with inputs of this shape before remat-ir lowers it (its first call makes "
        f"the member, as eager's does), or make the member in __init__")
    error.names = [name for _, _, name, _ in made]
    return error


def _put_back(before: list) -> None:
    for module, copies in before:
        for table, copy in zip(_tables(module), copies):
            if table != copy if isinstance(table, set) else _differ(table, copy):
                table.clear()
                table.update(copy)


def _differ(table: dict, copy: dict) -> bool:
    """Whether `table` holds other keys or other objects than `copy` (by identity:
    tensors do not compare as truth values)."""
    return table.keys() != copy.keys() or any(table[key] is not copy[key] for key in table)
