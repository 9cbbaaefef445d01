"""A forward's uses of autograd's own state: gradients (`.grad`) and `requires_grad` flags.

Tracing runs the forward once; the graph keeps none of these (found by a review, each
silent):
- a read of a parameter's `.grad` (a branch on whether it is None, its value added in)
  became a constant of the graph: under gradient accumulation eager reads the gradient
  accumulated so far, and the losses differed from the second micro-batch on;
- clearing gradients in the forward (`self.zero_grad()`, `p.grad = None`, a training
  wrapper's habit) ran at tracing only: eager's `.grad` held each step's gradient, remat-
  ir's accumulated across steps;
- `requires_grad_(False)` on a submodule (a teacher frozen lazily) left its parameters
  requiring gradients: they got a gradient at every step and the optimizer trained them,
  and `requires_grad_(True)` on a frozen weight never gave it one; turned on for an
  input (saliency maps read `x.grad`), the input got no gradient.

Each is noted where the model's own code does it (not torch's: AOTAutograd reads and sets
these while tracing) and refused with what to do instead, outside the forward: remat-ir
plans again for flags changed between steps. Setting a flag to the value it has is no
change, and is let through.
"""

from __future__ import annotations

import contextlib

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

from .model_lines import model_caller


_OUTSIDE = "outside the forward, between steps, as a training loop does"
_FLAGS = (f"where the graph computes the gradients of the parameters that required them at "
          f"lowering; freeze or unfreeze {_OUTSIDE} (remat-ir plans again for new flags)")


def _traced_input(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is an input of the graph being traced (a placeholder: the caller's
    inputs; the parameters are told apart as such). Not by a forward pre-hook on the model,
    which under FSDP2 ran its hooks' lazy initialization on tracing tensors."""
    mode = get_proxy_mode()
    proxy = get_proxy_slot(tensor, mode.tracer, None, lambda slot: slot.proxy) if mode is not None else None
    return proxy is not None and proxy.node.op == "placeholder"


@contextlib.contextmanager
def noting_autograd_state(found: list[str]):
    """While the block traces, note in `found` each use of `.grad` and each change of a
    parameter's or an input's `requires_grad` that the model's own code makes (module
    docstring)."""
    grad, flag = torch._C.TensorBase.grad, torch._C.TensorBase.requires_grad
    module_zero_grad, module_requires_grad = torch.nn.Module.zero_grad, torch.nn.Module.requires_grad_
    optimizer_zero_grad = torch.optim.Optimizer.zero_grad
    tensor_requires_grad = torch._C.TensorBase.requires_grad_

    def read(tensor):
        where = model_caller(1)
        if where:
            found.append(f"it reads a gradient (`.grad`) at {where}, which the graph keeps as it "
                         f"was while tracing where eager reads what autograd has accumulated by then; "
                         f"read gradients outside the forward")
        return grad.__get__(tensor)

    def assign(tensor, value):
        where = model_caller(1)
        if where:
            found.append(f"it sets a gradient (`.grad`) at {where}; clear or set gradients {_OUTSIDE}")
        grad.__set__(tensor, value)

    def clear(tensor):
        assign(tensor, None)

    def changed(tensor, value: bool, depth: int) -> None:
        # A parameter's or an input's: an activation's flag is the graph's own
        # (transformers' `enable_input_require_grads` turns it on for the embeddings' output).
        given = not isinstance(tensor, torch.nn.Parameter) and _traced_input(tensor)
        if not (isinstance(tensor, torch.nn.Parameter) or given) or bool(value) == flag.__get__(tensor):
            return
        where = model_caller(depth + 1)
        if where and given:
            found.append(f"it turns requires_grad {'on' if value else 'off'} for an input at {where}: "
                         f"the graph is traced for inputs as the caller passes them, and gives them no "
                         f"gradient it was not lowered for; set it on the input before the call "
                         f"(`x.requires_grad_()`, then remat-ir plans for it)")
        elif where:
            found.append(f"it turns requires_grad {'on' if value else 'off'} for a parameter at "
                         f"{where}, {_FLAGS}")

    def set_flag(tensor, value):
        changed(tensor, value, 1)
        flag.__set__(tensor, value)

    def requires_grad_(tensor, requires_grad=True):
        changed(tensor, requires_grad, 1)
        return tensor_requires_grad(tensor, requires_grad)

    def modules_requires_grad(module, requires_grad=True):
        where = model_caller(1)
        if where and any(p.requires_grad != requires_grad for p in module.parameters()):
            found.append(f"it turns requires_grad {'on' if requires_grad else 'off'} for "
                         f"{type(module).__name__}'s parameters at {where}, {_FLAGS}")
        return module_requires_grad(module, requires_grad)

    def zero_grad(original):
        def call(self, *args, **kwargs):
            where = model_caller(1)
            if where:
                found.append(f"it clears gradients (`zero_grad()`) at {where}; clear them {_OUTSIDE}")
            return original(self, *args, **kwargs)
        return call

    own = {name: vars(torch.Tensor)[name] for name in ("grad", "requires_grad", "requires_grad_")
           if name in vars(torch.Tensor)}   # none in torch 2.13: TensorBase's, shadowed
    torch.Tensor.grad = property(read, assign, clear, doc=grad.__doc__)
    torch.Tensor.requires_grad = property(flag.__get__, set_flag, doc=flag.__doc__)
    torch.Tensor.requires_grad_ = requires_grad_
    torch.nn.Module.requires_grad_ = modules_requires_grad
    torch.nn.Module.zero_grad = zero_grad(module_zero_grad)
    torch.optim.Optimizer.zero_grad = zero_grad(optimizer_zero_grad)
    try:
        yield
    finally:
        for name in ("grad", "requires_grad", "requires_grad_"):
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)
        torch.nn.Module.requires_grad_ = module_requires_grad
        torch.nn.Module.zero_grad = module_zero_grad
        torch.optim.Optimizer.zero_grad = optimizer_zero_grad
