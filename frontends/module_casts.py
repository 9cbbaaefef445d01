"""A module cast inside a forward (`self.classifier = self.classifier.to(self.dtype)`).

transformers' mixture-of-experts routers (SwitchTransformers, NLLB-MoE) cast their
classifier to the router's dtype at every call. Where it already has that dtype the cast
changes nothing in eager, but traced it failed inside `Module._apply` ("Couldn't swap
Linear.weight": torch.export's parameters cannot be swapped), and the error then blamed
another line and advised passing what eager computes (an attention mask, already passed).

While tracing, `Module.to`, `float`, `double`, `half` and `bfloat16` return the module
itself where no parameter or buffer would change dtype or device, as eager's cast leaves
them. A cast that would change one is refused by line: the traced step would hold the
parameters as they were, and a cast copy trains nothing eager's does.
"""

from __future__ import annotations

import contextlib
import traceback

import torch

from .errors import LoweringError
from .model_lines import model_line

#: Casts by method: name -> the dtype it casts floating tensors to (None: `to`'s arguments).
_CASTS = {"to": None, "float": torch.float32, "double": torch.float64, "half": torch.float16,
          "bfloat16": torch.bfloat16}


def _changes(module: torch.nn.Module, device, dtype) -> bool:
    """Whether casting `module` to `device` and `dtype` would change a tensor it holds
    (dtype casts touch floating and complex tensors only, as `Module.to` does)."""
    target = torch.device(device) if device is not None else None
    for tensor in (*module.parameters(), *module.buffers()):
        # `.to("cuda")` leaves a tensor on cuda:0 where it is: no index means any.
        if target is not None and (tensor.device.type != target.type or (
                target.index is not None and tensor.device.index != target.index)):
            return True
        if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()) and tensor.dtype != dtype:
            return True
    return False


@contextlib.contextmanager
def unchanged_module_casts(model_name: str):
    """While the block traces, module casts that change nothing return the module; others
    raise `LoweringError` naming the line (module docstring)."""
    originals = {name: getattr(torch.nn.Module, name) for name in _CASTS}

    def cast(name):
        def method(module, *args, **kwargs):
            layout = None
            if name == "to":
                device, dtype, _, layout = torch._C._nn._parse_to(*args, **kwargs)
            else:
                device, dtype = None, _CASTS[name]
            if layout is None and not _changes(module, device, dtype):
                return module
            where = model_line(traceback.extract_stack()[:-1])
            raise LoweringError(
                f"{model_name}'s forward casts module {type(module).__name__} with .{name}() "
                f"{f'at {where} ' if where else ''}to another dtype, device or memory format: "
                f"the traced step "
                f"would keep its parameters as they are. Cast the model before calling "
                f"remat_ir.remat (or train under torch.autocast)")
        return method

    for name in _CASTS:
        setattr(torch.nn.Module, name, cast(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.nn.Module, name, original)
