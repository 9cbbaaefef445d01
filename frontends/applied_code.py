"""The code of the custom autograd Functions and `torch.library` ops a graph applies,
recorded by description so that what it computes with is compared at every call.

A Function's backward, or the backward `register_autograd` registered for a custom op,
is traced into the joint graph: the numbers its closure held while tracing are
constants there. A gradient-reversal coefficient kept in a closure (a Function class
made by a factory function, `nonlocal coef`, a dict the backward's closure captured)
changed by the loop after `remat` trained on with the traced one: gradients 22 off
eager's, silently (found by a review). The globals such code reads were compared
already (`traced_reads.record_globals`); its closure was not, since no module's globals
name a class a function made.

Each such class or op gets a namespace of its own (`torchlib.namespaces.
AttributeNamespace`: its methods, or the functions registered for the op, read live) and
a global function row per function (`TracedReads.globals`, `("function",)`), which the
runtime compares by `describe` as it does the global functions the model calls: the
plan is made again for the new closure, or a plan loaded in another process, where no
such namespace is known, is not compared (its ops exist only in the lowering process).
"""

from __future__ import annotations

import types

import torch

from remat_ir.torchlib.callables import describe_called
from remat_ir.torchlib.namespaces import AttributeNamespace, remember

from .autograd_functions import function_class
from .fx_nodes import called_ops, custom_op_definitions
from .model_lines import is_users_file
from .traced_reads import TracedReads, own_method_names

#: What `register_autograd` registers on a custom op's definition, by the name a row shows.
_REGISTERED = {"backward": "_backward_fn", "setup_context": "_setup_context_fn"}


def _users_code(filename: str) -> bool:
    """The user's files, and code run by `exec` (`<string>`: a script's cells run from a
    config, not covered before: 20 off after a change, found by a review)."""
    return is_users_file(filename) or filename == "<string>"


def record_applied_code(reads: TracedReads, graph_module: torch.fx.GraphModule | None) -> None:
    """Record in `reads.globals` the functions of the user's files that the Functions and
    custom ops `graph_module` calls run, in namespaces of their own (module docstring)."""
    spaces: dict[str, tuple[object, dict[str, str]]] = {}
    for op in called_ops(graph_module):
        cls = function_class(op)
        if cls is not None and not any(owner is cls for owner, _ in spaces.values()):
            # Named after its op (`remat_ir_fn::rev_<digest>`): one per class in a process,
            # and the same in another process lowering the same code (the plan cache's key).
            names = {name: name for name in own_method_names(cls)}
            spaces[f"autograd.Function {cls.__qualname__} (op {op._schema.name})"] = (cls, names)
    for definition in custom_op_definitions(graph_module):
        spaces[f"custom op {definition._qualname}"] = (definition, _REGISTERED)
    for space, (owner, names) in spaces.items():
        found = AttributeNamespace(space, owner, names)
        remember(found)
        for name in names:
            function = found.get(name)
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and _users_code(code.co_filename) \
                    and (text := describe_called(function)) is not None:
                reads.globals.setdefault((space, name, ("function",)), text)
