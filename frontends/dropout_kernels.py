"""`dropout` that drops nothing returns its input, as eager's does.

Why: ATen's `dropout` returns the input tensor itself where nothing is dropped (`p == 0`,
`train=False`, an empty input: the same tensor, no copy), and PyTorch's decomposition,
which AOTAutograd traces, returns `input.clone()`. A forward writing in place into the
output (`y = self.drop(h); y.mul_(2)`, with `nn.Dropout(0.0)`, the default of many
transformers configs, or in eval mode) changes `h` in eager and a copy in the graph: 1.5e5
off after three steps, silently; and the copy is memory eager never holds (a store-everything
peak 2-7% above eager's on a ViT, an MLP and T5: hunt86 F3).

So while AOTAutograd traces, `aten.dropout` (its CompositeImplicitAutograd kernel, which
functionalization decomposes it with) returns its input where
nothing is dropped, and is PyTorch's decomposition otherwise (`native_dropout`, which
`dropout_masks.py` splits into a mask and a product on CPU).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey
from torch._decomp import decompositions

_aten = torch.ops.aten


def _dropout(input: torch.Tensor, p: float, train: bool | None) -> torch.Tensor:
    """ATen's `dropout` (module docstring)."""
    if not train or p == 0 or input.numel() == 0:
        return input
    return decompositions.dropout(input, p, train)


#: The kernel `frontends/torch.py` installs while tracing.
KERNELS = {_aten.dropout.default: _dropout}
KEY = DispatchKey.CompositeImplicitAutograd
