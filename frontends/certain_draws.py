"""A branch on a uniform draw whose outcome the draw's range decides, answered while tracing.

transformers before 5.23 draws LayerDrop's number even where the config turns it off:
`dropout_probability = torch.rand([])`, then `if dropout_probability < self.layerdrop`
with `layerdrop=0.0` (Whisper, Wav2Vec2, HuBERT, BART and the time-series models;
transformers 5.17 is the lent GPU machines' image). torch.export cannot branch on a
draw, so those models were refused with a hint to set `layerdrop=0.0`, which their
users had done. A number drawn in [0, 1) is never below 0.0: eager never skips, and
every step runs the same ops, which is what one graph holds.

So while tracing (torch.export, then AOTAutograd) the fake tensor of each uniform draw
(`torch.rand`, `rand_like`) keeps its range, a comparison of it with a
number that the whole range answers alike keeps that answer (until either is written in
place), and reading such an answer (`bool()`, `.item()`) gives it instead of failing on
data. The draw stays in the graph and is replayed as eager draws it, so the generator's
state after a step is eager's. A comparison the range does not decide (`layerdrop=0.1`)
is still refused by line (`random_branches`).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .fake_dispatch import wrapped_fake_dispatch

_aten = torch.ops.aten
#: Draws of numbers in [0, 1). Not `uniform_`: an in-place op's version count moves after
#: the dispatch returns, so what is known of it could not be told from a later write.
_UNIFORM = (_aten.rand.default, _aten.rand_like.default)
#: Comparisons of a number drawn in a range with a number, by name, as (range low, range
#: high, number) -> answer, None where the range does not decide it. The range is taken
#: closed, [low, high]: a draw may be `low` itself, and rounding may give `high` (`rand`
#: in bfloat16). Also what Python's draws are compared by (`python_draws`).
DECIDED_BY_RANGE = {
    "lt": lambda low, high, c: True if high < c else False if low >= c else None,
    "le": lambda low, high, c: True if high <= c else False if low > c else None,
    "gt": lambda low, high, c: True if low > c else False if high <= c else None,
    "ge": lambda low, high, c: True if low >= c else False if high < c else None,
}
#: The same for the comparisons of a tensor with a number.
_COMPARISONS = {getattr(_aten, name).Scalar: decided for name, decided in DECIDED_BY_RANGE.items()}
#: Tests of an answer against a number: `bool(t)` is `t != 0`, read on the host.
_TESTS = {_aten.ne.Scalar: lambda answer, c: answer != c, _aten.eq.Scalar: lambda answer, c: answer == c}
#: Ops reading a tensor's one value on the host (`bool()`, `.item()`).
_READS = (_aten._local_scalar_dense.default, _aten.is_nonzero.default)


@contextlib.contextmanager
def certain_draws():
    """Within: comparisons of uniform draws that their range decides read as decided
    (module docstring)."""
    # By identity: a tensor's `==` compares values, which a fake tensor has none of. Each
    # entry keeps the tensor's version: written in place since (itself or through a view),
    # what it says no longer holds.
    ranges = WeakIdKeyDictionary()    # draw -> ((low, high), version)
    answers = WeakIdKeyDictionary()   # comparison -> (bool, version)

    def known(table, tensor):
        entry = table.get(tensor) if isinstance(tensor, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] == tensor._version else None

    def wrap(original):
        def dispatch(mode, func, types, args=(), kwargs=None):
            first = args[0] if args else None
            if func in _READS and known(answers, first) is not None:
                return known(answers, first)
            result = original(mode, func, types, args, kwargs)
            if not isinstance(result, torch.Tensor):
                return result
            if func in _UNIFORM:
                ranges[result] = ((0.0, 1.0), result._version)
            elif func in _COMPARISONS and known(ranges, first) is not None and _number_argument(args):
                answer = _COMPARISONS[func](*known(ranges, first), _as_compared(args[1], first.dtype))
                if answer is not None and result.numel() == 1:
                    answers[result] = (answer, result._version)
            elif func in _TESTS and known(answers, first) is not None and _number_argument(args) \
                    and args[1] in (0, 1):   # exact in any dtype the test may run in
                # bool(t) runs as `ne(t, 0)`, then reads that
                answers[result] = (_TESTS[func](known(answers, first), args[1]), result._version)
            return result
        return dispatch

    with wrapped_fake_dispatch(wrap):
        yield


def _as_compared(number: float, dtype: torch.dtype) -> float:
    """`number` as a comparison with a tensor of `dtype` sees it: cast to that dtype (-1e-50
    is -0.0 in float32, 1.001 is 1.0 in bfloat16, either of which a draw can equal)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return torch.tensor(number, dtype=dtype).item()


def _number_argument(args: tuple) -> bool:
    """Whether an op's second argument is a plain number (not a bool, not a tensor)."""
    return len(args) >= 2 and isinstance(args[1], (int, float)) and not isinstance(args[1], bool)
