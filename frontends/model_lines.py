"""Where in the user's code something happened: the innermost frame outside torch and
remat-ir's frontends, which is the model's own line (a branch on tensor data that
export failed on, a gradient hook put on in the forward)."""

from __future__ import annotations

import os
import traceback

import torch

_SKIPPED = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))


def model_line(frames: list[traceback.FrameSummary]) -> str | None:
    """'file:line in function' of the innermost of `frames` outside torch and the
    frontends, or None if every frame is theirs."""
    found = None
    for frame in frames:
        if not os.path.abspath(frame.filename).startswith(_SKIPPED):
            found = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return found
