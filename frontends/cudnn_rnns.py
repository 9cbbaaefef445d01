"""Recurrent layers on CUDA with cuDNN on: refused by name, with the way out.

Why: eager's CUDA `nn.LSTM`, `nn.GRU` and `nn.RNN` run cuDNN's RNN (`_cudnn_rnn`), whose
packed weight buffer the trace cannot build: AOTAutograd failed from deep inside
("Attempted to set the storage of a tensor on device "meta" to a storage on different
device "cuda:0"", a GRU in a random network on an H200, 2026-12-04). With cuDNN off,
eager runs the native kernels, which the trace keeps as it keeps the CPU's.
"""

from __future__ import annotations

import torch

from .errors import LoweringError

#: The recurrent ops cuDNN runs, by the module that calls them.
KINDS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}


def refusing_cudnn(name: str, inner):
    """`inner`, the kernel tracing runs for `aten.<name>.input`, raising `LoweringError`
    where eager would run cuDNN's RNN (module docstring)."""
    def kernel(input, *rest):
        if input.device.type == "cuda" and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled:
            stack = (torch.fx.traceback.get_current_meta() or {}).get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            raise LoweringError(
                f"torch.nn.{KINDS[name]}{f' at {path}' if path else ''} on CUDA: eager runs cuDNN's "
                f"RNN, whose packed weights remat-ir's trace cannot build. Lower and train with "
                f"cuDNN off: `with torch.backends.cudnn.flags(enabled=False):` around remat(...) and "
                f"the training loop (eager then runs the native kernels, which the trace keeps)")
        return inner(input, *rest)
    return kernel
