"""Generators made without a seed by code a trace runs once (a custom backward's).

A custom backward adding gradient noise from a generator of its own
(`np.random.default_rng().standard_normal(...)`, `random.Random().random()`) moves no
global generator, so comparing those (`torchlib.generators.PythonGenerators`) saw
nothing; traced once into the joint graph, the noise became a constant, and every step
added the same numbers where eager drew new ones (hunt65, silently). A generator made
without a seed takes its seed from the operating system, so no trace can replay it:
while a step is traced, `fresh_generators_noted` notes each one the model's code makes,
where, for the caller to refuse. Methods and module functions are wrapped, never
classes (hunt67: a class swapped for a subclass broke `isinstance` of generators made
before, 1.155 off, and pickling): `random.Random.seed` (a `random.Random()` or one of a
subclass, unless seeded later: `r.seed(42)`), `random.SystemRandom`'s draws (the
operating system's numbers), and `numpy.random.default_rng` looked up on the module.
Not seen: NumPy generators made otherwise (`RandomState()`, `Generator(PCG64())`, a
`default_rng` imported by name), whose classes are compiled. One made with a seed
(`default_rng(0)`) draws the same numbers at every call, which the graph's constants
are: that traces as eager runs.
"""

from __future__ import annotations

import contextlib
import random
import sys
import weakref

from .model_lines import is_model_file


@contextlib.contextmanager
def fresh_generators_noted():
    """Within: the generators made without a seed by the model's code are listed, as
    "what at file:line in function", in the list yielded (filled when the block ends)."""
    made: list[str] = []
    unseeded: dict[int, tuple[weakref.ref, str]] = {}   # Python generators, until seeded

    def caller() -> str | None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename in (__file__, random.__file__):
            frame = frame.f_back
        if frame is None or not is_model_file(frame.f_code.co_filename):
            return None
        return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"

    seed = random.Random.seed

    def seeded(self, a=None, version=2):
        key = id(self)
        if a is None and (where := caller()) is not None:
            said = f"{type(self).__module__}.{type(self).__qualname__}() at {where}"

            def died(ref, key=key, said=said):   # made and dropped unseeded (`Random().random()`)
                if unseeded.get(key, (None,))[0] is ref:
                    del unseeded[key]
                    made.append(said)

            unseeded[key] = (weakref.ref(self, died), said)
        else:
            unseeded.pop(key, None)
        return seed(self, a, version)

    system_draws = {name: getattr(random.SystemRandom, name) for name in ("random", "getrandbits")}

    def drawing(name):
        def draw(self, *args, **kwargs):
            if (where := caller()) is not None and not made:
                made.append(f"random.SystemRandom().{name}() at {where}")
            return system_draws[name](self, *args, **kwargs)
        return draw

    patched = [(random.Random, "seed", seeded), *((random.SystemRandom, name, drawing(name)) for name in system_draws)]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        default_rng = numpy.random.default_rng

        def watched_default_rng(seed=None):
            if seed is None and (where := caller()) is not None:
                made.append(f"numpy.random.default_rng() at {where}")
            return default_rng(seed)

        patched.append((numpy.random, "default_rng", watched_default_rng))
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patched]
    for owner, name, replacement in patched:
        setattr(owner, name, replacement)
    try:
        yield made
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        made += [said for _, said in unseeded.values()]
        unseeded.clear()
