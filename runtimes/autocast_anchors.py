"""Autocast's cast cache across calls: one cast of a parameter per `torch.autocast` block.

Under autocast with its cache on (the default), eager casts a float32 leaf that needs a
gradient (a parameter) once, at its first reader, and keeps that cast until the
outermost `torch.autocast` block ends. Every reader in the block reads it, the readers
of a module called twice included (two views of a batch, multi-crop training, a
siamese tower): their gradient parts add up in the cast's buffer, in the autocast
dtype and in the order they arrive, and are cast back to float32 once. A module that
cast the parameter in its own graph on each call would hand over two float32
gradients, summed in float32 by `AccumulateGrad`: other bits (bfloat16 weights of a
module called twice were 2e-3 to 4e-3 relative off eager's).

So the graph does not cast back (`Node.autocast_cast_back`, `gradient_parts`): the
backward hands the cast's gradient over, in parts, to the tensor `cast` returns for the
parameter, which stands for the block's cast. It is made by `_Cast`, whose backward
casts back once, as eager's `ToCopyBackward` does; it holds no memory (a zero-stride
tensor of the cast's shape and dtype: autograd only checks gradients against its
metadata), and the graph still computes, frees and recomputes its own cast as planned.

Which block a call runs in is told by autocast's own cache: a probe leaf is cast by a
1x1 product, and the probe cast's autograd node stays the same until the cache is
cleared (the block ends, or `torch.clear_autocast_cache()`). The casts are kept per
thread, as eager's cache is, and shared by every scheduled module (a weight tied
between two of them is cast once per block, as in eager).
"""

from __future__ import annotations

import threading
import weakref

import torch

from remat_ir.torchlib.types import autocast_caches


class _Cast(torch.autograd.Function):
    """Stands for autocast's cast of a tensor: backward casts the summed gradient back."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dtype: torch.dtype):
        ctx.dtype = tensor.dtype
        return torch.empty_strided(tensor.shape, (0,) * tensor.dim(), dtype=dtype,
                                   device=tensor.device)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


class _Block(threading.local):
    """This thread's casts in the current autocast block."""

    def __init__(self):
        self.probes: dict[torch.device, torch.Tensor] = {}
        self.marker = None   # the probe cast's autograd node when `casts` were made
        self.casts: dict[tuple[int, torch.dtype], tuple[weakref.ref, torch.Tensor]] = {}

    def current(self, device: torch.device) -> None:
        """Forget the casts if autocast's cache was cleared since they were made."""
        probe = self.probes.get(device)
        if probe is None:
            probe = self.probes[device] = torch.zeros(1, 1, device=device, requires_grad=True)
        with torch.enable_grad():
            marker = torch.mm(probe, probe).grad_fn.next_functions[0][0]
        if marker is not self.marker:
            self.marker, self.casts = marker, {}


_BLOCK = _Block()


def casts(tensors: list[torch.Tensor], dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    """The tensors standing for autocast's casts of `tensors` to `dtypes` in the current
    block (call under the autocast the graph was traced in): for each, the same one for
    every call in the block where eager's cache would keep the cast, else a new one
    (eager casts such a tensor per reader: the graph's own cast is then the call's)."""
    if tensors:
        _BLOCK.current(tensors[0].device)
    made = []
    for tensor, dtype in zip(tensors, dtypes):
        if not autocast_caches(tensor):
            made.append(_Cast.apply(tensor, dtype))
            continue
        key = (id(tensor), dtype)
        held = _BLOCK.casts.get(key)
        if held is None or held[0]() is not tensor:
            held = _BLOCK.casts[key] = (weakref.ref(tensor), _Cast.apply(tensor, dtype))
        made.append(held[1])
    return made
