"""Values a forward reads that are not plain (bool, int, float, str, None) but that tracing
bakes into the graph as surely: an enum member it branches on (`if self.mode is
Mode.SUM`), a numpy scalar it scales by (`self.temperature = np.float32(0.5)`), a dtype it
casts to (`x.to(self.compute_dtype)`). Changed after lowering, each trained on with the
traced value, silently, since only plain values were recorded
(`frontends/traced_reads.py`); they are recorded by a text that names them the same in
every process, `{DESCRIBED: text}`, which the runtime compares (`runtimes/traced_reads.py`)."""

from __future__ import annotations

import enum
import sys
import uuid

import torch

#: The key of a recorded value given by its description: {DESCRIBED: text}.
DESCRIBED = "described"
#: The key of an enum member's class as this process knows it: {DESCRIBED: text, CLASS:
#: `class_identity`}. A class defined again (a notebook cell run again, `importlib.reload`)
#: names its members as the old one did, but `member is Mode.SUM` tells them apart: a
#: forward holding an old member and comparing it with the new class's took the other
#: branch in eager while the text matched (found by a review: 0.92 off, silently).
CLASS = "class"
#: This process: an identity recorded here means nothing in another one.
_PROCESS = uuid.uuid4().hex


def described(value) -> str | None:
    """The text naming `value` where it is of a kind above, else None: an enum member by
    its class and name, a numpy scalar by its type and value, a dtype by its name."""
    if isinstance(value, enum.Enum):
        kind = type(value)
        return f"{kind.__module__}.{kind.__qualname__}.{value.name}"
    if isinstance(value, torch.dtype):
        return str(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return f"numpy.{type(value).__name__}({value.item()!r})"
    return None


def class_identity(value) -> str | None:
    """For an enum member, its class as this process knows it (`CLASS`), else None."""
    return f"{_PROCESS}:{id(type(value))}" if isinstance(value, enum.Enum) else None


def same_class(value, recorded: str | None) -> bool:
    """Whether `value`'s class is the one `recorded` (`class_identity`) names, where that
    was recorded in this process (in another one, the text alone is compared)."""
    return recorded is None or not recorded.startswith(_PROCESS) or class_identity(value) == recorded
