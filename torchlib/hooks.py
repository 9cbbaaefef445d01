"""Module hooks, as a traced training step keeps or loses them.

torch.export runs the forward with the model's forward hooks and pre-hooks and records
what they compute, but no backward hook: a module's full backward hook or pre-hook (or
a global one) leaves nothing in the joint graph, so a step run from it trains as if it
were not there (a hook scaling a layer's input gradient by 3: every gradient below that
layer off, silently, before lowering refused them). The frontend refuses backward hooks
(`backward_hooks`); a scheduled module finds a call's hooks changed since a plan was
lowered (`HookWatch`, one per plan: a forward hook added later would not run, one
removed would still run) and lowers and plans again (`remat`), or refuses the call
(without a planner). torch.distributed's own hooks (FSDP2's, which `fully_shard` adds after
lowering) are the runtime's business and not counted, nor are those of tools that only
watch which module runs (`_WATCHING`).
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

from .callables import describe
from .function_state import snapshot, unchanged, underlying

#: A module's hook tables, by the kind of hook they hold.
TABLES = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
          "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}
#: The tables of hooks torch.export does not trace.
BACKWARD_TABLES = ("_backward_pre_hooks", "_backward_hooks")


def _global_tables() -> dict[str, dict]:
    """The hooks every module runs (`torch.nn.modules.module.register_module_*_hook`)."""
    return {table: getattr(_module, f"_global{table}") for table in TABLES}


#: Modules whose hooks only watch which module runs, for tools around a step:
#: torch.distributed's own (FSDP2's, `ModTracker`), and `torch.utils.module_tracker`'s,
#: which `FlopCounterMode` puts on every module. Counted as the user's, the latter planned
#: again and was refused, naming a gradient hook the user never wrote (found by hunt56);
#: the step's ops are what such a mode counts, recomputations included.
_WATCHING = ("torch.distributed", "torch.utils.module_tracker")


def users_hook(hook) -> bool:
    """Whether `hook` is the user's (not a watching tool's, `_WATCHING`)."""
    owner = getattr(hook, "__module__", None) or getattr(type(hook), "__module__", "")
    return not (owner or "").startswith(_WATCHING)


@contextlib.contextmanager
def watching_tools_set_aside():
    """Within: the global hooks of the tools that watch a step (`_WATCHING`) off every
    module, and the dispatch modes around the call (`FlopCounterMode`'s) suspended, while
    remat-ir lowers and plans. Lowering under them ran them: ModuleTracker's hooks put
    gradient hooks on tracing's tensors, and `remat` under `FlopCounterMode` was refused,
    naming a gradient hook the user never wrote (hunt56); the mode counted tracing's and
    profiling's ops as the step's. The step itself runs under them (the ops it counts
    are the step's, recomputations included)."""
    from torch.utils._python_dispatch import _disable_current_modes

    tables = list(_global_tables().values())
    saved = [dict(hooks) for hooks in tables]
    for hooks in tables:
        for key in [key for key, hook in hooks.items() if not users_hook(hook)]:
            del hooks[key]
    try:
        with _disable_current_modes():
            yield
    finally:
        for hooks, before in zip(tables, saved):
            added = {key: hook for key, hook in hooks.items() if key not in before}
            kept = {key: hook for key, hook in before.items() if key in hooks or not users_hook(hook)}
            hooks.clear()
            hooks.update(kept)
            hooks.update(added)


def hook_tables(model: torch.nn.Module):
    """(where, table name, table) for every hook table of the model and the global ones."""
    for table, hooks in _global_tables().items():
        yield "every module (a global hook)", table, hooks
    for path, module in model.named_modules():
        for table in TABLES:
            hooks = getattr(module, table, None)
            if hooks:
                yield f"{path or '<root>'} ({_class_name(module)})", table, hooks


def _class_name(module: torch.nn.Module) -> str:
    """The module's class name, less torch.distributed's wrapping subclass: `fully_shard`
    turns a Linear into an `FSDPLinear` after lowering, and its hooks, the same ones, were
    described as on another module and taken for hooks changed since (a weight_norm
    Linear sharded as a unit was refused)."""
    return next((cls.__name__ for cls in type(module).__mro__
                 if not cls.__module__.startswith("torch.distributed")), type(module).__name__)


def backward_hooks(model: torch.nn.Module) -> list[str]:
    """'backward hook on layer.1 (Linear)' for each backward hook or pre-hook that
    `model`'s training step would run and not run as eager does: not the root's own,
    where the step runs them (`root_backward_hooks`)."""
    root = (model._backward_hooks, model._backward_pre_hooks) if root_backward_hooks(model) is not None else ()
    return [f"{TABLES[table]} on {where}" for where, table, hooks in hook_tables(model)
            if table in BACKWARD_TABLES and not any(hooks is own for own in root)
            for hook in hooks.values() if users_hook(hook)]


def root_backward_hooks(model: torch.nn.Module) -> tuple[list, list] | None:
    """(full backward hooks, backward pre-hooks) of the root module itself, which a
    scheduled call runs around its step as `nn.Module.__call__` runs them around the
    forward (`torch.utils.hooks.BackwardHook`): they see the gradients of the model's
    inputs and outputs, the graph's own. Refused before, though the step computes those
    exactly (a Trainer's recipe, `remat(..., in_place=True)`, then a gradient monitor on
    the model; hunt49 #5). None where the root has none, or where its call would be
    unlike eager's: legacy `register_backward_hook` hooks, or forward pre-hooks (its own
    or global ones), which are traced into the graph, between the hook and the inputs it
    would see."""
    full, pre = list(model._backward_hooks.values()), list(model._backward_pre_hooks.values())
    if not full and not pre or model._is_full_backward_hook is False or any(
            users_hook(hook) for hook in (*model._forward_pre_hooks.values(),
                                          *_module._global_forward_pre_hooks.values())):
        return None   # a global pre-hook too (x * 3 before the hook: 3x eager's grad_input; hunt53)
    return full, pre


def forward_hooks(model: torch.nn.Module) -> list[tuple[str, object]]:
    """(where, hook) of the user's forward hooks and pre-hooks of `model` and the global ones."""
    return [(where, hook) for where, table, hooks in hook_tables(model) if table not in BACKWARD_TABLES
            for hook in hooks.values() if users_hook(hook)]


def hook_functions(model: torch.nn.Module) -> list:
    """The user's forward hooks and pre-hooks of `model` and the global ones, as functions
    (a bound method's or a partial's function): traced as the model's own code."""
    return [underlying(hook) for _, hook in forward_hooks(model)]


def hook_state(model: torch.nn.Module) -> dict[tuple[str, str], tuple[int, ...]]:
    """The user's hooks of `model` and the global ones: (where, kind) -> handle ids."""
    state = {}
    for where, table, hooks in hook_tables(model):
        ids = tuple(key for key, hook in hooks.items() if users_hook(hook))
        if ids:
            state[(where, TABLES[table])] = ids
    return state


def _at(model: torch.nn.Module, path: list[str]):
    """The submodule at `path` (its names), through the modules' own dictionaries, or None."""
    for name in path:
        model = model._modules.get(name) if model is not None else None
    return model


class HookWatch:
    """The hooks a graph was traced with, and whether a call finds others.

    Cheap when nothing changed: every hook registered anywhere (module or tensor) takes
    a new handle id (`RemovableHandle.next_id`), and the hooks present at lowering are
    looked up in their tables, so the module tree is walked again only after a hook was
    registered or one of those removed."""

    def __init__(self, model: torch.nn.Module):
        self.state = hook_state(model)
        self.seen = RemovableHandle.next_id
        self.present = [(hooks, key) for _, table, hooks in hook_tables(model)
                        for key, hook in hooks.items() if users_hook(hook)]
        #: Per present hook, where it is, its description and what it computes with
        #: (`function_state`): the traced graph holds what the hook computed, so a value
        #: its closure captured, rebound or changed in place since (a scale in a dict)
        #: computes otherwise (found by a review: 0.63 where eager gives 0.066, silently).
        self.functions = [(f"{TABLES[table]} on {where}", describe(hooks[key]), snapshot(hooks[key]))
                          for where, table, hooks in hook_tables(model) for key, hook in hooks.items()
                          if users_hook(hook)]
        #: (path, module) of each module holding one of those hooks: one replaced since by
        #: a module without it (`model.a = nn.Linear(...)`) registers nothing, and its
        #: hook table still held the hook, so the graph kept running the hook (found by a
        #: review: gradients 3x eager's).
        holding = {id(hooks) for hooks, _ in self.present}
        self.holders = [(path.split(".") if path else [], module)
                        for path, module in model.named_modules()
                        if any(id(getattr(module, table, None)) in holding for table in TABLES)]

    def changed(self, model: torch.nn.Module) -> str | None:
        """What differs from the hooks at lowering, or None."""
        if RemovableHandle.next_id == self.seen and all(key in hooks for hooks, key in self.present) \
                and all(_at(model, path) is module for path, module in self.holders):
            return self._functions_changed()
        now = hook_state(model)
        if now == self.state:
            self.seen = RemovableHandle.next_id
            return self._functions_changed()
        added = [f"{kind} on {where}" for (where, kind), ids in now.items()
                 if set(ids) - set(self.state.get((where, kind), ()))]
        removed = [f"{kind} on {where}" for (where, kind), ids in self.state.items()
                   if set(ids) - set(now.get((where, kind), ()))]
        return "; ".join([f"added since: {', '.join(added)}"] * bool(added)
                         + [f"removed since: {', '.join(removed)}"] * bool(removed))

    def _functions_changed(self) -> str | None:
        """The first present hook whose function computes otherwise than at lowering (its
        closure's values), said for the user, or None."""
        for index, ((hooks, key), (where, text, state)) in enumerate(zip(self.present, self.functions)):
            if unchanged(hooks[key], state):
                continue
            now = describe(hooks[key])
            if now != text:
                return f"the {where} computes with other values (was {text}, is {now})"
            self.functions[index] = (where, text, snapshot(hooks[key]))   # alike: not described again
        return None
