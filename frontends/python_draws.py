"""A number drawn from Python's `random` whose range decides what the forward does with it.

MusicGen's decoder (and MusicGen Melody's) draws LayerDrop's number from Python's global
generator at every layer, even where the config turns LayerDrop off:
`dropout_probability = random.uniform(0, 1)`, then `if self.training and
(dropout_probability < self.layerdrop)` with `layerdrop=0.0`. Traced, the number is a
constant, which is harmless where no number in the draw's range could change the
comparison; but eager advances Python's generator at every step, and the step, which
runs no Python forward, did not: such models were refused ("it draws from Python's random
generator").

So while tracing, `random.random()` and `random.uniform(a, b)` called from the model's
code draw as eager does and return a `RangedDraw`: a number known by its range alone.
A comparison with a number that the whole range answers alike gives that answer (the
range taken closed: `uniform` may return `b`); anything else done with it (arithmetic,
a comparison the range does not decide, a conversion) is refused by line, since the
graph would hold the number drawn while tracing. The trace counts the draws of one
forward (`trace_effects`); the graph records the count (`torch.python_draws`) and the
runtime draws as many numbers at every training call, so Python's generator is where
eager's leaves it after each step.
"""

from __future__ import annotations

from .certain_draws import DECIDED_BY_RANGE
from .errors import LoweringError
from .random_branches import HINT

#: The functions of Python's global generator a forward may draw with, by name: each
#: takes one `random.random()` from the generator (CPython's `uniform` is
#: `a + (b - a) * random()`), and the range of what it returns.
RANGES = {"random": lambda: (0.0, 1.0), "uniform": lambda a, b: (min(a, b), max(a, b))}

class RangedDraw:
    """A number drawn from Python's generator while tracing, known by its range (module
    docstring). Not a float: what a float would let through unseen (a product with a
    tensor, `float(x)`) fails here by line instead."""

    __slots__ = ("low", "high", "where")

    def __init__(self, low: float, high: float, where: str):
        self.low, self.high, self.where = low, high, where

    def _compared(self, other, op: str) -> bool:
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            raise self._refusal(f"compares it with {type(other).__name__} {other!r}")
        answer = DECIDED_BY_RANGE[op](self.low, self.high, other)
        if answer is None:
            raise LoweringError(f"the forward compares a number drawn from Python's random generator "
                                f"({self.where}) with {other!r}, which its range [{self.low}, {self.high}] "
                                f"does not decide: {HINT}")
        return answer

    def __lt__(self, other):
        return self._compared(other, "lt")

    def __le__(self, other):
        return self._compared(other, "le")

    def __gt__(self, other):
        return self._compared(other, "gt")

    def __ge__(self, other):
        return self._compared(other, "ge")

    def _refusal(self, what: str) -> LoweringError:
        return LoweringError(
            f"the forward {what}: a number drawn from Python's random generator ({self.where}), "
            f"which the graph would hold as the number drawn while tracing. remat-ir keeps such "
            f"a draw only where a comparison its range decides reads it (LayerDrop with "
            f"layerdrop=0.0): draw with torch instead (torch.rand), which the graph replays "
            f"with eager's numbers")

    def _used(self, *args):
        raise self._refusal("computes with")

    __eq__ = __ne__ = __hash__ = __bool__ = __float__ = __int__ = __index__ = _used
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _used
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _used
    __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = __round__ = __trunc__ = _used
    __floor__ = __ceil__ = __format__ = __str__ = _used

    def __repr__(self) -> str:
        return f"RangedDraw([{self.low}, {self.high}] drawn {self.where})"
