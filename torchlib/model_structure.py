"""The model's structure as a lowering saw it, recorded in the graph.

A plan's checks of the model (its submodules' classes, the members each holds, the paths
that are one module, its hooks: `runtimes/torch.py`'s `_Lowered`, `call_guard.py`) compare
a call's model with records taken from the model when the plan object is made. Made right
after lowering, that is the model the graph was traced from; but a plan is also made
again from its graph where the model may have changed since the trace: a copy or a saved
module loaded (`copy.deepcopy`, `torch.load`: `ScheduledModule.__setstate__`), or a
graph read from a file given to `ScheduledModule`. A hook added, a layer appended to a
ModuleList or a bias set before the copy passed every check, and the old graph trained
on, silently (found by a review: 0.149 where eager gives 0.162). So the lowering records
the structure here, in the graph's metadata (`torch.model_structure`), as text the same
in every process, and a plan made from the graph compares it with the model first
(`difference`).
"""

from __future__ import annotations

import torch

from .callables import describe
from .hooks import TABLES, hook_tables, users_hook

KEY = "torch.model_structure"
#: What a member of each of a module's tables is called, said for the user.
MEMBER_KINDS = {"_modules": "submodule", "_parameters": "parameter", "_buffers": "buffer"}


def none_members(module: torch.nn.Module) -> frozenset:
    """(table, name) of the submodules, parameters and buffers `module` holds as None (a
    Linear without bias, an optional buffer or adapter not set)."""
    return frozenset((table, name) for table in MEMBER_KINDS
                     for name, value in vars(module)[table].items() if value is None)


def _class_name(cls: type) -> str:
    """'module.Qualname' of `cls`; of the class it wraps for one FSDP2's `fully_shard` made
    (bases (FSDPModule, the module's class), which adds nothing a forward computes)."""
    if len(cls.__bases__) == 2 and cls.__bases__[0].__module__.startswith("torch.distributed"):
        cls = cls.__bases__[1]
    return f"{cls.__module__}.{cls.__qualname__}"


def structure(model: torch.nn.Module) -> dict:
    """What the checks compare, as plain data: per module path its class and the names of
    the submodules, parameters and buffers it holds (those holding None apart), the paths
    that are one module, and the user's hooks with what they compute."""
    modules = []
    for path, module in model.named_modules():
        row = [path, _class_name(type(module))]
        for table in MEMBER_KINDS:
            members = vars(module)[table]
            row.append([name for name, value in members.items() if value is not None])
            row.append([name for name, value in members.items() if value is None])
        modules.append(row)
    paths_of: dict[int, list[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        paths_of.setdefault(id(module), []).append(path)
    return {"modules": modules, "aliases": [paths for paths in paths_of.values() if len(paths) > 1],
            "hooks": hooks(model)}


def hooks(model: torch.nn.Module) -> list[str]:
    """The user's hooks of `model` and the global ones, each with what it computes."""
    return sorted(f"{TABLES[table]} on {where}: {describe(hook)}" for where, table, table_hooks
                  in hook_tables(model) for hook in table_hooks.values() if users_hook(hook))


def with_forwards_hooks(record: dict, before: list[str]) -> dict:
    """`record` (the model's `structure` after lowering) noting the hooks its forward put on
    while traced, absent from `before` (its `hooks` then): transformers' models install
    output-capturing hooks at their first call that collects outputs (LLaVA's vision
    tower), so a model built again in another process lacks them until its first call, and
    a plan made from the graph for it was refused as "hooks removed"."""
    return {**record, "forwards_hooks": sorted(set(record["hooks"]) - set(before))}


def difference(recorded: dict, now: dict) -> str | None:
    """The first way `now` differs from `recorded` (both from `structure`), said for the
    user, or None."""
    before = {row[0]: row for row in recorded["modules"]}
    after = {row[0]: row for row in now["modules"]}
    for path in [*before, *(p for p in after if p not in before)]:
        where = f"submodule {path!r}" if path else "the model"
        if path not in after:
            return f"{where} is gone"
        if path not in before:
            return f"{where} ({after[path][1]}) was added"
        then, row = before[path], after[path]
        if then[1] != row[1]:
            return f"{where} was a {then[1]} and is a {row[1]} now"
        for index, table in enumerate(MEMBER_KINDS):
            held, nones = 2 + 2 * index, 3 + 2 * index
            if then[held] != row[held] or then[nones] != row[nones]:
                return (f"{where} held {MEMBER_KINDS[table]}s {then[held]} (None at {then[nones]}) and holds "
                        f"{row[held]} (None at {row[nones]}) now")
    if sorted(recorded["aliases"]) != sorted(now["aliases"]):
        return f"the paths that are one module were {recorded['aliases']} and are {now['aliases']} now"
    own = set(recorded.get("forwards_hooks", ()))   # there or not, as the forward puts them on
    added = sorted(set(now["hooks"]) - set(recorded["hooks"]) - own)
    removed = sorted(set(recorded["hooks"]) - set(now["hooks"]) - own)
    if added or removed:
        return "; ".join([f"hooks added: {', '.join(added)}"] * bool(added)
                         + [f"hooks removed: {', '.join(removed)}"] * bool(removed))
    return None
