"""Errors a model raises only while torch.export traces it.

A forward may take another path under tracing: transformers asks
`is_torchdynamo_compiling()` and then skips building a default attention mask (LongT5's
encoder fails on `None.shape` there, and runs eagerly). Such an error was reported as
the model's own, "eager raises it too", which sent users to fix code that runs. So a
plain Python error from the model's code is checked against one eager forward, and
where eager runs, the error names the check that sent tracing another way.
"""

from __future__ import annotations

import linecache
import os
import re
import traceback

import torch

from remat_ir.torchlib.generators import GeneratorStates, generators_kept
from remat_ir.torchlib.types import FUNCTION_NAMESPACE

from .autograd_functions import function_class
from .model_lines import is_model_file

#: Calls by which a model asks whether it is being traced or compiled (torch's and
#: transformers' spellings).
_CHECKS = re.compile(r"\b(is_torchdynamo_compiling|is_torchdynamo_exporting|is_compiling|"
                     r"is_exporting|is_dynamo_compiling|is_fx_tracing|is_tracing)\s*\(")


def tracing_check(tb) -> str | None:
    """'file:line calls is_torchdynamo_compiling()': the last call of a tracing check in the
    model's functions on `tb`'s stack, read from each function's first line to the line
    it was at, or None."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        code = frame.f_code
        if not is_model_file(code.co_filename):
            continue
        lines = linecache.getlines(code.co_filename)
        for number in range(code.co_firstlineno, min(lineno, len(lines)) + 1):
            called = _CHECKS.search(lines[number - 1])
            if called:
                found = f"{code.co_filename}:{number} calls {called.group(1)}()"
    return found


class EagerFailure:
    """What one eager forward that raised left: its exception, and the state of the
    generators and the model's buffers as the forward left them when it raised, which
    `eager_failure` then put back. `apply()` sets them again: a training call that
    raises it (`ScheduledModule`) leaves eager's effects, its dropout draws and running
    statistics, without running the forward a second time (a second run wrote twice what
    the forward writes besides buffers: a momentum encoder's weights, found by a review)."""

    def __init__(self, exception: BaseException, buffers: list, devices: list[int]):
        self.exception = exception
        self.generators = GeneratorStates(devices)
        self.buffers = [(buffer, buffer.detach().clone()) for buffer, _ in buffers]

    def apply(self) -> None:
        """The generators and buffers as the eager forward left them."""
        self.generators.restore()
        with torch.no_grad():
            for buffer, left in self.buffers:
                buffer.copy_(left)


def eager_failure(model: torch.nn.Module, args: tuple, kwargs: dict) -> EagerFailure | None:
    """None where one eager forward of `model` on these inputs runs without raising; else
    what it left (`EagerFailure`). Run with gradients on, as a training call's (a custom
    op's `setup_context` runs only then: one taking the wrong arguments raised in eager
    too, where the check, run without gradients, said eager runs; found by a review),
    with no backward, the generators forked and the buffers put back, so that the check
    leaves the model and the random streams as they were (a BatchNorm's running
    statistics, dropout's next draws). The model's own call, not the call of a scheduled
    module routed in its place (`remat(..., in_place=True)`: the scheduled module traced
    the call again, which ran this check again, until the process aborted; found by a
    review)."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    devices = sorted({b.device.index or 0 for b, _ in buffers if b.device.type == "cuda"} |
                     {p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    call = model._call_impl if model.__dict__.get("_compiled_call_impl") is not None else model
    failure = None
    try:
        with torch.enable_grad(), generators_kept(devices):
            try:
                call(*args, **kwargs)
            except Exception as exc:   # noqa: BLE001 - any error means eager fails as well
                failure = EagerFailure(exc, buffers, devices)
    finally:
        with torch.no_grad():
            for buffer, was in buffers:
                buffer.copy_(was)
    return failure


def _raised_in_torch(error: Exception) -> str | None:
    """'torch/_functorch/...:412 in fn' where `error` was raised inside torch's own code,
    else None."""
    frames = traceback.extract_tb(error.__traceback__)
    root = os.path.dirname(os.path.dirname(torch.__file__))
    if not frames or not os.path.abspath(frames[-1].filename).startswith(os.path.dirname(torch.__file__) + os.sep):
        return None
    return f"{os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno} in {frames[-1].name}"


def traced_only_message(model: str, error: Exception, where: str, check: str | None) -> str:
    """The error for a forward that raised `error` at `where` under torch.export only."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    if first.startswith(".numpy() is not supported"):
        # Found by a review: said as another path under tracing, with advice about masks.
        return (f"{model}'s forward reads a tensor's values into NumPy (`.numpy()`) at {where}: a "
                f"trace has no values to read, and the graph could not follow them at each step. "
                f"Compute it outside the model and pass it as an input (or with torch ops whose "
                f"results have fixed shapes)")
    if first.startswith("The tensor has a non-zero number of elements, but its data is not allocated yet"):
        # A tensor iterated into Python (`rows, cols = zip(*ind)`) and its 0-d tensors used
        # as indices: said as another path under tracing, with advice about attention masks
        # (hunt64: transformers' UDOP).
        return (f"{model}'s forward uses a tensor's values in Python at {where} (the 0-d tensors "
                f"of a tensor it iterates, `zip(*t)` or `list(t)`, as indices or numbers): a trace "
                f"has no values there. Index with the tensors themselves (`mask[t[:, 0], t[:, 1]]`) "
                f"or compute it with tensor ops, then call remat again")
    if (batched := re.match(r"Batching rule not implemented for (\w+)::(\w+)\.", first)) \
            and batched.group(1) == FUNCTION_NAMESPACE:
        # remat-ir's op for a custom Function (which keeps its backward) has no batching
        # rule: a Function with `generate_vmap_rule` under `torch.func.vmap` in the forward
        # was said as torch.export's failure (hunt63).
        cls = function_class(f"{batched.group(1)}.{batched.group(2)}.default")
        name = cls.__qualname__ if cls is not None else "a custom autograd.Function"
        return (f"{model}'s forward applies autograd.Function {name} under torch.func.vmap at {where}: "
                f"remat-ir keeps a Function's backward by making each call one op, which vmap cannot "
                f"batch. Apply it outside vmap, to the whole batch, or write what vmap computes there "
                f"with plain tensor ops")
    if check is None and (inside := _raised_in_torch(error)) is not None:
        # No tracing check on its path, raised inside torch's own code: found by a review,
        # `torch.func.jacfwd` in a forward (export's "'Tensor' object has no attribute
        # 'constant'") was said as another path, with advice about attention masks.
        # Not said as certain: a forward asking a tensor's type (`type(x) is not
        # torch.Tensor`) takes another path too, with no check named (found by a review).
        return (f"{model}'s forward raised {type(error).__name__} inside PyTorch at {inside}, "
                f"called at {where}: {first}, while torch.export traced it; eager runs on these "
                f"inputs, and no known check of tracing is on that path. Either torch.export "
                f"cannot trace what the forward does there (torch.func's forward-mode "
                f"transforms such as jacfwd, and transforms nested in vmap, are among such "
                f"constructs): compute it outside the module given to remat_ir.remat, or write "
                f"it with plain tensor ops; or the forward takes another path while traced (a "
                f"check of a tensor's type, or of whether torch compiles it): pass explicitly "
                f"what eager computes on that path. Then call remat again")
    why = (f"{check}, which takes another path while torch traces it"
           if check else "the forward takes another path while torch traces it (a check "
                         "such as torch.compiler.is_compiling())")
    return (f"{model}'s forward raised {type(error).__name__} at {where}: {first}, while "
            f"torch.export traced it; eager runs on these inputs: {why}. Pass explicitly what "
            f"eager computes on that path (transformers models: an attention_mask, "
            f"torch.ones_like(input_ids) when nothing is padded), or change that code, then "
            f"call remat again")
