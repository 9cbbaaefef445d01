"""Tensors a model keeps outside its parameters and buffers, traced as constants.

A module may keep a tensor as a plain attribute (`self.scale = torch.tensor(2.0)`,
without `register_buffer`) or inside a dict or list attribute (peft's prompt tuning keeps
its virtual tokens' ids in `prompt_tokens['default']`, FourierFT its frequency indices).
Eager reads them as they are at each call. torch.export lifts them as constant tensors,
but hands them to AOTAutograd as real tensors, which refused them ("convert all Tensors
to FakeTensors"), so such models were refused.

Here each one is traced as a constant (a `lift_fresh_copy` of it, as torch.export does for
a tensor built inside forward), and its place and the digest of its bytes go into the
graph's metadata. The runtime compares the tensor there with the digest before a call
(`runtimes/traced_reads.py`), so a call after it changed (a mask filled anew, another
tensor assigned) is planned again for it (`remat`'s planner) or refused, instead of
training with the old values. A tensor found unchanged is hashed again only once its
version counter moves (every in-place op bumps it; a write through `.data` or a NumPy
view does not: on the CPU such a write is seen by hashing a small tensor at every call
and comparing one of up to 16 MiB with a copy). A held tensor that requires a gradient
is refused: eager would give it one, a constant cannot. Held tensors are found as
attributes and in containers up to three deep (`{"scale": [t]}`).

The same holds for tensors held elsewhere that torch.export takes as constants: a class
attribute (`calls = torch.zeros(())` in the class body, read as `self.calls`), and a
global or a global class's attribute the model's code reads (`frontends/traced_reads.py`
finds them: metadata `torch.global_tensors`). Before, a global was refused (AOTAutograd:
"convert all Tensors to FakeTensors"), but for a 0-dimensional one, which tracing passed
for a constant: read as a factor and changed since, the step trained with the old value,
silently (2026-11-30). A constant the model's
forward did not make and that is found nowhere (a closure's, a default argument's) is
refused, and so is a forward writing into one (a step counter), which AOTAutograd
refused from inside ("expected to have an entirely functional graph").
"""

from __future__ import annotations

import types

import torch

from remat_ir.torchlib.held_tensors import Place, digest, shown, shown_global
from remat_ir.torchlib.hook_reparametrizations import hook_reparametrizations, kind
from remat_ir.torchlib.hooks import hook_functions

from .errors import LoweringError
from .fx_nodes import first_write, region_placeholder
from .model_lines import node_line

#: nn.Module's own bookkeeping in a module's `__dict__`, which holds no tensor of the model's.
_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules"})


#: What is no plain object holding state of its own: submodules (found as modules),
#: classes, functions and Python modules.
_NOT_HOLDERS = (torch.nn.Module, type, types.FunctionType, types.MethodType, types.ModuleType)


def held_objects(module: torch.nn.Module) -> list[tuple[str, object]]:
    """(attribute, object) of the plain objects `module` holds as attributes: helpers with
    attributes of their own, such as diffusers' Z-Image's `RopeEmbedder`, which caches its
    rotary tables at its first call."""
    return [(name, value) for name, value in vars(module).items()
            if name not in _MODULE_STATE and hasattr(value, "__dict__")
            and not isinstance(value, (torch.Tensor, *_NOT_HOLDERS))]


def held_tensors(model: torch.nn.Module) -> dict[int, Place]:
    """id(tensor) -> (module path, attribute, key or None) of every tensor the model's
    modules hold as a plain attribute, or as an item of a dict, list or tuple attribute,
    directly or as an attribute of a plain object they hold (the attribute then dotted)."""
    found: dict[int, Place] = {}
    for tensor, place in held_tensor_items(model):
        found.setdefault(id(tensor), place)
    return found


def held_tensor_items(model: torch.nn.Module):
    """(tensor, place) of each tensor `held_tensors` finds, the first place first."""
    for path, module in model.named_modules():
        yield from _attribute_tensors(path, module)
        for klass in type(module).__mro__:   # class attributes, read through `self`
            for name, value in vars(klass).items():
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                        and name not in vars(module):
                    yield value, (path, name, None)


def _held_with_gradient(model: str, where: str) -> LoweringError:
    return LoweringError(
        f"{model} keeps a tensor that requires a gradient at {where}, which is neither a "
        f"parameter nor a buffer: eager gives it a gradient, and remat-ir's graph would hold "
        f"it as a constant. Make it an nn.Parameter (or detach it, if it should not train; a "
        f"torch.distributions object built from parameters in __init__ holds such views: "
        f"build it in the forward); a weight another network computes (a hypernetwork's): "
        f"leave the parameter in place and pass the computed one at each call, "
        f"`torch.func.functional_call(scheduled, {{'fc.weight': w}}, (x,))`, which trains like eager")


def held_gradient_error(model: torch.nn.Module) -> LoweringError | None:
    """The error for a tensor with autograd history the model's modules hold (a view of a
    parameter: `self.wx = self.w.expand(4, 8)`, a prior `Normal(loc, scale)` made in
    `__init__`, whose `broadcast_all` keeps such views), for a forward on which
    torch.export failed an assertion of its own ("False != True"), which was said as
    another path under tracing, with advice about attention masks (found by a review).
    None where it holds none."""
    # Views of a parameter alone: another tensor with history the forward may not read (a
    # norm kept from `__init__`) was blamed for an unrelated assertion (found by a review);
    # a tensor that is not a view export takes, and `lift_held_tensors` names it if read.
    parameters = {id(p) for p in model.parameters()}
    for path, module in model.named_modules():
        for tensor, place in _attribute_tensors(path, module):
            if tensor.requires_grad and tensor._base is not None and id(tensor._base) in parameters:
                return _held_with_gradient(type(model).__name__, shown(*place))
    # A computed tensor in place of a weight its layer's forward reads (a hypernetwork's
    # output: `del fc.weight; fc.weight = hyper(z).view(4, 8)`; hunt66: torch.export's
    # "False != True" from deep inside, naming nothing).
    for path, module in model.named_modules():
        forward = getattr(type(module), "forward", None)
        read = forward.__code__.co_names if isinstance(forward, types.FunctionType) else ()
        for tensor, place in _attribute_tensors(path, module):
            if tensor.requires_grad and tensor.grad_fn is not None and place[2] is None and place[1] in read:
                return _held_with_gradient(type(model).__name__, shown(*place))
    return None


def _attribute_tensors(path: str, module: torch.nn.Module):
    """(tensor, place) of the tensors `module` holds as plain attributes, items of dicts,
    lists or tuples, or attributes of the plain objects it holds."""
    yield from _held_in(path, "", vars(module))
    for name, helper in held_objects(module):
        yield from _held_in(path, f"{name}.", vars(helper))


#: How many containers deep `_held_in` finds tensors (`{"a": [t]}`: 2).
_CONTAINERS_DEEP = 3


def _held_in(path: str, prefix: str, attributes: dict):
    """(tensor, place) over one object's attributes (a module's or a plain object's): a
    tensor there, or in the dicts, lists and tuples there, `_CONTAINERS_DEEP` deep (the
    place's key a path of keys past the first level; hunt66: `{"a": [t]}` was refused
    as a tensor the model does not hold)."""
    for name, value in attributes.items():
        if name in _MODULE_STATE or not isinstance(name, str):
            continue
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            yield value, (path, prefix + name, None)
        elif isinstance(value, (dict, list, tuple)):
            for keys, item in _contained(value, ()):
                yield item, (path, prefix + name, keys[0] if len(keys) == 1 else keys)


def _contained(container, keys: tuple):
    """(key path, tensor) of the tensors in a dict, list or tuple and those inside it."""
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, item in items:
        if not isinstance(key, (str, int)):
            continue
        if isinstance(item, torch.Tensor):
            yield (*keys, key), item
        elif isinstance(item, (dict, list, tuple)) and len(keys) + 1 < _CONTAINERS_DEEP:
            yield from _contained(item, (*keys, key))


def _made_in_forward(placeholder: torch.fx.Node, root: torch.fx.GraphModule) -> bool:
    """Whether an exported constant is a tensor the forward built (`torch.tensor(2.0)`),
    which export reads through `lift_fresh_copy` only, rather than one it read; also
    where that read is inside a region export keeps as a submodule (a `no_grad` block:
    `h[:, :3] = 0.` there makes the tensor of 0. in it, and was refused as a tensor found
    nowhere, found by a review). `root`: the graph module holding the submodules."""
    for user in placeholder.users:
        if user.target is torch.ops.aten.lift_fresh_copy.default:
            continue
        inner = region_placeholder(user, placeholder, root)
        if inner is None or not _made_in_forward(*inner):
            return False
    return True




def _hidden_module_holding(model: torch.nn.Module, tensor: torch.Tensor) -> tuple[str, str, str] | None:
    """(where, the tensor's name in it, its class) of a module the model holds outside its
    submodules (an attribute set through `__dict__`, a module in a list attribute) whose
    parameter or buffer `tensor` is; None where none holds it. Such a tensor was said to be
    found nowhere, "a closure's", though the model holds it (found by two reviews)."""
    for path, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute in _MODULE_STATE:
                continue
            held = (value.items() if isinstance(value, dict) else enumerate(value)
                    if isinstance(value, (list, tuple)) else [(None, value)])
            for key, item in held:
                if not isinstance(item, torch.nn.Module):
                    continue
                for member, t in (*item.named_parameters(), *item.named_buffers()):
                    if _same_memory(t, tensor):
                        where = f"{path}.{attribute}" if path else attribute
                        return (f"'{where}'" + (f"[{key!r}]" if key is not None else ""),
                                f"{member!r}", type(item).__name__)
    return None


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `b` is `a` or an alias of all of it (export keeps a detached alias of a
    parameter it takes as a constant)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                      and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
                      and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _storage(tensor: torch.Tensor) -> int | None:
    """Where `tensor`'s memory starts, standing for its storage; None for a tensor without
    memory (empty, meta, fake)."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return pointer or None


def _written_buffers(exported: torch.export.ExportedProgram, placeholders: dict) -> set[str]:
    """The names of the buffers `exported`'s forward writes into (BatchNorm's running
    statistics, an EMA updated in place): its graph keeps the writes in place."""
    written = set(exported.graph_signature.buffers_to_mutate.values())
    for spec in exported.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.BUFFER and spec.arg.name in placeholders \
                and first_write(placeholders[spec.arg.name], exported.graph_module) is not None:
            written.add(spec.target)
    return written


def _members_by_storage(model: torch.nn.Module, mutated: set[str]) -> dict[int, tuple[str, str]]:
    """Storage (`_storage`) -> ('parameter' or 'buffer', name) over `model`'s parameters
    that train and its buffers the forward writes (`mutated`). Why: a plain attribute
    holding such a buffer (`self.rm = self.bn.running_mean`, or its `.data`), or such a
    parameter kept in a list, reaches torch.export as a constant tensor; the graph held
    its values at lowering while eager read the buffer as BatchNorm updated it, or the
    weight as AdamW stepped it (found by a review: losses 2e-3 to 0.94 off from the first
    steps, the `.data` alias never refused). A frozen weight or a buffer nothing writes
    in the forward (older transformers' `self.original_inv_freq = self.inv_freq`) stays a
    constant the runtime compares before each call."""
    found: dict[int, tuple[str, str]] = {}
    members = [("parameter", name, t) for name, t in model.named_parameters(remove_duplicate=False)
               if t.requires_grad]
    members += [("buffer", name, t) for name, t in model.named_buffers(remove_duplicate=False) if name in mutated]
    for kind, member, tensor in members:
        storage = _storage(tensor)
        if storage is not None:
            found.setdefault(storage, (kind, member))
    return found


def lift_held_tensors(exported: torch.export.ExportedProgram, module: torch.fx.GraphModule,
                      model: torch.nn.Module, global_tensors: dict) -> tuple[list[list], list[list]]:
    """Make the constants of `exported` that `model` holds, or that globals hold
    (`global_tensors`, `TracedReads.tensors`), readable by AOTAutograd (in `module`,
    `exported.module()`); return their rows for the graph's metadata: [module path,
    attribute, key or None, digest] and [Python module, global, None or ["attr", name],
    digest]. Raises `LoweringError` for one found nowhere, or written into."""
    name = type(model).__name__
    held = held_tensors(model)
    hook_weights = hook_reparametrizations(model)
    placeholders = {node.target: node for node in exported.graph.nodes if node.op == "placeholder"}
    targets: dict[str, list] = {}
    globals_read: dict[str, list] = {}
    members = _members_by_storage(model, _written_buffers(exported, placeholders))
    for spec in exported.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.CONSTANT_TENSOR:
            continue
        tensor = exported.constants.get(spec.target)
        placeholder = placeholders.get(spec.arg.name)
        if not isinstance(tensor, torch.Tensor) or placeholder is None:
            continue
        place, found = held.get(id(tensor)), global_tensors.get(id(tensor))
        shown_place = (f"{shown(*place)} of {name}" if place is not None
                       else shown_global(*found) if found else None)
        hooked = hook_weights.get(shown(*place)) if place is not None else None
        if hooked is not None:
            owner = place[0] or type(model).__name__
            hook = kind(hooked[1])
            raise LoweringError(
                f"{name}'s forward reads {shown(*place)} before {owner} runs: it is the weight "
                f"{hook.applied}'s hook computes at each call of {owner}, so eager reads the one of "
                f"the previous call, and remat-ir's graph would hold the one it had at "
                f"lowering. Read it after calling {owner}, or use {hook.instead}, which computes it "
                f"at every read")
        member = members.get(_storage(tensor)) if members else None
        if member is not None:
            user = next(iter(placeholder.users), None)
            line = node_line(user) if user is not None else None
            raise LoweringError(
                f"{name}'s forward reads {shown_place or 'a tensor held outside its modules (a list, a dict, a closure)'}"
                f"{f' at {line}' if line else ''}, which shares its memory with {member[0]} {member[1]!r} "
                f"(the same tensor, its .data or a view of it): the graph would hold it as a "
                f"constant with its values at lowering, where eager reads what the optimizer and "
                f"the forward write into that {member[0]}. Read {member[1]!r} itself in the forward "
                f"(through its module), not a reference kept elsewhere")
        writer = first_write(placeholder, exported.graph_module)
        if writer is not None:
            line = node_line(writer)
            raise LoweringError(
                f"{name}'s forward writes into a tensor that is neither a parameter nor a "
                f"buffer ({shown_place or 'one it did not make'}; {writer.target.name()}"
                f"{f' at {line}' if line else ''}): the graph would hold it as a constant. "
                f"Register it as a buffer (module.register_buffer), or update it outside "
                f"the forward")
        if place is None and found is None:
            if _made_in_forward(placeholder, exported.graph_module):
                continue
            user = next(iter(placeholder.users), None)
            line = node_line(user) if user is not None else None
            hidden = _hidden_module_holding(model, tensor)
            if hidden is not None:
                raise LoweringError(
                    f"{name}'s forward reads {hidden[1]} of a {hidden[2]} the model holds outside "
                    f"its submodules, at {hidden[0]} (a teacher or EMA copy kept in __dict__ or "
                    f"a list): its tensors are neither parameters nor buffers of the model, and "
                    f"the graph would hold them as constants, blind to a change. Register it as "
                    f"a submodule (frozen with requires_grad_(False) where it should not train), "
                    f"or pass what it computes as an input")
            hooked = " (a hook's closure? the line is of the module call running it)" if hook_functions(model) else ""
            raise LoweringError(
                f"{name}'s forward reads a tensor that is neither a parameter, a buffer, an "
                f"input nor one the model or a global holds (a closure's, a default "
                f"argument's: {tensor.dtype} {list(tensor.shape)}"
                f"{f', read by {user.target} at {line}' if line and user is not None else ''}{hooked}), "
                f"which the graph would hold as a constant, blind to a change: register it "
                f"as a buffer (module.register_buffer) or pass it as an input")
        if tensor.requires_grad:
            where = shown(*place) if place is not None else shown_global(*found)
            raise _held_with_gradient(name, where)
        if place is not None:
            targets[spec.target] = [*place, digest(tensor)]
        else:
            globals_read[spec.target] = [found[0], found[1], list(found[2]) if found[2] else None,
                                         digest(tensor)]
    rows = sorted(targets.values(), key=repr), sorted(globals_read.values(), key=repr)
    targets.update(globals_read)
    if not targets:   # the usual model: nothing to lift, the module is left as it is
        return rows
    for node in list(module.graph.nodes):
        if node.op != "get_attr" or node.target not in targets:
            continue
        users = [user for user in node.users if user.target is not torch.ops.aten.lift_fresh_copy.default]
        if not users:
            continue
        with module.graph.inserting_after(node):
            fresh = module.graph.call_function(torch.ops.aten.lift_fresh_copy.default, (node,))
        fresh.meta.update(node.meta)
        for user in users:
            user.replace_input_with(node, fresh)
    module.recompile()
    return rows
