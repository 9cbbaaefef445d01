"""Generators made without a seed by code a trace runs once (a custom backward's).

A custom backward adding gradient noise from a generator of its own
(`np.random.default_rng().standard_normal(...)`, `random.Random().random()`) moves no
global generator, so comparing those (`torchlib.generators.PythonGenerators`) saw
nothing; traced once into the joint graph, the noise became a constant, and every step
added the same numbers where eager drew new ones (hunt65, silently). A generator made
without a seed takes its seed from the operating system, so no trace can replay it:
while AOTAutograd traces the step, `fresh_generators_noted` notes each one the model's
code makes (`default_rng()`, `RandomState()`, `random.Random()`,
`random.SystemRandom()`), where, for the caller to refuse. One made with a seed
(`default_rng(0)`) draws the same numbers at every call, which the graph's constants
are: that traces as eager runs.
"""

from __future__ import annotations

import contextlib
import random
import sys

from .model_lines import is_model_file


@contextlib.contextmanager
def fresh_generators_noted():
    """Within: the generators made without a seed by the model's code are listed, as
    "what at file:line in function", in the list yielded."""
    made: list[str] = []

    def note(what: str, seed) -> None:
        if seed is not None:
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in (__file__, random.__file__):
            frame = frame.f_back
        if frame is not None and is_model_file(frame.f_code.co_filename):
            made.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")

    class Random(random.Random):
        def seed(self, a=None, version=2):
            note("random.Random()", a)
            super().seed(a, version)

    class SystemRandom(random.SystemRandom):
        def __init__(self, *args, **kwargs):
            note("random.SystemRandom()", None)
            super().__init__(*args, **kwargs)

    patched = [(random, "Random", Random), (random, "SystemRandom", SystemRandom)]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        default_rng = numpy.random.default_rng

        def watched_default_rng(seed=None):
            note("numpy.random.default_rng()", seed)
            return default_rng(seed)

        class RandomState(numpy.random.RandomState):
            def __init__(self, seed=None):
                note("numpy.random.RandomState()", seed)
                super().__init__(seed)

        patched += [(numpy.random, "default_rng", watched_default_rng), (numpy.random, "RandomState", RandomState)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, replacement in patched:
        setattr(owner, name, replacement)
    try:
        yield made
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
