"""Branches on the values of the caller's inputs, taken as eager takes them while
torch.export traces, and recorded so that every call is checked against them.

A forward that reads a truth value from its inputs' data (`if labels.max() >= vocab_size:
raise`, `assert torch.all(ids >= 0).item()`, `if not padding_mask.any(): padding_mask =
None`, `is_global = global_attention_mask.any().item()`) cannot be traced as one graph:
fake tensors have no values, and export stopped there ("branches on a value computed
from tensor data"). FSMT, Longformer, LED, LLaVA and PaliGemma were refused so (they
train bitwise now), and seven of transformers' speech models at their label check (they
train bitwise too, their CTC loss one op since 2026-12-03: `ctc_losses.py`). A truth
computed through writes into views (`n[0] = lengths[0]`) is recorded with the writes,
replayed in order (`transformers_masks.ancestry`); one written into the caller's input is
not (the replay would write into it). ProphetNet's, read by `.item()`, only guards an
`assert`, which becomes a check of every step (`raising_checks.py`).

Integers are read alike under `integers_as_eager`, which lowering enters only where a
first trace stopped at a number read from tensor data (`frontends/torch.py`): `.item()`,
`.tolist()`, `int()` and an index of an integer tensor computed from the caller's inputs
give eager's numbers, recorded as the decision `integers`; the ops whose size such
numbers decide trace in their fixed-size form (`input_sizes.py`). Qwen2-VL's split of its
patches per image, by the image grid the caller passes, was refused so. Floats are not
read: a number that differs at every step (a scale) would lower a graph per step.

Where the tensor is computed from the caller's inputs alone, by ops that draw nothing,
its truth is what eager would read for the example inputs: it is computed on them, the
trace takes that branch, and the way to it is recorded with the answer
(`torchlib/value_guards.py`, decision "builtins.bool"), as transformers' mask decisions
are (`transformers_masks.py`, whose recording this shares). The runtime asks again at
every call and plans another graph where a call's answer differs (or refuses the call by
name), so a call never runs the branch the data would not take. A tensor computed from
shapes alone (`torch.ones` of the input's shape, where the caller passed no mask) has the
same truth at every call: it is computed, and nothing is recorded. A buffer counts as an
input: the runtime reads its values at every call (Encodec's and Mimi's padding, integer
buffers; one the forward writes before the read stays refused, as the check made before
the call would read the value before the write). Where the tensor reads a parameter, a
tensor the model holds otherwise or an activation, nothing is recorded and export's
refusal stands: that truth may change at any step.
"""

from __future__ import annotations

import contextlib
import threading
import traceback

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode

from remat_ir.torchlib.value_guards import integers

from .model_lines import model_line
from .input_sizes import InputSizes
from .raising_checks import empty_mask_branch, raising_branch
from .transformers_masks import CallInputs, record_decision, shape_determined

#: Per thread: a truth is being read through the replaced methods (`eager_input_branches`).
_inside = threading.local()
#: Per thread: integers are read as eager's too (`integers_as_eager`).
_integers = threading.local()

#: The decisions recorded (`torchlib.value_guards.DECISIONS`): Python's truth of a tensor,
#: and the integers it holds.
DECISION = "builtins.bool"
INTEGERS = f"{integers.__module__}.integers"
#: The dtypes whose values are read as integers. Floats only where the model's buffers
#: alone give them (`lo, hi = self.bounds.tolist()`, `self.scale.item()`: refused before,
#: hunt49 #3), not the caller's inputs: a number that differs at every step, a scale
#: passed in, would lower a graph per step.
_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


@contextlib.contextmanager
def integers_as_eager():
    """Within: `eager_input_branches` also reads integers computed from the caller's
    inputs as eager's (`.item()`, `.tolist()`, `int()`, an index), and traces the ops whose
    size they decide in their fixed-size form (`input_sizes`)."""
    before = getattr(_integers, "on", False)
    _integers.on = True
    try:
        yield
    finally:
        _integers.on = before


@contextlib.contextmanager
def eager_input_branches(model: torch.nn.Module, args: tuple, kwargs: dict, guards: list):
    """Within (a trace of `model` on `args`, `kwargs`): the truth of a one-element tensor
    computed from the caller's inputs (`bool(t)`, `if t:`, `assert t`, and `t.item()` of a
    boolean tensor) is eager's for these inputs, and is appended to `guards`; under
    `integers_as_eager`, so are the integers of such an integer tensor; any other is read
    as torch reads it."""
    inputs = CallInputs(args, kwargs, model)

    def eager_read(decision: str, decide, tensor: torch.Tensor, buffers_only: bool = False):
        """`decide(tensor)` as eager computes it for these inputs: recorded with the way
        to it where `tensor` is computed from the caller's inputs (`buffers_only`: from the
        model's buffers alone), computed where from shapes alone (the same at every call);
        else None."""
        # Export's torch-function modes would trace the real tensors computed here as the
        # model's (a truth read from one is data-dependent to them): off while deciding.
        with torch._C.DisableTorchFunction():
            recorded = len(guards)
            decided = record_decision(decision, decide, tensor, (), {}, inputs, guards, buffers_only=buffers_only)
            if len(guards) > recorded:   # the line, found only for what is recorded
                guards[-1]["line"] = model_line(traceback.extract_stack()[:-4]) or "a line of the forward"
            if decided is None:
                values = shape_determined(tensor)
                if values is not None:
                    with unset_fake_temporarily(), disable_proxy_modes_tracing():
                        decided = decide(values)
        return decided

    def eager_truth(tensor: torch.Tensor) -> bool | None:
        if get_proxy_mode() is None or tensor.numel() != 1:
            return None
        return eager_read(DECISION, bool, tensor)

    def branching(self):
        decided = eager_truth(self)
        if decided is None and get_proxy_mode() is not None:
            decided = raising_branch(self)   # an `if` or `assert` that only raises: a check
        if decided is None and get_proxy_mode() is not None:
            decided = empty_mask_branch(self)   # `if m.any(): x[m] = -inf`, a no-op when not
        return truth(self) if decided is None else decided

    def eager_integers(tensor: torch.Tensor):
        """Eager's integers in an integer `tensor` computed from the caller's inputs (or
        from shapes alone), recorded; None for any other tensor, or outside a trace."""
        if get_proxy_mode() is None or not (tensor.dtype in _INTEGERS or tensor.dtype.is_floating_point):
            return None
        return eager_read(INTEGERS, integers, tensor, buffers_only=tensor.dtype.is_floating_point)

    def eager_integer(tensor: torch.Tensor) -> int | None:
        """Eager's one integer of a one-element tensor of any shape (`(1,)` too, whose
        `.tolist()` is a list), as `eager_integers` reads it."""
        read = eager_integers(tensor) if tensor.numel() == 1 else None
        while isinstance(read, list):
            read = read[0]
        return read

    def reading(self):
        if self.dtype == torch.bool:
            decided = eager_truth(self)
            if decided is None and get_proxy_mode() is not None and self.numel() == 1:
                decided = raising_branch(self, called=True)   # `assert t.item()`: a check
        else:
            decided = eager_integer(self) if integers_too else None
        return item(self) if decided is None else decided

    def listing(original):
        def method(self):
            read = eager_integers(self)
            return original(self) if read is None else read
        return method

    def as_number(original, kind):
        def method(self):
            # `__index__` of a float tensor raises in eager: left to torch.
            read = None if kind is int and original is torch.Tensor.__index__ and self.dtype.is_floating_point \
                else eager_integer(self)
            return original(self) if read is None else kind(read)
        return method

    def once(read, original):
        # torch's handler of an overridden method (a torch-function mode of export's)
        # calls the method again by its name on torch.Tensor: this one again. The inner
        # call reads as torch reads; the outer one decided already.
        def method(self):
            if getattr(_inside, "reading", False):
                return original(self)
            _inside.reading = True
            try:
                return read(self)
            finally:
                _inside.reading = False
        return method

    truth, item = torch.Tensor.__bool__, torch.Tensor.item
    integers_too = getattr(_integers, "on", False)
    # (class, name): the method. Fake tensors list their values by a method of their own.
    replaced = {(torch.Tensor, "__bool__"): once(branching, truth),
                (torch.Tensor, "item"): once(reading, item)}
    if integers_too:
        replaced.update({(cls, "tolist"): once(listing(cls.tolist), cls.tolist) for cls in (torch.Tensor, FakeTensor)})
        replaced.update({(torch.Tensor, name): once(as_number(getattr(torch.Tensor, name), kind),
                                                    getattr(torch.Tensor, name))
                         for name, kind in (("__int__", int), ("__index__", int), ("__float__", float))})
    own = {(cls, name): cls.__dict__[name] for cls, name in replaced if name in cls.__dict__}
    handle = model.register_forward_pre_hook(inputs.hook, with_kwargs=True, prepend=True)
    for (cls, name), method in replaced.items():
        setattr(cls, name, method)
    try:
        with InputSizes(eager_integer) if integers_too else contextlib.nullcontext():
            yield
    finally:
        for cls, name in replaced:   # as they were: the class's own, or inherited
            if (cls, name) in own:
                setattr(cls, name, own[cls, name])
            else:
                delattr(cls, name)
        handle.remove()
