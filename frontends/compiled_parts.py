"""The parts of a model that `torch.compile` compiles, which remat-ir runs uncompiled.

Tracing goes through torch.compile's wrappers to the code they wrap, so the eager
backend runs those parts op by op: gradients bitwise those of the uncompiled model
(1e-7 off the compiled model's, whose fused kernels round otherwise), at eager speed.
A user who compiled them for speed, or who compares against the compiled model, would
not guess either; `remat` says so (`remat_ir.api`). Found: a submodule wrapped by
`torch.compile` (an `OptimizedModule`), one compiled in place (`module.compile()`), a
compiled function a module holds (`self.act = torch.compile(fn)`), a compiled method
of its classes, and a compiled global function they call (`@torch.compile def
fused_gelu(x)`)."""

from __future__ import annotations

import dis

import torch
from torch._dynamo.eval_frame import OptimizedModule

from .model_lines import is_model_file
from .traced_reads import own_classes, own_methods


def _compiled(value) -> bool:
    """Whether `value` is a function torch.compile wraps (not one `torch.compiler.disable`
    wraps, with the same attribute: remat-ir's own `_under_torch_compile` was said to be
    compiled when a model held a remat-ir module, found by a review)."""
    return callable(value) and getattr(value, "_torchdynamo_orig_callable", None) is not None \
        and not getattr(value, "_torchdynamo_disable", False)


def compiled_parts(model: torch.nn.Module) -> list[str]:
    """Where `torch.compile` applies in `model`, said for the user, in module order."""
    found: list[str] = []
    classes: set[type] = set()
    for path, module in model.named_modules():
        where = path or f"the model ({type(module).__name__})"
        if isinstance(module, OptimizedModule):
            found.append(path or f"the model ({type(module._orig_mod).__name__})")
            continue
        routed = module.__dict__.get("_compiled_call_impl")
        if routed is not None and not hasattr(routed, "route_calls"):   # not remat-ir's own routing
            found.append(f"{where} (compiled in place by .compile())")
        found.extend(f"{f'{path}.' if path else ''}{name}" for name, value in vars(module).items()
                     if not name.startswith("_") and _compiled(value))
        if type(module) not in classes:
            classes.add(type(module))
            found.extend(f"{klass.__qualname__}.{name}" for klass in own_classes(type(module))
                         for name, member in vars(klass).items()
                         if _compiled(getattr(member, "__func__", member)))   # `@torch.compile` on a method
            found.extend(_compiled_globals(type(module)))
    return list(dict.fromkeys(found))


def _compiled_globals(cls: type) -> list[str]:
    """The compiled global functions the methods of `cls` call by name."""
    found = []
    for function in own_methods(cls):
        if not is_model_file(function.__code__.co_filename):
            continue
        for instruction in dis.get_instructions(function.__code__):
            value = function.__globals__.get(instruction.argval) if instruction.opname == "LOAD_GLOBAL" else None
            if value is not None and _compiled(value):
                found.append(f"{instruction.argval} of {function.__globals__.get('__name__', '?')}")
    return found
