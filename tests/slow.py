"""The split between `make test` (CI, kept near ten minutes on two cores) and
`make test-all` (every test: run it before a change to lowering, solvers or the
runtime lands, and after one that touches a model family).

A test marked `slow` repeats what a faster test already covers, on a bigger model
or one more family: each zoo model keeps at least one exactness test in
`make test` (the budget sweep of `test_zoo.py` or the offloading of
`test_offload.py`), and each ONNX zoo kind (plain, refused at half, trained) keeps
one graph. What stays in `make test` searches (the hypothesis tests) or is the
only test of its capability.
"""

from __future__ import annotations

import pytest


def some_slow(values, slow) -> list:
    """`values` for `pytest.mark.parametrize`, those in `slow` marked `slow`."""
    slow = set(slow)
    unknown = slow - set(values)
    assert not unknown, f"marked slow but not parametrized: {sorted(unknown)}"
    return [pytest.param(v, marks=pytest.mark.slow) if v in slow else v for v in values]
