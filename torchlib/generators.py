"""Every generator a step may draw from, put back after work that is not a step.

Profiling, timing and planning run a graph's ops, or whole steps, that training never
runs: the numbers they draw must not move the generators the user's next step draws
from. Torch's (CPU, and the CUDA devices worked on) are kept; a step also draws from
NumPy's global generator (transformers' SpecAugment masks, `torchlib/spec_augment.py`),
and Python's is kept alike, so that a user seeding any of them gets eager's numbers
after `remat`."""

from __future__ import annotations

import contextlib
import copy
import random
import sys

import torch


class PythonGenerators:
    """The states of Python's and NumPy's global generators, taken when made: `moved()`
    names those that moved since, `restore()` sets them again. For code a trace runs once
    whose draws from them would become constants of the graph (a custom backward's)."""

    def __init__(self):
        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = (numpy, numpy.random.get_state()) if numpy is not None else None

    def moved(self) -> list[str]:
        found = ["Python's"] if random.getstate() != self.python else []
        if self.numpy is not None and not same_state(self.numpy[0].random.get_state(), self.numpy[1]):
            found.append("NumPy's")
        return found

    def restore(self) -> None:
        random.setstate(self.python)
        if self.numpy is not None:
            self.numpy[0].random.set_state(self.numpy[1])


class GeneratorStates:
    """The states of torch's CPU generator, of the CUDA generators of `devices`, and of
    Python's and NumPy's global generators (`PythonGenerators`), taken when made;
    `restore()` sets them again. One snapshot for work that must leave the generators as
    it found them (`generators_kept`) and for a forward's effects kept to be set again
    later (`frontends/tracing_paths.EagerFailure`)."""

    def __init__(self, devices=()):
        self.devices = list(devices)
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]
        self.outside = PythonGenerators()

    def moved_torch(self, now: GeneratorStates) -> bool:
        """Whether torch's generators (CPU, and the CUDA devices of both) differ in `now`,
        taken later."""
        return not torch.equal(self.cpu, now.cpu) or any(
            not torch.equal(a, b) for a, b in zip(self.cuda, now.cuda))

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in zip(self.devices, self.cuda):
            torch.cuda.set_rng_state(state, device)
        self.outside.restore()


@contextlib.contextmanager
def generators_kept(devices=()):
    """Within: draw freely; after: torch's generators (CPU and `devices`'), Python's and
    NumPy's global generators are as they were before."""
    taken = GeneratorStates(devices)
    try:
        yield
    finally:
        taken.restore()


def step_generators(device: torch.device, python: bool = False) -> tuple:
    """The state of the generators a training step draws from: torch's CPU generator, the
    CUDA generator of `device` where it is one, and Python's where `python` (a step that
    draws Python numbers, `frontends/python_draws.py`). Taken before each step (a
    microsecond), so that a step failing part-way can be run again as eager's forward
    from where it started (`runtimes/torch.py` `_run_step_failing_as_eager`). The CPU
    generator's as a cloned Generator, as the runtime keeps it for replays
    (`codegen._rng_functions`): its state as a tensor is 5 KB, which every step's peak
    counted (a tiny model measured 5.5 KB where its plan said 1 KB)."""
    return (torch.default_generator.clone_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            random.getstate() if python else None)


def restore_step_generators(state: tuple, device: torch.device) -> None:
    """Put back what `step_generators` took."""
    cpu, cuda, python = state
    torch.default_generator.set_state(cpu.get_state())
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
    if python is not None:
        random.setstate(python)


def object_state(value, numpy=None):
    """A copy of the state of a generator object: torch's `torch.Generator`, Python's
    `random.Random`, NumPy's `Generator` or `RandomState`; None for anything else. For
    the generators a user's object holds (`frontends/outside_state.py`, the gradient hooks
    `runtimes/parameter_hooks.py` watches), compared by `same_state`."""
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, random.Random):
        return value.getstate()
    numpy = numpy or sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.random.Generator):
        return copy.deepcopy(value.bit_generator.state)
    if numpy is not None and isinstance(value, numpy.random.RandomState):
        return value.get_state(legacy=False)
    return None


def same_state(a, b) -> bool:
    """States as `object_state` gives them (tensors, and tuples, dicts and NumPy arrays nested)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_state, a, b))
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return hasattr(b, "shape") and a.shape == b.shape and bool((a == b).all())
    return type(a) is type(b) and a == b
