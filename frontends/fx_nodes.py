"""Building new nodes in a joint graph that later passes and the lowering read like the
traced ones.

The lowering reads each node's metadata: its fake result (`val`: shape, dtype,
storage), its module path and sequence number (error messages, names), and the
partitioner's tag (which side of the step it runs on). Rewrites (`dropout_masks`,
`view_compaction`) add nodes that stand for part of a traced one, so they copy its
metadata and compute their own fake result.
"""

from __future__ import annotations

import torch
import torch.fx


def tensor_value(node) -> torch.Tensor | None:
    """The traced (fake) tensor a node computes, from its `val` metadata; None for an
    argument that is not a node, or a node whose value is not one tensor."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def views_first_argument(node: torch.fx.Node) -> bool:
    """Whether `node` returns a view of its first argument, a node (every result a
    non-writing alias in its schema: slice, view, transpose, split's list of views)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return (bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
            and bool(node.args) and isinstance(node.args[0], torch.fx.Node))


def add_call(graph: torch.fx.Graph, meta: dict, target, args: tuple, kwargs: dict | None = None
             ) -> torch.fx.Node:
    """A call of `target` at the graph's insertion point, with `meta` (less any `val`) and
    its own fake result, computed from its arguments' (call it under their fake mode)."""
    kwargs = kwargs or {}
    new = graph.call_function(target, args, kwargs)
    new.meta.update({k: v for k, v in meta.items() if k != "val"})
    new.meta["val"] = target(*traced_values(args), **traced_values(kwargs))
    return new


def traced_values(arguments):
    """`arguments` (a node's args or kwargs) with each node, also inside lists (an
    `index_put`'s indices), replaced by its traced value: what the op is called on."""
    if isinstance(arguments, torch.fx.Node):
        return arguments.meta["val"]
    if isinstance(arguments, (list, tuple)):
        values = [traced_values(a) for a in arguments]
        return values if isinstance(arguments, list) else tuple(values)
    if isinstance(arguments, dict):
        return {k: traced_values(v) for k, v in arguments.items()}
    return arguments


def replace(node: torch.fx.Node, new: torch.fx.Node) -> None:
    """`new` takes `node`'s place: its readers read `new`, and `node` leaves the graph."""
    node.replace_all_uses_with(new)
    node.graph.erase_node(node)


def recompiled(module: torch.fx.GraphModule, changes: int) -> int:
    """`changes`, once `module`'s code is made again from its graph where there were any
    (the graph checked first: a rewrite's mistake fails here, not in a later pass)."""
    if changes:
        module.graph.lint()
        module.recompile()
    return changes


def node_module_path(node: torch.fx.Node) -> tuple[str, str] | None:
    """(module path, class name) of the innermost module an FX node came from (path ''
    for the model itself), or None where tracing recorded none."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    return path, getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].rstrip("'>")


def node_module(node: torch.fx.Node) -> str:
    """Module path an FX node came from ('transformer.h.0.attn (GPT2Attention)'; '<root>
    (M)' for the model itself), '' where tracing recorded none."""
    found = node_module_path(node)
    return f"{found[0] or '<root>'} ({found[1]})" if found else ""


#: Regions export keeps as submodules: the number of arguments before the submodule.
_REGIONS = {torch.ops.higher_order.wrap_with_set_grad_enabled: 1,
            torch.ops.higher_order.wrap_with_autocast: 4}


def region_placeholder(user: torch.fx.Node, node: torch.fx.Node, root: torch.fx.GraphModule
                       ) -> tuple[torch.fx.Node, torch.fx.GraphModule] | None:
    """(the placeholder standing for `node` inside region `user`'s submodule, that
    submodule), or None where `user` is no such region or takes `node` otherwise."""
    leading = _REGIONS.get(user.target)
    if leading is None or len(user.args) <= leading or user.kwargs:
        return None
    holder, operands = user.args[leading], list(user.args[leading + 1:])
    if getattr(holder, "op", None) != "get_attr" or operands.count(node) != 1 or node in user.args[:leading]:
        return None
    submodule = getattr(root, holder.target, None)
    if not isinstance(submodule, torch.fx.GraphModule):
        return None
    placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        return None
    return placeholders[operands.index(node)], submodule


#: Ops that update a BatchNorm's running statistics (arguments 3 and 4) in place, where
#: their `training` (or `use_input_stats`) argument, 5, is true, without marking them
#: written in their schema. A read of the statistics after such an op, taken for a read of
#: the buffer as it was, had decided a branch from the statistics before the call (found
#: by a review: outputs 1.1 off eager's, silently).
UNMARKED_WRITES = {torch.ops.aten.batch_norm.default, torch.ops.aten.native_batch_norm.default,
                   torch.ops.aten._batch_norm_impl_index.default, torch.ops.aten.instance_norm.default,
                   torch.ops.aten.cudnn_batch_norm.default, torch.ops.aten.miopen_batch_norm.default}


def written_arguments(node: torch.fx.Node) -> list:
    """The arguments (nodes or other values) whose tensors the op of `node` writes into:
    those its schema marks written, and a BatchNorm's running statistics (`UNMARKED_WRITES`)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    return written_values(node.target, node.args, node.kwargs)


def written_values(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list:
    """`written_arguments` of a call of `op` on `args` and `kwargs` (tensors where it runs,
    FX nodes where it is traced)."""
    arguments = [(argument, args[i] if i < len(args) else kwargs.get(argument.name))
                 for i, argument in enumerate(op._schema.arguments)]
    evaluating = any(argument.name == "training" and value is False for argument, value in arguments)
    written = [value for argument, value in arguments if argument.alias_info is not None and argument.alias_info.is_write
               # `_native_batch_norm_legit` marks its running statistics written, in eval mode too
               and not (evaluating and argument.name in ("running_mean", "running_var"))]
    if op in UNMARKED_WRITES and len(arguments) > 5 and arguments[5][1] is not False:
        written += [arguments[3][1], arguments[4][1]]
    return written


def first_write(start: torch.fx.Node, root: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The first node writing into `start`'s tensor (or a view of it), or None; inside
    regions export keeps as submodules too (a held tensor's `self.count.add_(1)` under
    `no_grad` was not seen: the graph held the count as it was traced, and trained on with
    it, silently; likewise a write through `unfold` windows there). `root`: the graph
    module holding the submodules."""
    pending, seen = [(start, root)], set()
    while pending:
        node, holder = pending.pop()
        for user in node.users:
            inner = region_placeholder(user, node, holder)
            if inner is not None:
                pending.append(inner)
                continue
            if user in seen or not isinstance(user.target, torch._ops.OpOverload):
                continue
            seen.add(user)
            if any(value is node for value in written_arguments(user)):
                return user
            schema = user.target._schema
            for i, argument in enumerate(schema.arguments):
                value = user.args[i] if i < len(user.args) else user.kwargs.get(argument.name)
                if value is node and argument.alias_info is not None:
                    pending.append((user, holder))   # a view of it
    return None


def called_ops(graph_module: torch.fx.GraphModule | None) -> list[torch._ops.OpOverload]:
    """The ops `graph_module`'s graph calls (its regions', nested graph modules, too),
    each once, in the order first called."""
    found: dict = {}
    for module in graph_module.modules() if graph_module is not None else ():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                    found.setdefault(node.target, None)
    return list(found)


def custom_op_definitions(graph_module: torch.fx.GraphModule | None) -> list:
    """The definitions (`torch._library.custom_ops.CustomOpDef`) of the
    `torch.library.custom_op`s `graph_module` calls: what `register_autograd` registered
    for each is on it (`_backward_fn`, `_setup_context_fn`)."""
    from torch._library.custom_ops import _maybe_get_opdef

    return [definition for op in called_ops(graph_module)
            if (definition := _maybe_get_opdef(op)) is not None]
