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
operating system's numbers), and the function every NumPy generator made without a seed
takes its entropy from (`numpy.random.bit_generator.randbits`, a module global its
compiled `SeedSequence` looks up at each call): `default_rng()` however imported,
`Generator(PCG64())`, `RandomState()`, `rs.seed()`. `RandomState(7)` draws that entropy
too before seeding over it, so while traced `RandomState` makes its `MT19937` as
`_SeedingSeen`, a subclass whose legacy seeding withdraws the note (only generators made
while traced are of it; NumPy's check that a `RandomState`'s generator is an `MT19937`
looks up the same name, so the subclass's class takes any `MT19937` for one). NumPy's
own Python code drawing that entropy (unpickling a generator, whose state it then sets)
is not noted. One made with a seed
(`default_rng(0)`) draws the same numbers at every call, which the graph's constants
are: that traces as eager runs.
"""

from __future__ import annotations

import contextlib
import dis
import os
import random
import sys
import threading
import weakref

from .model_lines import is_model_file


@contextlib.contextmanager
def fresh_generators_noted():
    """Within: the generators made without a seed by the model's code are listed, as
    "what at file:line in function", in the list yielded (filled when the block ends)."""
    made: list[str] = []
    unseeded: dict[int, tuple[weakref.ref, str]] = {}   # Python generators, until seeded

    tracing = threading.get_ident()

    def caller() -> str | None:
        if threading.get_ident() != tracing:   # another thread of the user's (hunt69)
            return None
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
        from numpy.random import bit_generator, mtrand

        entropy = bit_generator.randbits
        numpys = os.path.dirname(numpy.__file__) + os.sep

        def drawn_entropy(bits):
            # NumPy's own Python code draws it to unpickle a generator, then sets its state;
            # so does `jumped()` (compiled), called from the model's line (hunt69)
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back
            if frame is not None and not frame.f_code.co_filename.startswith(numpys) \
                    and _called_method(frame) != "jumped" and (where := caller()):
                made.append(f"a NumPy generator, at {where}")
            return entropy(bits)

        patched += [(bit_generator, "randbits", drawn_entropy),
                    (mtrand, "_MT19937", _seeding_seen(mtrand._MT19937))]
    global _noting
    noting, _noting = _noting, made
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patched]
    for owner, name, replacement in patched:
        setattr(owner, name, replacement)
    try:
        yield made
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        _noting = noting
        made += [said for _, said in unseeded.values()]
        unseeded.clear()


#: The notes of the trace under way, where `_SeedingSeen` adds and withdraws its own.
_noting: list[str] | None = None


def _seeding_seen(mt19937: type) -> type:
    """`RandomState`'s bit generator while traced (the class made once per process): its
    constructor draws the operating system's entropy, noted; `RandomState(seed)` then
    seeds it over, or a state set on it replaces it, which withdraws that note. It pickles
    as NumPy's own `MT19937`."""
    if (seen := globals().get("_SeedingSeen")) is not None:
        return seen

    class _AnyMT19937(type):   # NumPy's own checks (`get_state`) take any MT19937 for one
        def __instancecheck__(cls, instance):
            return isinstance(instance, mt19937)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, mt19937)

    class _SeedingSeen(mt19937, metaclass=_AnyMT19937):
        def __init__(self, *args, **kwargs):
            notes = _noting
            before = len(notes) if notes is not None else 0
            super().__init__(*args, **kwargs)
            self._unseeded = (notes, notes[-1]) if notes is not None and len(notes) > before else None

        def _withdrawn(self) -> None:
            if getattr(self, "_unseeded", None) is not None:
                notes, note = self._unseeded
                self._unseeded = None
                if note in notes:
                    notes.remove(note)

        def _legacy_seeding(self, seed):
            if seed is not None:
                self._withdrawn()
            return super()._legacy_seeding(seed)

        @property
        def state(self):
            return mt19937.state.__get__(self)

        @state.setter
        def state(self, value):   # `RandomState().set_state(saved)` (hunt69)
            self._withdrawn()
            mt19937.state.__set__(self, value)

        def __reduce__(self):   # pickled as NumPy's own, for any process to load
            constructor, arguments, *rest = super().__reduce__()
            return (constructor, (mt19937, *arguments[1:]), *rest)

    # NumPy names a state by its generator's class (`get_state()`, `set_state` compare it):
    # as `_SeedingSeen`, a state made while traced was no MT19937's (hunt69).
    _SeedingSeen.__module__, _SeedingSeen.__name__, _SeedingSeen.__qualname__ = __name__, "MT19937", "MT19937"
    globals()["_SeedingSeen"] = _SeedingSeen
    return _SeedingSeen


def _called_method(frame) -> str | None:
    """The name of the method `frame` is calling now (`rng.jumped()`: "jumped"), or None:
    the last attribute its code loaded before the instruction it runs."""
    name = None
    for instruction in dis.get_instructions(frame.f_code):
        if instruction.offset >= frame.f_lasti:
            break
        if instruction.opname in ("LOAD_METHOD", "LOAD_ATTR"):
            name = instruction.argval
    return name
