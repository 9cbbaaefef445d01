"""Every generator a step may draw from, put back after work that is not a step.

Profiling, timing and planning run a graph's ops, or whole steps, that training never
runs: the numbers they draw must not move the generators the user's next step draws
from. Torch's (CPU, and the CUDA devices worked on) are kept by `torch.random.fork_rng`;
a step also draws from NumPy's global generator (transformers' SpecAugment masks,
`torchlib/spec_augment.py`), and Python's is kept alike, so that a user seeding any of
them gets eager's numbers after `remat`."""

from __future__ import annotations

import contextlib
import random
import sys

import torch


@contextlib.contextmanager
def generators_kept(devices=()):
    """Within: draw freely; after: torch's generators (CPU and `devices`'), Python's and
    NumPy's global generators are as they were before."""
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=list(devices)):
            yield
    finally:
        random.setstate(python)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
