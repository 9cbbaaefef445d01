"""Saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`, `save_on_cpu`) and a
remat-ir step.

A pack hook sees each tensor autograd saves for the backward and may keep it elsewhere or
otherwise (on the host, cast, quantized); its unpack hook gives it back. A remat-ir step
keeps what its plan decides outside autograd's saved tensors, so no such hook sees it:
neither the hooks a forward sets (torch.export drops them) nor those around the call (the
runtime's autograd nodes save only the outputs the backward reads). A hook that changes
values then gave gradients other than eager's, silently (a bfloat16 pack hook: weight
gradients 2e-4 off eager's, 2026-11-30 sweep), and one that moves them (an offloader)
moved nothing. `save_on_cpu` keeps values exactly: the step trains as eager does, and
the user is told once that the plan, not the hook, decides what stays on the device.
Other hooks are refused, since nothing tells whether they keep values.
"""

from __future__ import annotations

import torch

#: What a step does instead of the hooks, for the messages of the frontend and runtime.
INSTEAD = ("remat-ir's plan decides what the step keeps for the backward, within its "
           "budget (remat_ir.remat(..., offload=True) keeps some of it in host memory)")


def is_save_on_cpu(pack_hook) -> bool:
    """Whether `pack_hook` is `torch.autograd.graph.save_on_cpu`'s, which keeps values exactly."""
    return getattr(pack_hook, "__qualname__", "").startswith("save_on_cpu.")


def is_checkpoint(pack_hook) -> bool:
    """Whether `pack_hook` is non-reentrant `torch.utils.checkpoint`'s (a `checkpoint_wrapper`
    too): named apart, since the hook's name says checkpoint only deep inside."""
    return getattr(pack_hook, "__module__", None) == "torch.utils.checkpoint"


def allows_mutation_on_saved(pack_hook) -> bool:
    """Whether `pack_hook` is `torch.autograd.graph.allow_mutation_on_saved_tensors()`'s, which
    clones a saved tensor before an in-place write: named apart, since its hook's name
    (`_swap_with_cloned`) does not say what the user wrote."""
    return getattr(pack_hook, "__qualname__", "").startswith("_swap_with_cloned.")


def active_pack_hook():
    """The innermost pack hook set around this point (None where none is)."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return hooks[0] if hooks else None


def hook_name(pack_hook) -> str:
    """'module.qualified_name' of a pack hook, for messages."""
    module = getattr(pack_hook, "__module__", None)
    name = getattr(pack_hook, "__qualname__", type(pack_hook).__qualname__)
    return f"{module}.{name}" if module else name
