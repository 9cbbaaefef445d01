"""Hooks a forward registers and leaves registered: refused by line.

A forward that registers a hook on a module at every call piles them up in eager (its
k-th step runs k of them), while the graph runs the one hook the trace saw, silently
(found by a review). So does one that registers a global hook
(`register_module_forward_hook`) at every call. While the forward is traced, torch's
registering methods are patched to note each hook the user's own code registers
(`is_users_file`); at the end of the forward, each still registered is an effect the
graph does not keep, and every hook registered while tracing is removed afterwards,
which leaves the model as it was. A hook registered and removed within the forward
(transformers' hooks capturing hidden states, peft's per-call adapter hooks) is no
effect, nor is a library's hook registered once at its first call, which the trace
keeps as eager's first call does.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from .model_lines import is_users_file


#: The module methods that register a hook, and the kind of hook each registers.
_HOOK_REGISTRATIONS = {"register_forward_hook": "forward hook", "register_forward_pre_hook": "forward pre-hook",
                       "register_full_backward_hook": "backward hook", "register_backward_hook": "backward hook",
                       "register_full_backward_pre_hook": "backward pre-hook"}


def _noting_hook_registrations() -> tuple[list, list]:
    """Hooks the model's code registers while the forward is traced: ([(owner, name, torch's
    function)] patched until `_put_back_hook_registrations`, [(handle, kind, module class,
    'file:line')] noted as they are registered). The user's own code only: one trace cannot
    tell a library's hook registered once from one added at every call, so a user's hook
    registered once behind a flag is refused too (the message's way out fits both)."""
    originals, noted = [], []
    for name, kind in _HOOK_REGISTRATIONS.items():
        original = getattr(torch.nn.Module, name)

        def register(module, *args, _original=original, _kind=kind, **kwargs):
            handle = _original(module, *args, **kwargs)
            caller = sys._getframe(1)
            if is_users_file(caller.f_code.co_filename):
                noted.append((handle, _kind, type(module).__name__, f"{caller.f_code.co_filename}:{caller.f_lineno}"))
            return handle

        originals.append((torch.nn.Module, name, original))
        setattr(torch.nn.Module, name, register)
    return originals, noted


#: Why a hook the forward leaves registered is refused, and what to do.
_LEFT_HOOK = ("(each eager call adds one more, which a traced graph cannot follow: register it once, "
              "outside the forward, or remove its handle before the forward returns)")
#: torch's tables of the hooks every module runs (`register_module_forward_hook`), by kind.
_GLOBAL_HOOKS = {"_global_forward_hooks": "forward hook", "_global_forward_pre_hooks": "forward pre-hook",
                 "_global_backward_hooks": "backward hook", "_global_backward_pre_hooks": "backward pre-hook"}


def _global_hooks() -> dict[str, set]:
    """The keys of torch's global hook tables now."""
    from torch.nn.modules import module

    return {table: set(getattr(module, table, {})) for table in _GLOBAL_HOOKS}


def _global_hooks_added(before: dict[str, set]) -> list[str]:
    """The global hooks registered since `before` (`_global_hooks`), removed, each said as
    an effect: a forward registering one at every call (found by a review) piles them up in
    eager, as a module's hooks do; found by their tables, since the registering function
    is often imported by name (`from torch.nn.modules.module import register_module_forward_hook`)."""
    from torch.nn.modules import module

    found = []
    for table, kind in _GLOBAL_HOOKS.items():
        hooks = getattr(module, table, {})
        for key in set(hooks) - before[table]:
            del hooks[key]
            found.append(f"it registers a global {kind} (torch.nn.modules.module.register_module_*) and "
                         f"leaves it there {_LEFT_HOOK}")
    return list(dict.fromkeys(found))


def _hooks_left(registrations: tuple[list, list]) -> list[str]:
    """The effects of the hooks the forward registered and left on its modules: a hook
    registered and removed within the forward (transformers' hooks capturing hidden
    states, peft's per-call adapter hooks) is no effect."""
    left = []
    for handle, kind, module, where in registrations[1]:
        table = handle.hooks_dict_ref()
        if table is not None and handle.id in table:
            left.append(f"it registers a {kind} on {module} at {where} and leaves it there {_LEFT_HOOK}")
    return list(dict.fromkeys(left))


def _put_back_hook_registrations(registrations: tuple[list, list]) -> None:
    """Torch's registering methods put back, and the hooks the traced forward left removed:
    tracing leaves the model as it was."""
    originals, noted = registrations
    for owner, name, original in originals:
        setattr(owner, name, original)
    for handle, *_ in noted:
        handle.remove()


@contextlib.contextmanager
def noting_hook_registrations(model: torch.nn.Module, found: list[str]):
    """Within (the forward traced), each hook the model's code registers and leaves is
    appended to `found` when the forward returns (module docstring); every hook registered
    within is removed at the end."""
    global_hooks = _global_hooks()
    registrations: tuple[list, list] = ([], [])

    def after(module, inputs, output):
        found.extend(_hooks_left(registrations))
        found.extend(_global_hooks_added(global_hooks))

    ends = model.register_forward_hook(after)
    registrations = _noting_hook_registrations()
    try:
        yield
    finally:
        ends.remove()
        _put_back_hook_registrations(registrations)


@contextlib.contextmanager
def registration_hooks_paused():
    """Within: torch's global hooks on module, parameter and buffer registration
    (`register_module_module_registration_hook` and the like) are not called. Tracing
    registers modules of its own (torch.export wraps the model in a module), which eager
    training never does: a registration hook logging to a list was refused as the
    forward changing that list (found by a review). What the model's own forward
    registers is refused otherwise (`trace_effects`)."""
    from torch.nn.modules import module

    tables = (module._global_module_registration_hooks, module._global_parameter_registration_hooks,
              module._global_buffer_registration_hooks)
    saved = [dict(table) for table in tables]
    for table in tables:
        table.clear()
    try:
        yield
    finally:
        for table, hooks in zip(tables, saved):
            table.clear()
            table.update(hooks)
