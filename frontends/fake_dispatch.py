"""Every op tracing computes, seen where fake tensors compute it.

torch.export and AOTAutograd both trace with fake tensors, and every op of both passes
through `FakeTensorMode.dispatch`, after autocast and functionalization have done their
part: the place for rewrites that must see what tracing computes, op by op, and change
what it answers (`kernel_layouts.traced_as_run`: real kernels' layouts;
`certain_draws`: comparisons a draw's range decides).
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
