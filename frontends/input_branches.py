"""Branches on the values of the caller's inputs, taken as eager takes them while
torch.export traces, and recorded so that every call is checked against them.

A forward that reads a truth value from its inputs' data (`if labels.max() >= vocab_size:
raise`, `assert torch.all(ids >= 0).item()`, `if not padding_mask.any(): padding_mask =
None`, `is_global = global_attention_mask.any().item()`) cannot be traced as one graph:
fake tensors have no values, and export stopped there ("branches on a value computed
from tensor data"). FSMT, Longformer, LED, LLaVA and PaliGemma were refused so (they
train bitwise now), and seven of transformers' speech models at their label check (they
train bitwise too, their CTC loss one op since 2026-12-03: `ctc_losses.py`). ProphetNet stays
refused: its truth is computed through writes (a slice copy, `masked_fill_`), which a
chain replayed at every call would miss where made through views.

Where the tensor is computed from the caller's inputs alone, by ops that draw nothing,
its truth is what eager would read for the example inputs: it is computed on them, the
trace takes that branch, and the way to it is recorded with the answer
(`torchlib/value_guards.py`, decision "builtins.bool"), as transformers' mask decisions
are (`transformers_masks.py`, whose recording this shares). The runtime asks again at
every call and plans another graph where a call's answer differs (or refuses the call by
name), so a call never runs the branch the data would not take. A tensor computed from
shapes alone (`torch.ones` of the input's shape, where the caller passed no mask) has the
same truth at every call: it is computed, and nothing is recorded. Where the tensor reads a
parameter, a buffer, a tensor the model holds or an activation, nothing is recorded and
export's refusal stands: that truth may change at any step.
"""

from __future__ import annotations

import contextlib
import threading
import traceback

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode

from .model_lines import model_line
from .raising_checks import raising_branch
from .transformers_masks import CallInputs, record_decision, shape_determined

#: Per thread: a truth is being read through the replaced methods (`eager_input_branches`).
_inside = threading.local()

#: The decision recorded (`torchlib.value_guards.DECISIONS`): Python's truth of a tensor.
DECISION = "builtins.bool"


@contextlib.contextmanager
def eager_input_branches(model: torch.nn.Module, args: tuple, kwargs: dict, guards: list):
    """Within (a trace of `model` on `args`, `kwargs`): the truth of a one-element tensor
    computed from the caller's inputs (`bool(t)`, `if t:`, `assert t`, and `t.item()` of a
    boolean tensor) is eager's for these inputs, and is appended to `guards`; any other
    is read as torch reads it."""
    inputs = CallInputs(args, kwargs)
    truth, item = torch.Tensor.__bool__, torch.Tensor.item

    def eager_truth(tensor: torch.Tensor) -> bool | None:
        if get_proxy_mode() is None or tensor.numel() != 1:
            return None
        # Export's torch-function modes would trace the real tensors computed here as the
        # model's (a truth read from one is data-dependent to them): off while deciding.
        with torch._C.DisableTorchFunction():
            recorded = len(guards)
            decided = record_decision(DECISION, bool, tensor, (), {}, inputs, guards)
            if len(guards) > recorded:   # the line, found only for what is recorded
                guards[-1]["line"] = model_line(traceback.extract_stack()[:-3]) or "a line of the forward"
            if decided is None:
                values = shape_determined(tensor)   # from shapes alone: the same at every call
                if values is not None:
                    with unset_fake_temporarily(), disable_proxy_modes_tracing():
                        decided = bool(values)
        return decided

    def branching(self):
        decided = eager_truth(self)
        if decided is None and get_proxy_mode() is not None:
            decided = raising_branch(self)   # an `if` or `assert` that only raises: a check
        return truth(self) if decided is None else decided

    def reading(self):
        decided = eager_truth(self) if self.dtype == torch.bool else None
        return item(self) if decided is None else decided

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

    own = {name: torch.Tensor.__dict__[name] for name in ("__bool__", "item") if name in torch.Tensor.__dict__}
    handle = model.register_forward_pre_hook(inputs.hook, with_kwargs=True, prepend=True)
    torch.Tensor.__bool__, torch.Tensor.item = once(branching, truth), once(reading, item)
    try:
        yield
    finally:
        for name in ("__bool__", "item"):   # as they were: torch.Tensor's own, or inherited
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)
        handle.remove()
