"""Non-reentrant `torch.utils.checkpoint` blocks, traced as plain calls of the block.

A checkpoint trades memory for time and changes no value: eager's backward computes the
block again, with the generator as the forward left it (`preserve_rng_state=True`), to
the forward's values, which remat-ir's plans recompute or keep as they choose. Traced
through torch's own machinery (saved-tensor hooks that drop and recompute), a checkpoint
nested in another lost its gradients: a model whose only path ran through it was refused
as computing no gradient, and beside another path its parameters trained without them,
silently (found by a review). So while tracing, `_checkpoint_without_reentrant_generator`,
which `checkpoint` looks up at each call (models holding their own reference to
`checkpoint`, transformers' `_gradient_checkpointing_func`, are seen too), runs the block
as it is, under the forward context of a `context_fn`, unless that is a TorchDispatchMode:
selective checkpointing's policy, which decides what is kept, not what is computed.

Five kinds of block compute otherwise in eager's backward, and are refused naming the
line of the checkpoint, with what to do (the ops are seen at the fake tensors' dispatch,
`fake_dispatch`):
- `preserve_rng_state=False` around random draws: eager recomputes the block with other
  draws than its forward made, so its gradients are not of the loss it returned and the
  generator advances during the backward; the trace holds the forward's draws (a review
  found remat-ir trained with the forward's mask, a gradient 3.3e-2 off, the generator
  elsewhere). A block that draws nothing computes the same either way and is traced.
- A write into a tensor the block did not make: a BatchNorm's running statistics, a
  buffer counted up, an input changed in place. Eager's backward writes it a second time
  (a BatchNorm's statistics updated twice per step), where the graph writes once: after
  one step the running mean was 0.044 off eager's, without a word (found by a review).
- A block reading a tensor that the forward writes after it (a step counter in a buffer
  scaling the block): eager's backward computes the block again from the written values,
  the graph from those the forward read (a gradient 1.40 off eager's, silently: found by a
  review). Refused at the end of lowering, naming the block.
- A block drawing from Python's random generator (LayerDrop at 0.0 draws and compares):
  eager's backward draws again, the checkpoint restoring torch's generator only, so every
  Python draw after the step differed from eager's (found by a review). So does a custom
  op whose kernel draws from Python's or NumPy's generator when run once (its kernel does
  not run while tracing; `random_ops.custom_op_trial`), and one drawing from torch's under
  `preserve_rng_state=False` counts as a draw (hunt65: eager runs the op twice a step, a
  remat-ir step once, 1.7e-2 and 6.4e-3 off, silently).
- A block whose function reads a variable the forward binds again after the call: a
  `lambda t: blk(t)` in a loop over blocks sees the loop variable's last value when eager's
  backward calls it again, so every block was recomputed with the last one's weights (the
  gradients 3.1 off those of the loss eager returned, with no error in eager either: found
  by a review). Refused at the end of lowering, naming the variable.
"""

from __future__ import annotations

import contextlib
import functools
import random
import traceback
import types
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint as checkpointing
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from remat_ir.torchlib.callables import HELD_ITEMS, attributes_of, subscripts

from .errors import LoweringError
from .fake_dispatch import wrapped_fake_dispatch
from .fx_nodes import written_values
from .model_lines import is_users_file, model_line
from .random_ops import custom_op_trial, opaque_custom_op

#: What to do instead of a checkpoint that eager's backward computes otherwise.
_INSTEAD = ("remove the checkpoint (Hugging Face: skip gradient_checkpointing_enable()): "
            "remat-ir plans recomputation itself")


@dataclass
class _Block:
    """A checkpointed block being traced: where its checkpoint is, whether it preserves
    the generator's state, what it drew, the storages of what it made, what it wrote."""
    line: str | None
    preserving: bool
    drawn: list[str] = field(default_factory=list)
    made: set = field(default_factory=set)
    written: list[str] = field(default_factory=list)
    #: The tensors it read and did not make (held, so that no storage is freed and its
    #: address taken by another while tracing), and their storages.
    read: list = field(default_factory=list)
    read_storages: set = field(default_factory=set)
    drawn_in_python: bool = False
    #: Custom ops it called whose kernel drew from Python's or NumPy's generator, or changed
    #: the user's state, when run once, with what (`random_ops.custom_op_trial`).
    drawn_outside: dict = field(default_factory=dict)
    #: What the function reads that the forward may bind again, with what each held at
    #: the call (`_reached`).
    reached: list = field(default_factory=list)

    def rebound(self) -> str | None:
        """The refusal of a block whose function reads something that now holds another
        value than at the call (module docstring), or None."""
        for label, read, value in self.reached:
            try:
                now = read()
            except Exception:   # noqa: BLE001 - emptied (`del`, an item removed): another value
                now = _GONE
            if _same_for_the_block(now, value):
                continue
            bind = (f"`lambda t, {label}={label}: ...`, or functools.partial" if label.isidentifier()
                    else "a default argument or functools.partial holding the value itself, not a "
                         "container or a function the forward changes afterwards")
            return (f"torch.utils.checkpoint at {self.line or 'a line of the model'} calls a function "
                    f"reading `{label}`, which the forward binds again after the call to another value "
                    f"(a lambda or inner function in a loop sees the loop variable's last value): "
                    f"eager's backward calls it again with `{label}`'s new value, so it may compute "
                    f"another block than the forward did, and its gradients not of the loss it "
                    f"returned, where a remat-ir step computes the forward's. Bind the value at the "
                    f"call ({bind}), or {_INSTEAD}")
        return None

    def refusal(self) -> str | None:
        where = self.line or "a line of the model"
        if self.drawn_in_python:
            return (f"torch.utils.checkpoint at {where} around a block drawing from Python's random "
                    f"generator (LayerDrop's `random.random()`): eager's backward runs the block again "
                    f"and draws again (a checkpoint restores torch's generator only), so Python's "
                    f"generator ends every step elsewhere than a remat-ir step leaves it. Draw before "
                    f"the block and pass the number in, or {_INSTEAD}")
        if self.drawn_outside:
            op, generators = next(iter(self.drawn_outside.items()))
            return (f"torch.utils.checkpoint at {where} around a block calling custom op {op}, whose "
                    f"kernel draws from or changes {', '.join(generators)}: eager's backward runs the "
                    f"block again and the op draws again (a checkpoint restores torch's generator only), "
                    f"so eager's gradients follow the second draw and the generator ends every step "
                    f"elsewhere than a remat-ir step, which runs the op once, leaves it. Draw with "
                    f"torch's random ops instead, or {_INSTEAD}")
        if self.drawn and not self.preserving:
            return (f"torch.utils.checkpoint with preserve_rng_state=False at {where} around random "
                    f"draws ({', '.join(sorted(set(self.drawn)))}): eager's backward computes that "
                    f"block again with other draws than its forward made, so its gradients are not "
                    f"of the loss it returned, and a remat-ir step reads the forward's draws. Pass "
                    f"preserve_rng_state=True (the default), or {_INSTEAD}, with eager's draws")
        if self.written:
            return (f"torch.utils.checkpoint at {where} around a block that writes into a tensor it "
                    f"did not make ({', '.join(dict.fromkeys(self.written))}; a BatchNorm's running "
                    f"statistics, a buffer, an input): eager's backward runs that block again and "
                    f"writes it a second time, where a remat-ir step writes it once. Move the write "
                    f"out of the checkpointed block, or {_INSTEAD}")
        return None


def _same_for_the_block(now, then) -> bool:
    """Whether a checkpointed function's free variable, bound to `then` at the call and
    to `now` after the forward, computes the same block: the same object, an equal value
    (`shape = h.shape`, a device, a config dict rebuilt), or a tensor of the same shape,
    dtype and device (a mask rebuilt at each iteration: its values are not known while
    tracing). hunt65: equal values rebound were refused, which trained like eager."""
    if now is then:
        return True
    if isinstance(now, torch.Tensor) and isinstance(then, torch.Tensor):
        return (now.shape, now.dtype, now.device) == (then.shape, then.dtype, then.device)
    if type(now) is not type(then) or isinstance(now, (torch.nn.Module, types.FunctionType)):
        return False
    try:
        return (now == then) is True
    except Exception:   # noqa: BLE001 - a comparison that cannot tell: another value
        return False


#: What `_reached` follows: levels below the checkpointed function, and entries in all.
_REACH_DEPTH = 4
_REACH_ENTRIES = 512
_GONE = object()


def _reached(fn) -> list:
    """What `fn` reads that the forward may bind again before eager's backward calls it
    again, as (label, how to read it now, what it held at the call): the free variables,
    defaults and globals its code names, a partial's function and arguments, the items of
    the lists, tuples and dicts these hold, and the attributes the code names on the
    objects they hold, followed into the user's functions among them (`_REACH_DEPTH`
    levels; a library's function, torch's `checkpoint` held in a global, is its own).
    hunt65: only the function's own cells were compared, and `holder[0] = blk` read by a
    lambda, a partial's argument closing over `blk`, or a default argument wrapping such a
    closure each recomputed every block with the last one in eager (9.4e-3 off), silently."""
    found: list = []
    seen: set[int] = set()

    def visit(label: str, read, value, depth: int, names: tuple = (), keys: frozenset | None = None) -> None:
        """`keys`: the constant subscripts the code reads `value` by (`subscripts`), None
        for any item; `names`: the attribute names the code reading it looks up."""
        if len(found) >= _REACH_ENTRIES:
            return
        found.append((label, read, value))
        if depth == 0 or id(value) in seen or isinstance(value, (torch.Tensor, types.ModuleType)):
            return
        seen.add(id(value))
        if isinstance(value, functools.partial):
            inner = getattr(value.func, "__code__", None)
            held = inner.co_names if inner is not None else names
            visit(f"{label}.func", functools.partial(getattr, value, "func"), value.func, depth - 1)
            for i, arg in enumerate(value.args):
                visit(f"{label}'s argument {i}", functools.partial(_item, value.args, i), arg, depth - 1, held)
            for key, arg in value.keywords.items():
                visit(f"{label}'s argument {key}", functools.partial(_item, value.keywords, key), arg,
                      depth - 1, held)
        elif isinstance(value, (types.FunctionType, types.MethodType)):
            function(value, label, depth)
        elif type(value) in (list, tuple, dict):   # builtin ones: a subclass's items may be made at each read
            if keys is None:
                keys = list(value)[:HELD_ITEMS] if type(value) is dict else range(min(len(value), HELD_ITEMS))
            for key in keys:   # `holder[-1]` read as the last item of a list the loop appends to
                try:
                    item = value[key]
                except (KeyError, IndexError, TypeError):
                    continue
                visit(f"{label}[{key!r}]", functools.partial(_item, value, key), item, depth - 1, names)
        else:
            call = getattr(type(value), "__call__", None)
            if isinstance(call, types.FunctionType) and not isinstance(value, (type, torch.nn.Module)):
                names = (*names, *call.__code__.co_names)   # a callable object: what its `__call__` reads
                function(call, f"{label}.__call__", depth)
            table = _attributes(value)
            for name in names:
                if name in table:
                    visit(f"{label}.{name}", functools.partial(_attribute, value, name), table[name],
                          depth - 1, names)

    def function(fn, label: str | None, depth: int) -> None:
        if isinstance(fn, types.MethodType):
            visit(f"{label}.__self__" if label else "self", functools.partial(getattr, fn, "__self__"),
                  fn.__self__, depth - 1, fn.__func__.__code__.co_names)
            fn = fn.__func__
        code = fn.__code__
        if not is_users_file(code.co_filename):   # a library's function (torch's `checkpoint`)
            return
        names = code.co_names
        prefix = f"{label} → " if label else ""
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                held = cell.cell_contents
            except ValueError:   # not yet bound
                continue
            visit(prefix + name, functools.partial(getattr, cell, "cell_contents"), held, depth - 1, names,
                  subscripts(code, name))
        for i, default in enumerate(fn.__defaults__ or ()):
            name = code.co_varnames[code.co_argcount - len(fn.__defaults__) + i]
            visit(prefix + name, functools.partial(_item, fn, i, "__defaults__"), default, depth - 1, names,
                  subscripts(code, name))
        for key, default in (fn.__kwdefaults__ or {}).items():
            visit(prefix + key, functools.partial(_item, fn, key, "__kwdefaults__"), default, depth - 1, names,
                  subscripts(code, key))
        module_globals = fn.__globals__
        for name in names:   # a class's attributes too (`Holder.blk = blk`), by the names read
            if name in module_globals and not isinstance(module_globals[name], types.ModuleType):
                visit(prefix + name, functools.partial(_item, module_globals, name), module_globals[name],
                      depth - 1, names, subscripts(code, name))

    while isinstance(fn, functools.partial):   # the partial itself is the caller's, not rebound
        inner = getattr(fn.func, "__code__", None)
        held = inner.co_names if inner is not None else ()
        for i, arg in enumerate(fn.args):
            visit(f"the partial's argument {i}", functools.partial(_item, fn.args, i), arg, _REACH_DEPTH, held)
        for key, arg in fn.keywords.items():
            visit(key, functools.partial(_item, fn.keywords, key), arg, _REACH_DEPTH, held)
        fn = fn.func
    if isinstance(fn, (types.FunctionType, types.MethodType)):
        function(fn, None, _REACH_DEPTH + 1)
    elif isinstance(getattr(type(fn), "__call__", None), types.FunctionType) \
            and not isinstance(fn, torch.nn.Module):   # a callable object: its `__call__` bound to it
        visit("the called object", lambda: fn, fn, _REACH_DEPTH + 1)
    return found


def _item(container, key, attribute: str | None = None):
    """`container[key]`, or `container.<attribute>[key]` (a function's defaults, read now)."""
    if attribute is not None:
        container = getattr(container, attribute) or {}
    return container[key]


def _attribute(value, name: str):
    """`value`'s own attribute `name`, as `_attributes` finds it (a class's staticmethod as
    it is held, not what looking it up makes)."""
    return _attributes(value)[name]


def _attributes(value) -> dict:
    """An object's attributes by name, as held (a module's submodules, parameters and
    buffers too; a plain object's class attributes under its own: `Runner.blk = blk` read
    as `self.blk`, hunt67), without running properties or `__getattr__`."""
    table = {}
    if not isinstance(value, (type, torch.nn.Module)):
        for klass in reversed(type(value).__mro__):
            if klass.__module__ != "builtins":
                table.update(vars(klass))
    table.update(attributes_of(value))
    if isinstance(value, torch.nn.Module):
        for name in ("_modules", "_parameters", "_buffers"):
            table.update(table.get(name, {}))
    return table


def _storages(value) -> set:
    return {StorageWeakRef(leaf.untyped_storage()) for leaf in pytree.tree_leaves(value)
            if isinstance(leaf, torch.Tensor)}


@contextlib.contextmanager
def checkpoints_traced_plain(lines: list | None = None):
    """Within: non-reentrant checkpointed blocks run as plain calls, and those eager's
    backward computes otherwise are refused (module docstring). The line of each block
    traced goes into `lines`, once (a fraction budget is then a share of a peak above
    eager's, which the facade says)."""
    original = checkpointing._checkpoint_without_reentrant_generator
    blocks: list[_Block] = []   # entered and not left, innermost last
    closed: list[_Block] = []   # left
    late: list[str] = []        # refusals of writes after a block into what it read

    def generator(fn, preserve_rng_state=True, context_fn=checkpointing.noop_context_fn, *args, **kwargs):
        forward_context, _ = context_fn()
        if isinstance(forward_context, TorchDispatchMode):
            forward_context = contextlib.nullcontext()
        block = _Block(model_line(traceback.extract_stack()), preserve_rng_state, reached=_reached(fn))
        return plain(block, forward_context)

    def plain(block, forward_context):
        blocks.append(block)
        python = random.getstate()
        try:
            with forward_context:
                yield     # the block runs
        finally:
            blocks.pop()
        if random.getstate() != python:
            block.drawn_in_python = True
        for outer in blocks:   # what an inner block made, its outer blocks made
            outer.made |= block.made
        refusal = block.refusal()
        if refusal:
            raise LoweringError(refusal)
        closed.append(block)
        if lines is not None and block.line not in lines:
            lines.append(block.line)

    def wrap(dispatch):
        def seen(mode, func, types, args=(), kwargs=None):
            if not blocks and not closed:
                return dispatch(mode, func, types, args, kwargs)
            op = isinstance(func, torch._ops.OpOverload)
            written = {StorageWeakRef(value.untyped_storage())
                       for value in (written_values(func, args, kwargs or {}) if op else ())
                       if isinstance(value, torch.Tensor)}
            for block in closed:
                if written & block.read_storages and not late:
                    late.append(
                        f"torch.utils.checkpoint at {block.line or 'a line of the model'} around a block "
                        f"reading a tensor that the forward writes after it "
                        f"({func.overloadpacket.__name__}; a buffer counted up, an input changed in "
                        f"place): eager's backward computes that block again from the written values, "
                        f"where a remat-ir step computes from those the block read. Write into a copy "
                        f"after the block, or {_INSTEAD}")
            if not blocks:
                return dispatch(mode, func, types, args, kwargs)
            block = blocks[-1]
            if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                block.drawn.append(str(func.overloadpacket.__name__))
            elif op and opaque_custom_op(func):   # hunt65: eager's recomputation ran it twice
                trial = custom_op_trial(func, (args, kwargs or {}))
                if trial.torch and not trial.raised:   # hunt67: one raising on placeholders is no draw
                    block.drawn.append(str(func._schema.name))
                if trial.outside or trial.own:   # hunt67: its own generator, 0.08 off
                    block.drawn_outside[str(func._schema.name)] = (
                        *(f"{generator} generator" for generator in trial.outside), *trial.own)
            if written - block.made:
                block.written.append(str(func.overloadpacket.__name__))
            for value in pytree.tree_leaves((args, kwargs)):
                if isinstance(value, torch.Tensor) and (storage := StorageWeakRef(value.untyped_storage())) \
                        not in block.made and storage not in block.read_storages:
                    block.read.append(value)
                    block.read_storages.add(storage)
            result = dispatch(mode, func, types, args, kwargs)
            if not (op and any(r.alias_info is not None for r in func._schema.returns)):
                block.made |= _storages(result)   # a view shares the storage of what it views
            return result
        return seen

    checkpointing._checkpoint_without_reentrant_generator = generator
    try:
        with wrapped_fake_dispatch(wrap):
            yield
    except Exception:
        if late:   # AOTAutograd's refusal of the same write ("modified by an inplace operation")
            raise LoweringError(late[0]) from None
        raise
    finally:
        checkpointing._checkpoint_without_reentrant_generator = original
    if late:
        raise LoweringError(late[0])
    for block in closed:
        if refusal := block.rebound():
            raise LoweringError(refusal)
