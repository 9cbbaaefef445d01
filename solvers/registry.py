"""Finding solvers by name: built-ins, Python plugins, external programs.

- Built-ins live in this package and are imported only when used (the ILP
  imports python-mip).
- Python plugins are entry points in the group `remat_ir.solvers`; the entry
  point names either a solver callable or an object with a `solve` method
  (see `remat_ir.solvers.base` for the protocol).
- `exec:COMMAND` runs COMMAND as an external solver in any language
  (`remat_ir.solvers.external`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from remat_ir.ir import RematIRError

ENTRY_POINT_GROUP = "remat_ir.solvers"
EXEC_PREFIX = "exec:"

#: name -> (module:attribute, description). Descriptions are one line each.
BUILTINS = {
    "autograd": ("remat_ir.solvers.baselines:autograd",
                 "store every result backward reads, no recomputation (PyTorch's default)"),
    "recompute-all": ("remat_ir.solvers.baselines:recompute_all",
                      "keep only inputs; each backward node recomputes what it reads "
                      "(little memory, slow; not always the least)"),
    "sqrt": ("remat_ir.solvers.baselines:sqrt",
             "Chen et al.'s sqrt(n) checkpoints over the forward graph's articulation points"),
    "checkmate": ("remat_ir.solvers.checkmate:checkmate",
                  "exact MILP (Checkmate) in python-mip; mode='lp' rounds the LP relaxation"),
    "rotor": ("remat_ir.solvers.rotor:rotor",
              "chain dynamic program over the segments between articulation points"),
    "pofo": ("remat_ir.solvers.pofo:pofo",
             "rotor's chain DP with offloading over the host link (POFO); needs a described link"),
    "fastsa": ("remat_ir.solvers.fastsa:fastsa",
               "simulated annealing over compute sequences (Fast SA): groups, then single nodes"),
    "twremat": ("remat_ir.solvers.twremat:twremat",
                "TW-remat: recursion on tree-decomposition separators, fitted to the budget"),
    "hiremate": ("remat_ir.solvers.hiremate:hiremate",
                 "HiRemate: hierarchical partition, options per cluster, H-ILP at every level"),
}

#: Built-in solvers whose plans move values to the host themselves: `offload=True`, which
#: adds moves to a plan that has none, is refused with them (`check_request`).
OFFLOADING_SOLVERS = frozenset({"pofo"})


class UnknownSolver(RematIRError, ValueError):
    """No solver of that name; the message lists the known ones."""


@dataclass(frozen=True)
class SolverInfo:
    name: str
    #: "built-in", "plugin (DISTRIBUTION)" or "exec".
    origin: str
    description: str
    load: Callable[[], Callable]


def _import(target: str) -> Callable:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _callable_of(obj) -> Callable:
    """A plugin may be the solver function itself or an object with a `solve` method."""
    solve = getattr(obj, "solve", None)
    if solve is not None and not callable(solve):   # hunt68: a raw TypeError from inspect
        raise TypeError(f"{obj!r} has a `solve` that is not callable ({solve!r}); a plugin is a "
                        f"solver function or an object with a `solve` method")
    if inspect.isclass(obj) and solve is not None:
        return obj().solve
    return solve if callable(solve) else obj


def _describe(obj) -> str:
    text = getattr(obj, "description", None) or inspect.getdoc(obj) or ""
    return text.strip().splitlines()[0] if text.strip() else ""


def _distribution(ep) -> str:
    return ep.dist.name if ep.dist is not None else "unknown distribution"


def _load_plugin(ep) -> Callable:
    try:
        return _callable_of(ep.load())
    except Exception as error:  # a broken plugin must not look like our bug
        raise RematIRError(f"plugin solver {ep.name!r} ({ep.value}, from {_distribution(ep)}) "
                           f"failed to load: {type(error).__name__}: {error}") from error


def _plugin_info(ep, describe: bool) -> SolverInfo:
    """Entry point -> SolverInfo; loads the plugin only when its description is asked for."""
    description = ""
    if describe:
        try:
            description = _describe(ep.load())
        except Exception as error:
            description = f"(fails to load: {type(error).__name__}: {error})"
    return SolverInfo(ep.name, f"plugin ({_distribution(ep)})", description,
                      lambda: _load_plugin(ep))


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[SolverInfo]:
    """Every solver that can be named: built-ins first, then installed plugins."""
    infos = [SolverInfo(name, "built-in", description, lambda t=target: _import(t))
             for name, (target, description) in BUILTINS.items()]
    infos += [_plugin_info(ep, describe=True) for name, ep in sorted(_entry_points().items())
              if name not in BUILTINS]
    return infos


def find(name: str) -> SolverInfo:
    """The solver called `name`, or UnknownSolver listing the known names."""
    if name.startswith(EXEC_PREFIX):
        command = name[len(EXEC_PREFIX):].strip()
        if not command:
            raise UnknownSolver("'exec:' must be followed by the command of an external solver, "
                                "e.g. exec:./my_solver")
        from .external import external_solver
        return SolverInfo(name, "exec", f"external program: {command}",
                          lambda: external_solver(command))
    if name in BUILTINS:
        target, description = BUILTINS[name]
        return SolverInfo(name, "built-in", description, lambda: _import(target))
    plugins = _entry_points()
    if name in plugins:
        return _plugin_info(plugins[name], describe=False)
    known = [*BUILTINS, *sorted(plugins)]
    raise UnknownSolver(f"unknown solver {name!r}; known solvers: {', '.join(known)}, "
                        f"or {EXEC_PREFIX}COMMAND for an external program")
