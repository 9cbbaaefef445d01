"""A branch on a uniform draw whose outcome the draw's range decides, answered while tracing.

transformers before 5.23 draws LayerDrop's number even where the config turns it off:
`dropout_probability = torch.rand([])`, then `if dropout_probability < self.layerdrop`
with `layerdrop=0.0` (Whisper, Wav2Vec2, HuBERT, BART and the time-series models;
transformers 5.17 is the lent GPU machines' image). torch.export cannot branch on a
draw, so those models were refused with a hint to set `layerdrop=0.0`, which their
users had done. A number drawn in [0, 1) is never below 0.0: eager never skips, and
every step runs the same ops, which is what one graph holds.

So while tracing (torch.export, then AOTAutograd) the fake tensor of each uniform draw
(`torch.rand`, `rand_like`, `uniform_`) keeps its range, a comparison of it with a
number that the whole range answers alike keeps that answer, and reading such an answer
(`bool()`, `.item()`) gives it instead of failing on data. The draw stays in the graph
and is replayed as eager draws it, so the generator's state after a step is eager's. A
comparison the range does not decide (`layerdrop=0.1`) is still refused by line
(`random_branches`).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.weak import WeakIdKeyDictionary

_aten = torch.ops.aten
#: Uniform draws and the positions of their (low, high) arguments; None: [0, 1).
_UNIFORM = {_aten.rand.default: None, _aten.rand_like.default: None,
            _aten.uniform.default: (1, 2), _aten.uniform_.default: (1, 2)}
#: Comparisons of a tensor with a number, as (range low, range high, number) -> answer,
#: None where the range does not decide it. A draw lies in [low, high).
_COMPARISONS = {
    _aten.lt.Scalar: lambda low, high, c: True if high <= c else False if low >= c else None,
    _aten.le.Scalar: lambda low, high, c: True if high <= c else False if low > c else None,
    _aten.gt.Scalar: lambda low, high, c: False if high <= c else True if low > c else None,
    _aten.ge.Scalar: lambda low, high, c: False if high <= c else True if low >= c else None,
}
#: Tests of an answer against a number: `bool(t)` is `t != 0`, read on the host.
_TESTS = {_aten.ne.Scalar: lambda answer, c: answer != c, _aten.eq.Scalar: lambda answer, c: answer == c}
#: Ops reading a tensor's one value on the host (`bool()`, `.item()`).
_READS = (_aten._local_scalar_dense.default, _aten.is_nonzero.default)


@contextlib.contextmanager
def certain_draws():
    """Within: comparisons of uniform draws that their range decides read as decided
    (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    original = FakeTensorMode.dispatch
    # By identity: a tensor's `==` compares values, which a fake tensor has none of.
    ranges = WeakIdKeyDictionary()    # draw -> (low, high)
    answers = WeakIdKeyDictionary()   # comparison -> bool

    def dispatch(mode, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS and args and isinstance(args[0], torch.Tensor) and args[0] in answers:
            return answers[args[0]]
        result = original(mode, func, types, args, kwargs)
        if func in _UNIFORM and isinstance(result, torch.Tensor):
            where = _UNIFORM[func]
            bounds = (0.0, 1.0) if where is None else tuple(
                _number(args, kwargs, position, name, default)
                for position, name, default in zip(where, ("from", "to"), (0.0, 1.0)))
            if all(isinstance(b, (int, float)) for b in bounds):
                ranges[result] = bounds
        elif func in _COMPARISONS and isinstance(result, torch.Tensor) and len(args) >= 2 \
                and isinstance(args[0], torch.Tensor) and args[0] in ranges and isinstance(args[1], (int, float)) and not isinstance(args[1], bool):
            answer = _COMPARISONS[func](*ranges[args[0]], args[1])
            if answer is not None and result.numel() == 1:
                answers[result] = answer
        elif func in _TESTS and isinstance(result, torch.Tensor) and len(args) >= 2 \
                and isinstance(args[0], torch.Tensor) and args[0] in answers:
            answers[result] = _TESTS[func](answers[args[0]], args[1])   # bool(): `ne(answer, 0)`
        return result

    FakeTensorMode.dispatch = dispatch
    try:
        yield
    finally:
        FakeTensorMode.dispatch = original


def _number(args: tuple, kwargs: dict, position: int, name: str, default: float):
    """An op's argument by position or name, its default where absent."""
    if len(args) > position:
        return args[position]
    return kwargs.get(name, default)
