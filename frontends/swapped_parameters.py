"""Parameters that `torch.func.functional_call` swapped for plain tensors, traced as parameters.

`functional_call(scheduled, {"fc.weight": t}, x)` puts `t` (a tensor, often no
`nn.Parameter`: MAML's fast weights, a hypernetwork's output) in the module's
parameter slot for the call. The plan then reads it as it reads the parameter, but a
call that needs the model lowered again (a new batch shape, untied weights) made
torch.export's verifier refuse the program: "State dict entry for parameter ... is
not an instance of torch.nn.Parameter", though eager runs it. Lowering reads only the
slot's shape, dtype, layout and values, so for the trace each such tensor is given as
a parameter sharing its storage (one per tensor, so that ties stay ties), and the
tensor is put back after.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def swapped_parameters_as_parameters(model: torch.nn.Module):
    """Within: every parameter slot of `model` holding a plain tensor holds an
    `nn.Parameter` aliasing it instead (same storage, strides and `requires_grad`)."""
    aliases: dict[int, torch.nn.Parameter] = {}
    swaps = []
    for module in model.modules():
        for name, tensor in module._parameters.items():
            if tensor is None or isinstance(tensor, torch.nn.Parameter):
                continue
            if id(tensor) not in aliases:
                aliases[id(tensor)] = torch.nn.Parameter(tensor.detach(), tensor.requires_grad)
            swaps.append((module._parameters, name, tensor, aliases[id(tensor)]))
    with stand_ins(swaps):
        yield


@contextlib.contextmanager
def stand_ins(swaps: list[tuple[dict, str, torch.Tensor, torch.Tensor]]):
    """Within: each (table, name, tensor, stand-in) of `swaps` has the stand-in at
    `table[name]`, for tracing; the tensor is put back after."""
    for table, name, _, stand_in in swaps:
        table[name] = stand_in
    try:
        yield
    finally:
        for table, name, tensor, _ in swaps:
            table[name] = tensor
