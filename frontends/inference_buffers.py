"""Buffers made under `torch.inference_mode()`, traced as ordinary tensors.

A table computed once under inference mode and registered as a buffer (positional
encodings, a frozen encoder's statistics) trains in eager, which reads it like any
tensor; torch.export failed on it with "True != False", which `remat` reported as
"data-dependent control flow" (review AH, 2026-12-02). Lowering reads only the buffer's
shape, dtype, layout and values, so for the trace each is given as a copy made outside
inference mode (one per tensor, so that a buffer two modules share stays shared), and
the buffer is put back after. The step reads the buffer itself, as eager does.
"""

from __future__ import annotations

import contextlib

import torch

from .swapped_parameters import stand_ins


@contextlib.contextmanager
def inference_buffers_as_normal(model: torch.nn.Module):
    """Within: every buffer of `model` that is an inference tensor is a normal copy."""
    copies: dict[int, torch.Tensor] = {}
    swaps = []
    for module in model.modules():
        for name, tensor in module._buffers.items():
            if tensor is not None and tensor.is_inference():
                if id(tensor) not in copies:
                    copies[id(tensor)] = tensor.clone()
                swaps.append((module._buffers, name, tensor, copies[id(tensor)]))
    with stand_ins(swaps):
        yield
