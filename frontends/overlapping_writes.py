"""In-place writes whose source overlaps their destination, refused while tracing.

`h[:, 1:] = h[:, :-1]` (a shift), `h[:4, :4] = h[:4, :4].t()`, `h.diagonal(1).copy_(h[0, :5])`:
eager's kernel writes element by element, so a later element may read one it has already
written, in the order the kernel picks; eager raises only where it sees the overlap
cheaply (contiguous rows), not here. The traced graph reads the whole source first: its
results differ, every schedule's (found by a review: outputs 2.3 off, a weight's gradient
24 off, silently). With the source copied first (`.clone()`) eager reads it whole too, and
the graph computes eager's bits, so that is what the refusal asks for.

A torch-function mode looks at each in-place call the model's code makes while it is
traced (`copy_`, `add_` and the like, `__setitem__` with basic indices, the augmented
assignments) for a source tensor that shares the destination's storage, and compares the
elements each one maps (exactly, on index tensors, where their memory ranges meet). A
source that maps each element where the destination does (`h.add_(h)`) is no overlap.
"""

from __future__ import annotations

import contextlib
import traceback

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from .errors import LoweringError
from .model_lines import model_line

#: Beyond this many elements between the lowest and the highest one either maps, the
#: elements are not compared (a bitmap of them is made): the write is let through.
_MAX_EXTENT = 1 << 27
_AUGMENTED = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                        "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})


def _written_and_read(func, args: tuple, kwargs: dict) -> tuple[torch.Tensor, list] | None:
    """(the tensor an in-place call writes, the tensors it reads besides), else None."""
    name = getattr(func, "__name__", "")
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    if name == "__setitem__" and len(args) == 3:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in index):
            return None   # advanced indexing: its target is not a view
        if not (isinstance(args[2], torch.Tensor) and _same_storage(args[0], args[2])):
            return None   # (before indexing, which the trace records)
        return args[0][args[1]], [args[2]]
    in_place = name in _AUGMENTED or (name.endswith("_") and not name.startswith("_"))
    if not in_place or getattr(torch.Tensor, name, None) is not func:
        return None
    read = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.Tensor)]
    return args[0], read


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The lowest and highest element of its storage `t` maps."""
    low = high = t.storage_offset()
    for n, s in zip(t.shape, t.stride()):
        if n > 1:
            high += (n - 1) * s
    return low, high


def overlaps_otherwise(written: torch.Tensor, read: torch.Tensor) -> bool:
    """Whether `read` (broadcast to `written`'s shape) shares an element of its storage with
    `written` that it does not map at the same index."""
    if written.numel() == 0 or read.numel() == 0 or written.element_size() != read.element_size():
        return False
    if not _same_storage(written, read):
        return False
    try:
        read = read.expand(written.shape)
    except RuntimeError:
        return False   # the op refuses the shapes itself
    if read.storage_offset() == written.storage_offset() and all(
            s == t or n == 1 for n, s, t in zip(written.shape, written.stride(), read.stride())):
        return False   # each element from itself
    (w_low, w_high), (r_low, r_high) = _extent(written), _extent(read)
    if w_high < r_low or r_high < w_low:
        return False
    low, high = min(w_low, r_low), max(w_high, r_high)
    if high - low >= _MAX_EXTENT:
        return False
    with torch.utils._python_dispatch._disable_current_modes():
        elements = torch.arange(low, high + 1)
        marked = torch.zeros(high - low + 1, dtype=torch.bool)
        where = elements.as_strided(tuple(written.shape), written.stride(), written.storage_offset() - low)
        marked[where.reshape(-1) - low] = True
        mapped = elements.as_strided(tuple(read.shape), read.stride(), read.storage_offset() - low)
        return bool(marked[mapped.reshape(-1) - low].any())


class _RefusingOverlaps(TorchFunctionMode):
    def __init__(self, model: str):
        super().__init__()
        self.model = model

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = None
        try:
            found = _written_and_read(func, args, kwargs)
            if found is not None and not any(overlaps_otherwise(found[0], t) for t in found[1]):
                found = None
        except Exception:   # noqa: BLE001 - a check that cannot tell lets the call through
            found = None
        if found is not None:
            where = model_line(traceback.extract_stack()[:-1])
            raise LoweringError(
                f"{self.model}'s forward writes into a tensor from an overlapping part of itself "
                f"{f'at {where} ' if where else ''}(Tensor.{getattr(func, '__name__', func)}; a shift "
                f"such as `h[:, 1:] = h[:, :-1]`, a block written from its transpose): eager's "
                f"kernel writes element by element, so later elements may read ones it already "
                f"wrote, where the traced step reads the whole source first, and the two compute "
                f"otherwise. Write from a copy (`h[:, 1:] = h[:, :-1].clone()`): eager then "
                f"computes what the step does")
        return func(*args, **kwargs)


@contextlib.contextmanager
def refusing_overlapping_writes(model: str):
    """While the block traces `model`, an in-place write from an overlapping part of the
    tensor it writes raises LoweringError naming the model's line (module docstring)."""
    with _RefusingOverlaps(model):
        yield
