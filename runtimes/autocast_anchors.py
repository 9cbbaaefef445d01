"""Autocast's cast cache across calls: one cast of a parameter per `torch.autocast` block.

Under autocast with its cache on (the default), eager casts a float32 leaf that needs a
gradient (a parameter) once, at its first reader, and keeps that cast until the
outermost `torch.autocast` block ends. Every reader in the block reads it, the readers
of a module called twice included (two views of a batch, multi-crop training, a
siamese tower): their gradient parts add up in the cast's buffer, in the autocast
dtype and in the order they arrive, and are cast back to float32 once. A module that
cast the parameter in its own graph on each call would hand over two float32
gradients, summed in float32 by `AccumulateGrad`: other bits (bfloat16 weights of a
module called twice were 2e-3 to 4e-3 relative off eager's).

So the graph does not cast back (`Node.autocast_cast_back`, `gradient_parts`): the
backward hands the cast's gradient over, in parts, to a tensor `casts` returns for the
parameter, which stands for the block's cast. Its node (`_Casts`) casts back once, as
eager's `ToCopyBackward` does, after every call of the block has handed its parts. The
tensor holds no memory (zero strides: autograd checks a gradient against its shape and
dtype only), and the graph still computes, frees and recomputes its own cast as planned.
One node stands for the casts of a run of the parameters whose gradients a call finishes
in the same group (`SegmentPlan.gradient_groups`), the run holding at most the bytes of
the group's largest cast (`_chunks`: a node's low-precision gradients live until it has
made their float32 casts, which the plan does not count for more than one parameter): a
Python autograd node per parameter cost 34 us per parameter and call on 2 CPU cores,
one per group 12 to 16 (`benchmarks/autocast_casts.py`).

Which block a call runs in is told by autocast's own cache: a probe leaf is cast by a
1x1 product, and the probe cast's autograd node stays the same until the cache is
cleared (the block ends, or `torch.clear_autocast_cache()`). The casts are kept per
thread, as eager's cache is, and shared by every scheduled module (a weight tied
between two of them is cast once per block, as in eager).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref

import torch

from remat_ir.torchlib.types import autocast_caches


class _Casts(torch.autograd.Function):
    """Stands for autocast's casts of tensors: backward casts their summed gradients back."""

    @staticmethod
    def forward(ctx, dtypes: tuple, *tensors: torch.Tensor):
        ctx.dtypes = [t.dtype for t in tensors]
        ctx.set_materialize_grads(False)
        return tuple(torch.empty_strided(t.shape, (0,) * t.dim(), dtype=d, device=t.device)
                     for t, d in zip(tensors, dtypes))

    @staticmethod
    def backward(ctx, *grads):
        return (None, *(g.to(d) if g is not None else None for g, d in zip(grads, ctx.dtypes)))


class _Block(threading.local):
    """This thread's casts in the current autocast block."""

    def __init__(self):
        self.probes: dict[torch.device, torch.Tensor] = {}
        self.marker = None   # the probe cast's autograd node when `casts` were made
        #: (id of a tensor, autocast dtype) -> (the tensor, weakly; the tensor standing for
        #: its cast); dtype None: the tensor was read in the block (`warn_if_read_again`).
        self.casts: dict[tuple[int, torch.dtype | None], tuple[weakref.ref, torch.Tensor | None]] = {}

    def current(self, device: torch.device) -> None:
        """Forget the casts if autocast's cache was cleared since they were made."""
        probe = self.probes.get(device)
        if probe is None:
            probe = self.probes[device] = torch.zeros(1, 1, device=device, requires_grad=True)
        with torch.enable_grad(), _casting(device):
            marker = torch.mm(probe, probe).grad_fn.next_functions[0][0]
        if marker is not self.marker:
            self.marker, self.casts = marker, {}


_BLOCK = _Block()


def _casting(device: torch.device):
    """Autocast and its cache on for the probe: a call inside a block of the caller's
    entered disabled (`torch.autocast(..., enabled=False)`), or with its cache off, has
    casts of its own blocks in that block's cache (`frontends/autocast_blocks.py`), and
    a product outside autocast casts no probe (one with the cache off caches none), so
    every block would have looked like the first, or every call like a new block.
    Entered inside the caller's block, its end clears no cache."""
    if torch.is_autocast_enabled(device.type) and torch.is_autocast_cache_enabled():
        return contextlib.nullcontext()
    return torch.autocast(device.type, cache_enabled=True)


@contextlib.contextmanager
def calls_forgotten():
    """Within: calls whose casts and reads the block forgets afterwards (remat-ir's own
    timed calls, at `remat` or at a new plan, made inside the caller's `torch.autocast`
    block): found by a review, the caller's first call in the block was warned of a weight
    read again (`warn_if_read_again`), and took the timed calls' casts for its own."""
    saved = _BLOCK.marker, dict(_BLOCK.casts)
    try:
        yield
    finally:
        _BLOCK.marker, _BLOCK.casts = saved


def casts(groups: list[list[tuple[torch.Tensor, torch.dtype]]]) -> list[list[torch.Tensor]]:
    """Per group of (tensor, autocast dtype), the tensors standing for autocast's casts of
    them in the current block (call under the autocast the graph was traced in): the same
    as an earlier call's in the block where eager's cache keeps the cast, else new ones,
    made by one node per group. A tensor eager's cache skips (not a leaf) gets a new one
    each call: eager casts it per reader."""
    first = next((t for group in groups for t, _ in group), None)
    if first is None:
        return [[] for _ in groups]
    _BLOCK.current(first.device)
    made = []
    for group in groups:
        found = [_BLOCK.casts.get((id(t), d)) for t, d in group]
        found = [held[1] if held is not None and held[0]() is t else None
                 for held, (t, _) in zip(found, group)]
        missing = [i for i, f in enumerate(found) if f is None]
        for chunk in _chunks(missing, group):
            new = _Casts.apply(tuple(group[i][1] for i in chunk), *(group[i][0] for i in chunk))
            for i, cast in zip(chunk, new):
                tensor, dtype = group[i]
                found[i] = cast
                if autocast_caches(tensor):
                    _BLOCK.casts[(id(tensor), dtype)] = (weakref.ref(tensor), cast)
        made.append(found)
    return made


def _chunks(indices: list[int], group: list[tuple[torch.Tensor, torch.dtype]]) -> list[list[int]]:
    """`indices` of `group` in runs whose casts hold at most as many bytes as its largest
    one: a node's gradients in the autocast dtype live until it returns, beside the
    float32 ones it makes, where the plan counts one cast back at a time. One node for a
    whole group (one group: every parameter, the default on one process) peaked 38% above
    the plan on a 6-layer MLP under bfloat16; in these runs, within 0.1% (as with a node
    per parameter, which costs twice the time)."""
    if not indices:
        return []
    size = {i: group[i][0].numel() * group[i][1].itemsize for i in indices}
    limit = max(size.values())
    chunks, current, held = [], [], 0
    for i in indices:
        if current and held + size[i] > limit:
            chunks.append(current)
            current, held = [], 0
        current.append(i)
        held += size[i]
    return chunks + [current]


def warn_if_read_again(tensors: dict[str, torch.Tensor]) -> None:
    """Warn if a call reads, in an autocast block where it was read before, a tensor that
    autocast casts and the graph also reads otherwise (`tensors`: by graph input name; a
    weight tied between an embedding and a head): its cast back stays in the graph, so
    the calls' parts are summed in float32 where eager sums the cast's parts first, in
    the autocast dtype (it may differ from eager's by the autocast dtype's rounding: 1e-3 relative and more in bfloat16)."""
    first = next(iter(tensors.values()), None)
    if first is None:
        return
    _BLOCK.current(first.device)
    again = []
    for name, tensor in tensors.items():
        held = _BLOCK.casts.get((id(tensor), None))
        if held is not None and held[0]() is tensor:
            again.append(name)
        else:
            _BLOCK.casts[(id(tensor), None)] = (weakref.ref(tensor), None)
    if again:
        warnings.warn(f"{', '.join(again[:3])}{' and more' if len(again) > 3 else ''}: read again "
                      f"in one `torch.autocast` block (a scheduled module called again in "
                      f"it) both through autocast's cast and directly, its gradient is summed "
                      f"in float32 where eager sums the cast's parts in the autocast dtype "
                      f"first (it may differ from eager's by the autocast dtype's rounding: 1e-3 relative and more in bfloat16); one call per autocast block "
                      f"is bitwise", stacklevel=7)  # the caller of the module
