"""Ops whose result's size the caller's inputs decide, traced with eager's size.

`torch.repeat_interleave(sizes, counts)` with counts from an input (Qwen2-VL's patches
per image, from the image grid the caller passes), `x[mask]` and `nonzero(mask)` with a
mask computed from an input alone (BEiT's masked-image loss over `bool_masked_pos`,
GLPN's loss over the depth labels above 0, X-MOD's language ids): a graph has fixed
shapes, and fake tensors refuse each op (`value_dependent.py`). Here, where the integers
that decide the size are computed from the caller's inputs by ops that draw nothing,
eager's size for the example inputs is read (`input_branches`: recorded as an integer
guard, asked again at every call, and a call of another size gets a graph of its own),
and the op is traced in its fixed-size form, which computes from the call's own values:
`repeat_interleave(..., output_size=n)` (only the counts' sum read), `nonzero_static(mask,
size=n)`, and `x[mask]`
as `x[nonzero_static(mask, size=n).unbind(1)]`, which is what PyTorch indexes with for a
boolean mask. Only the count of a mask is read and guarded, not its values: a masked
loss over a new random mask of the same size runs the same graph.

Where the integers read a parameter, a buffer or an activation, nothing is read, and the
op reaches fake tensors' refusal as before.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

#: The functions traced in their fixed-size form, by what they are.
_REPEATS = {torch.repeat_interleave, torch.Tensor.repeat_interleave}
_NONZERO = {torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere}
_MASKS = (torch.bool, torch.uint8)


class InputSizes(TorchFunctionMode):
    """While tracing: the ops of the module docstring traced in their fixed-size form,
    where `read(tensor)` gives eager's integers of a tensor computed from the caller's
    inputs (recording the guard), else None."""

    def __init__(self, read):
        super().__init__()
        self.read = read

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _REPEATS:
            sized = self._repeated(func, args, kwargs)
        elif func in _NONZERO:
            sized = self._nonzero(func, args, kwargs)
        elif func is torch.Tensor.__getitem__:
            sized = self._indexed(args)
        elif func is torch.masked_select or func is torch.Tensor.masked_select:
            sized = self._selected(args, kwargs)
        else:
            sized = None
        return func(*args, **kwargs) if sized is None else sized()

    def _count(self, mask) -> int | None:
        """The number of nonzero elements of a tensor computed from the caller's inputs, as
        eager counts them (recorded), or None."""
        if not isinstance(mask, torch.Tensor):
            return None
        count = self.read(torch.count_nonzero(mask))
        return count if isinstance(count, int) else None

    def _repeated(self, func, args, kwargs):
        names = ("input", "repeats", "dim")
        bound = dict(zip(names, args), **kwargs)
        repeats = bound.get("repeats")
        alone = repeats is None   # repeat_interleave(counts): the indices
        counts = bound["input"] if alone else repeats
        if kwargs.get("output_size") is not None or not isinstance(counts, torch.Tensor) or \
                counts.dim() > 1:
            return None
        if alone or counts.numel() != 1:
            # Only their sum decides the size: the graph repeats by the call's own counts.
            size = self.read(counts.sum())
        else:   # one count for every element along `dim` (or of the flattened input)
            count = self.read(counts.reshape(()))
            source, dim = bound["input"], bound.get("dim")
            size = None if count is None else count * (source.numel() if dim is None else source.shape[dim])
        if not isinstance(size, int):
            return None
        return lambda: func(*args, **{**kwargs, "output_size": size})

    def _nonzero(self, func, args, kwargs):
        mask = args[0] if args else kwargs.get("input")
        count = self._count(mask)
        if count is None:
            return None

        def sized():
            found = torch.nonzero_static(mask, size=count)
            return found.unbind(1) if kwargs.get("as_tuple") else found
        return sized

    def _indexed(self, args):
        source, index = args
        parts = index if isinstance(index, tuple) else (index,)
        if not any(isinstance(p, torch.Tensor) and p.dtype in _MASKS for p in parts):
            return None
        counts = [self._count(p) if isinstance(p, torch.Tensor) and p.dtype in _MASKS else None
                  for p in parts]
        if any(c is None for c, p in zip(counts, parts) if isinstance(p, torch.Tensor) and p.dtype in _MASKS):
            return None

        def sized():
            expanded = []
            for part, count in zip(parts, counts):
                if count is None:
                    expanded.append(part)
                elif part.dim() == 0:   # a 0-d mask adds a dimension of 0 or 1: as torch does
                    return source[index]
                else:   # the mask's positions, one index tensor per dimension it covers
                    expanded.extend(torch.nonzero_static(part, size=count).unbind(1))
            return source[tuple(expanded)]
        return sized

    def _selected(self, args, kwargs):
        bound = dict(zip(("input", "mask"), args), **kwargs)
        source, mask = bound["input"], bound["mask"]
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return None
        # Each expanded alone: a count reading the source too (`broadcast_tensors` is one
        # op of both) would read an activation.
        shape = torch.broadcast_shapes(source.shape, mask.shape)
        source, mask = source.expand(shape), mask.expand(shape)
        count = self._count(mask)
        if count is None:
            return None
        return lambda: source[torch.nonzero_static(mask, size=count).unbind(1)]
