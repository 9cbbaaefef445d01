"""Every op tracing computes, seen where fake tensors compute it.

torch.export and AOTAutograd both trace with fake tensors, and every op of both passes
through `FakeTensorMode.dispatch`, after autocast and functionalization have done their
part: the place for rewrites that must see what tracing computes, op by op, and change
what it answers (`kernel_layouts.traced_as_run`: real kernels' layouts;
`certain_draws`: comparisons a draw's range decides). And its cache of answers, which
must not answer an op whose results share storage (`fake_cache_keeping_aliases`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def wrapped_fake_dispatch(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Within: `FakeTensorMode.dispatch` is `wrap(dispatch before)`; put back after. Nested
    wrappers each see what the ones entered before them answer."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    original = FakeTensorMode.dispatch
    FakeTensorMode.dispatch = wrap(original)
    try:
        yield
    finally:
        FakeTensorMode.dispatch = original


#: The fake-tensor dispatch cache lowerings share (`fake_cache_keeping_aliases`): every
#: entry was made while lowering, none for an op whose results share storage.
_LOWERING_FAKE_CACHE: dict = {}


@contextlib.contextmanager
def fake_cache_keeping_aliases():
    """Within: torch's fake-tensor dispatch cache keeps no entry for an op whose results
    share storage with each other, and lowerings share a cache of their own.

    Why: the cache (process-wide, `FakeTensorMode.cache`) makes each result of a cache
    hit from its recorded shape, with a storage of its own, so results that were one
    storage come back as several. oneDNN's LSTM backward (`aten.mkldnn_rnn_layer_backward`)
    returns its bias gradient twice, for `bias_ih` and `bias_hh`: the first lowering in
    a process counted it once and every later one twice, 512 bytes more for a 32-wide
    layer. The graphs then differed in structure and peak, so the smallest feasible
    budget a refusal named for the first was refused on the next lowering of the same
    model, which neither found the plan remembered for it (`solvers.known_floor`, by
    structure) nor could fit it (found by a review: 421,012 bytes named, 421,524
    needed). Such ops now compute their results each time, as the first lowering did;
    the lowerings' own cache leaves out entries other tracing (torch.compile) made
    before, which may have split such results already. Where torch's cache does not
    look as expected (another version), it is off while lowering: slower tracing, the
    same graphs."""
    import torch
    from torch._subclasses import fake_tensor

    mode = fake_tensor.FakeTensorMode
    make_entry = getattr(mode, "_make_cache_entry", None)
    bypass = getattr(fake_tensor, "_BypassDispatchCache", None)
    if make_entry is None or bypass is None or not isinstance(getattr(mode, "cache", None), dict):
        import torch._dynamo.config as dynamo_config

        with dynamo_config.patch(fake_tensor_cache_enabled=False):
            yield
        return

    def entry_unless_aliased(self, state, key, func, args, kwargs, output):
        if isinstance(output, tuple):
            storages = [o.untyped_storage()._cdata for o in output
                        if isinstance(o, torch.Tensor) and o.layout == torch.strided]
            if len(set(storages)) < len(storages):
                raise bypass("results share storage")
        return make_entry(self, state, key, func, args, kwargs, output)

    cache = mode.cache
    mode._make_cache_entry, mode.cache = entry_unless_aliased, _LOWERING_FAKE_CACHE
    try:
        yield
    finally:
        mode._make_cache_entry, mode.cache = make_entry, cache
