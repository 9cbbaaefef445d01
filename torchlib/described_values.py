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

import torch

#: The key of a recorded value given by its description: {DESCRIBED: text}.
DESCRIBED = "described"
#: The key of a recorded container held in a container: {NESTED: [[key, value], ...]}
#: (`frontends/traced_reads.py` `plain_items`).
NESTED = "items"
#: The key under which a container's length is recorded among its items.
LENGTH = "length"
#: The key of a recorded method of a global object: {FUNCTION: its description}
#: (`torchlib.callables.describe`, which shows what the object holds).
FUNCTION = "function"


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

