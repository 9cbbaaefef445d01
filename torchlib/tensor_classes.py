"""Tensor subclasses that change what torch functions do to their tensors.

remat-ir traces and runs plain tensors: a parameter, buffer or input of a class with a
`__torch_function__` of its own (a weight class emulating quantization, a tensor
tagging what it flows through) computes otherwise in eager, and what its class does is
not in the graph (0.36 off eager's output, a review). The frontend refuses one at
lowering (`frontends/torch.py`); the runtime refuses one put in a parameter's or
buffer's place after lowering (hunt66: trained on as a plain tensor, 0.06 off eager's
gradients, silently). One place for the test, so both ask the same question.
"""

from __future__ import annotations

import functools

import torch


def changes_torch_functions(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s class changes what torch functions do to it (a `__torch_function__`
    of its own; not DTensor's or Parameter's, which turn it off, nor a lazy module's
    parameter not made yet, which `check_lazy_modules` names)."""
    return _class_changes_torch_functions(type(tensor))


@functools.lru_cache(maxsize=256)
def _class_changes_torch_functions(kind: type) -> bool:
    if issubclass(kind, torch.nn.parameter.UninitializedTensorMixin):
        return False
    function = kind.__torch_function__
    return function is not torch._C._disabled_torch_function_impl and \
        getattr(function, "__func__", None) is not torch.Tensor.__torch_function__.__func__
