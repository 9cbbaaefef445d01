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

An integer tensor passed where an op takes integers (`F.pad(x, (left, right))` with
`left` a tensor, as Encodec's and Mimi's convolutions pad by their integer buffers;
`torch.arange(lengths.max())`) is read into one by PyTorch's argument parser, which
fake tensors refuse too: it is read here as eager's integer the same way, wherever no
overload of the op takes a tensor at that place (`torch.add(x, n)` keeps its tensor).
So is the number of classes `F.one_hot(labels)` finds in its labels (their largest).

Where the integers read a parameter or an activation, nothing is read, and the op
reaches fake tensors' refusal as before.
"""

from __future__ import annotations

import functools

import torch
from torch.overrides import TorchFunctionMode

#: The functions traced in their fixed-size form, by what they are.
_REPEATS = {torch.repeat_interleave, torch.Tensor.repeat_interleave}
_NONZERO = {torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere}
_MASKS = (torch.bool, torch.uint8)
#: The integer dtypes whose one-element tensors an op's integer argument reads.
_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: The argument types of an op's schema (`real_type`) that read such a tensor as a number.
_NUMBER_TYPES = {"int", "Optional[int]", "List[int]", "Optional[List[int]]", "number", "Optional[number]"}


class InputSizes(TorchFunctionMode):
    """While tracing: the ops of the module docstring traced in their fixed-size form,
    where `read(tensor)` gives eager's one integer of a one-element tensor computed from
    the caller's inputs (recording the guard), else None."""

    def __init__(self, read):
        super().__init__()
        self.read = read

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _REPEATS:
            sized = self._repeated(func, args, kwargs)
        elif func in _NONZERO:
            sized = self._nonzero(func, args, kwargs)
        elif func is torch.where and len(args) == 1 and not kwargs:
            # `torch.where(mask)` is `mask.nonzero(as_tuple=True)`, which trained: refused
            # as a size taken from data (found by a review).
            sized = self._nonzero(func, args, {"as_tuple": True})
        elif func is torch.Tensor.__getitem__:
            sized = self._indexed(args)
        elif func is torch.masked_select or func is torch.Tensor.masked_select:
            sized = self._selected(args, kwargs)
        elif func is torch.nn.functional.one_hot:
            sized = self._one_hot(args, kwargs)
        else:
            sized = self._numbers(func, args, kwargs)
        return func(*args, **kwargs) if sized is None else sized()

    def _numbers(self, func, args, kwargs):
        """The call with eager's integers in place of the one-element integer tensors it
        passes where the op reads a number (`_number_places`), or None where it passes
        none, or one of them is not computed from the caller's inputs (or shapes)."""
        places = [(key, value) for key, value in (*enumerate(args), *kwargs.items()) if _integer_tensors(value)]
        if not places or not _number_places(getattr(func, "__name__", ""), len(args), [k for k, _ in places]):
            return None
        args, kwargs = list(args), dict(kwargs)
        for key, value in places:
            read = [self.read(v) if _integer_tensor(v) else v for v in value] \
                if isinstance(value, (list, tuple)) else self.read(value)
            if read is None or (isinstance(read, list) and any(item is None for item in read)):
                return None
            if isinstance(key, int):
                args[key] = type(value)(read) if isinstance(value, (list, tuple)) else read
            else:
                kwargs[key] = type(value)(read) if isinstance(value, (list, tuple)) else read
        return lambda: func(*args, **kwargs)

    def _one_hot(self, args, kwargs):
        """`F.one_hot(labels)` with no number of classes, which is the labels' largest
        plus one: eager's, read (found by hunt58: refused as a branch on tensor data,
        where `num_classes=` is the way out the message did not name)."""
        labels = args[0] if args else kwargs.get("tensor")
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        if classes != -1 or not isinstance(labels, torch.Tensor) or labels.numel() == 0:
            return None
        largest = self.read(labels.max())
        if not isinstance(largest, int):
            return None
        return lambda: torch.nn.functional.one_hot(labels, largest + 1)

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


def _integer_tensor(value) -> bool:
    """Whether `value` is a one-element integer tensor (of known sizes: a size a number
    read from data decides, such as `unique`'s, is not compared, which would trace)."""
    return isinstance(value, torch.Tensor) and value.dtype in _INTEGER_DTYPES and all(
        type(size) is int and size == 1 for size in value.shape)


def _integer_tensors(value) -> bool:
    """Whether `value` is a one-element integer tensor, or a list or tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(_integer_tensor(item) for item in value)
    return _integer_tensor(value)


@functools.cache
def _schemas(name: str) -> tuple:
    """The schemas of the aten op `name` (none for a name aten has no op of)."""
    if not name or name.startswith("__"):
        return ()
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return ()
    return tuple(getattr(packet, overload)._schema for overload in packet.overloads())


#: Places where an overload takes a tensor only to read its number: `narrow.Tensor`'s
#: `start` (`.item()`), which Longformer's global attention passes with a length computed
#: from it (`narrow(-1, n, size - n)`, n the most global tokens of a row: refused at
#: both, hunt52).
_READ_AS_NUMBERS = {"narrow": {2, "start"}}


def _number_places(name: str, positional: int, places: list) -> bool:
    """Whether every one of `places` (positions among `positional` arguments, or keyword
    names) of a call of the op `name` takes a number in some overload and a tensor in
    none (or one that reads its number, `_READ_AS_NUMBERS`): there PyTorch reads a tensor
    passed as that number."""
    places = [place for place in places if place not in _READ_AS_NUMBERS.get(name, ())]
    kinds = {place: set() for place in places}
    for schema in _schemas(name):
        ordered = [a for a in schema.arguments if not a.kwarg_only]
        if any(a.is_out for a in schema.arguments) or (positional > len(ordered) and not (
                ordered and str(ordered[-1].real_type) == "List[int]")):   # `view(n, 3)`: a size list
            continue
        for place in places:
            if isinstance(place, int):
                argument = ordered[min(place, len(ordered) - 1)] if ordered else None
            else:
                argument = next((a for a in schema.arguments if a.name == place), None)
            if argument is not None:
                kinds[place].add(str(argument.real_type))
    return all(found & _NUMBER_TYPES and not any("Tensor" in kind for kind in found)
               for found in kinds.values())
