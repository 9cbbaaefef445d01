"""Attention kernels a forward picks for a part of itself (`with sdpa_kernel(SDPBackend.MATH):`
around one `F.scaled_dot_product_attention`, as diffusers' `_native_math` attention
backend does), traced as eager runs them.

torch.export keeps `scaled_dot_product_attention` as one op, and AOTAutograd picks its
kernel when it builds the joint graph, after the forward's block has ended: the graph
ran the call's kernel (the CPU flash one) where eager ran the math one, and every
gradient was 3.7e-9 off eager's, silently (found by hunt55). Where the kernels allowed at
the op differ from those of the whole call, the op is decomposed as it is traced, under
the forward's own settings, so the graph holds the ops that kernel runs. Under autocast,
so decomposed, bfloat16 gradients came out 6e-5 off eager's, as they did undecomposed,
where the forward's kernels pick the math one: refused there, naming the line
(`sdpa_kernel` around the call is exact). Kernels set
around the whole call are the call's own and part of its signature
(`runtimes/signatures.py`).
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

from remat_ir.torchlib.types import sdpa_flags

from .model_lines import is_model_file


#: The attention op as a forward calls it: the function, or ATen's op itself (hunt57:
#: `torch.ops.aten.scaled_dot_product_attention(q, k, v)` under the forward's
#: `sdpa_kernel(MATH)` ran the call's kernel, 3.7e-9 off eager's gradients, silently).
_ATTENTION = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention,
              torch.ops.aten.scaled_dot_product_attention.default)


class _OwnKernels(TorchFunctionMode):
    """Decomposes `scaled_dot_product_attention` where the forward allows other kernels
    than `caller` (`sdpa_flags` at the start of the call); notes in `found` such an op
    under autocast."""

    def __init__(self, caller: tuple, found: list[str]):
        super().__init__()
        self.caller, self.found = caller, found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _ATTENTION or sdpa_flags() == self.caller:
            return func(*args, **kwargs)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        if torch.is_autocast_enabled(device):
            if _eagers_choice(device, args, kwargs) not in (None, int(SDPBackend.MATH)):
                # A fused kernel, the one the call picks as well (`sdpa_kernel([FLASH, MATH])`):
                # traced as one op, as it was, exact (refused, found by hunt57).
                return func(*args, **kwargs)
            self.found.append(
                f"it picks attention kernels for a part of the forward under autocast (`sdpa_kernel` around "
                f"scaled_dot_product_attention at {_place()}): the graph would not compute them as eager does; "
                f"set `sdpa_kernel` around the call instead")
            return func(*args, **kwargs)
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(*args, **kwargs)


def _eagers_choice(device: str, args: tuple, kwargs: dict) -> int | None:
    """The kernel (an `SDPBackend` value) eager's call picks under the settings now, its
    floating-point inputs cast as autocast casts them; asked of real empty tensors, as a
    fake one is answered the math kernel whatever the settings; None where it cannot be
    told."""
    from torch.utils._python_dispatch import _disable_current_modes

    low = torch.get_autocast_dtype(device)

    def real(value):
        if not isinstance(value, torch.Tensor):
            return value
        dtype = low if value.is_floating_point() and value.dtype != torch.float64 else value.dtype
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype,
                                   device=value.device).requires_grad_(value.requires_grad)

    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.autocast(device, enabled=False):
            return int(torch._fused_sdp_choice(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()}))
    except Exception:   # noqa: BLE001 - not told: refused as before
        return None


def _place() -> str:
    """'file:line' of the nearest frame running the model's code."""
    frame = sys._getframe(2)
    while frame is not None and not is_model_file(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "an unknown line"


@contextlib.contextmanager
def tracing_own_sdpa_kernels(found: list[str]):
    """While the block traces, decompose each attention op whose kernels the forward
    picked itself, or note it in `found` (module docstring)."""
    with _OwnKernels(sdpa_flags(), found):
        yield
