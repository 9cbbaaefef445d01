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
import re
import traceback

import torch

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


def eager_runs(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether one eager forward of `model` on these inputs runs without raising. Run with
    gradients on, as a training call's (a custom op's `setup_context` runs only then: one
    taking the wrong arguments raised in eager too, where the check, run without
    gradients, said eager runs; found by a review), with no backward, the generators
    forked and the buffers put back, so that the check leaves the model and the random
    streams as they were (a BatchNorm's running statistics, dropout's next draws)."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    devices = sorted({b.device.index or 0 for b, _ in buffers if b.device.type == "cuda"} |
                     {p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        with torch.enable_grad(), torch.random.fork_rng(devices=devices):
            model(*args, **kwargs)
    except Exception:   # noqa: BLE001 - any error means eager fails as well
        return False
    finally:
        with torch.no_grad():
            for buffer, was in buffers:
                buffer.copy_(was)
    return True


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
    why = (f"{check}, which takes another path while torch traces it"
           if check else "the forward takes another path while torch traces it (a check "
                         "such as torch.compiler.is_compiling())")
    return (f"{model}'s forward raised {type(error).__name__} at {where}: {first}, while "
            f"torch.export traced it; eager runs on these inputs: {why}. Pass explicitly what "
            f"eager computes on that path (transformers models: an attention_mask, "
            f"torch.ones_like(input_ids) when nothing is padded), or change that code, then "
            f"call remat again")
