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
tensor assigned) is refused instead of training with the old values. A tensor found
unchanged is hashed again only once its version counter moves (every in-place op bumps
it; a write through `.data` does not, and is not seen). A held tensor that requires a
gradient is refused: eager would give it one, a constant cannot.
"""

from __future__ import annotations

import torch

from remat_ir.torchlib.held_tensors import Place, digest, shown

from .errors import LoweringError

#: nn.Module's own bookkeeping in a module's `__dict__`, which holds no tensor of the model's.
_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules"})


def held_tensors(model: torch.nn.Module) -> dict[int, Place]:
    """id(tensor) -> (module path, attribute, key or None) of every tensor the model's
    modules hold as a plain attribute, or as an item of a dict, list or tuple attribute."""
    found: dict[int, Place] = {}
    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if name in _MODULE_STATE:
                continue
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                found.setdefault(id(value), (path, name, None))
            elif isinstance(value, (dict, list, tuple)):
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for key, item in items:
                    if isinstance(item, torch.Tensor) and isinstance(key, (str, int)):
                        found.setdefault(id(item), (path, name, key))
    return found


def lift_held_tensors(exported: torch.export.ExportedProgram, module: torch.fx.GraphModule,
                      model: torch.nn.Module) -> list[list]:
    """Make the constants of `exported` that `model` holds readable by AOTAutograd (in
    `module`, `exported.module()`), and return their rows for the graph's metadata:
    [module path, attribute, key or None, digest]."""
    held = held_tensors(model)
    targets: dict[str, list] = {}
    for spec in exported.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.CONSTANT_TENSOR:
            continue
        tensor = exported.constants.get(spec.target)
        place = held.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
        if place is None:
            continue
        if tensor.requires_grad:
            raise LoweringError(
                f"{type(model).__name__} keeps a tensor that requires a gradient at "
                f"{shown(*place)}, which is neither a parameter nor a buffer: eager gives it a "
                f"gradient, and remat-ir's graph would hold it as a constant. Make it an "
                f"nn.Parameter (or detach it, if it should not train)")
        targets[spec.target] = [*place, digest(tensor)]
    if not targets:   # the usual model: nothing to lift, the module is left as it is
        return []
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
    return sorted(targets.values(), key=repr)
