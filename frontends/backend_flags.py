"""Kernel settings a forward changes for a part of itself (`with
torch.backends.mkldnn.flags(enabled=False):` around one layer), refused.

The graph's ops run under the settings of the whole call, in the forward and in the
backward alike, while eager's backward runs after the forward's block has ended: a
convolution lowered inside such a block, with oneDNN off in eager's forward and on in its
backward, gave every gradient 3e-5 off eager's (the convolution outside the block too),
under every plan (found by a review). Settings around the whole call are the call's own,
and planned for (`runtimes/backward_settings.py`). Noted where the model's own code asks
for settings other than the caller's (torch.export turns oneDNN and cuDNN off while it
traces, so they are read before tracing starts). oneDNN's and NNPACK's, the CPU kernels':
cuDNN's change nothing on a CPU run, and transformers' CTC loss turns cuDNN off around
itself (`torchlib/ctc_loss.py` keeps that setting for the loss; refused, every `*ForCTC`
model was, found by a review); a cuDNN block inside the forward is not checked yet.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch.backends.mkldnn
import torch.backends.nnpack

from .model_lines import is_model_file

_SETTINGS = ("enabled", "deterministic", "benchmark", "allow_tf32")
_BACKENDS = (torch.backends.mkldnn, torch.backends.nnpack)


def _settings(backend) -> dict:
    return {name: getattr(backend, name) for name in _SETTINGS if hasattr(backend, name)}


@contextlib.contextmanager
def noting_backend_flags(found: list[str]):
    """While the block traces, note in `found` each `flags(...)` or `set_flags(...)` of
    oneDNN or NNPACK that the model's code calls asking for other settings than the
    caller's (module docstring)."""
    callers = {backend: _settings(backend) for backend in _BACKENDS}
    originals = [(backend, name, getattr(backend, name)) for backend in _BACKENDS
                 for name in ("flags", "set_flags")]

    def noted(backend, name, function):
        signature = inspect.signature(function)

        def call(*args, **kwargs):
            frame = sys._getframe(1)
            if frame.f_code.co_filename.endswith("contextlib.py"):   # `with flags(...)`: its caller
                frame = frame.f_back
            if is_model_file(frame.f_code.co_filename):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                asked = {key.lstrip("_"): value for key, value in bound.arguments.items()
                         if value is not None}
                changed = {key: value for key, value in asked.items()
                           if key in callers[backend] and callers[backend][key] != value}
                if changed:
                    settings = ", ".join(f"{key}={value}" for key, value in changed.items())
                    found.append(
                        f"it sets {backend.__name__}.{name}({settings}) at {frame.f_code.co_filename}:"
                        f"{frame.f_lineno}, for a part of the forward: the graph runs its forward and "
                        f"backward under the settings of the whole call (eager's backward runs after "
                        f"the block has ended); set them around the call instead")
            return function(*args, **kwargs)
        return call

    for backend, name, function in originals:
        setattr(backend, name, noted(backend, name, function))
    try:
        yield
    finally:
        for backend, name, function in originals:
            setattr(backend, name, function)
