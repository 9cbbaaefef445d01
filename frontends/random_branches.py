"""A branch decided by a random draw (LayerDrop), said as such.

transformers' speech and time-series models skip whole layers at random in training
(LayerDrop: `if torch.rand([]) < self.layerdrop`, 0.1 by default in Wav2Vec2's, HuBERT's
and the time-series models' configs). torch.export cannot branch on the draw, and the
error said "a value computed from tensor data" and to move the loss out of the forward,
which does not help. One graph runs the same ops every step; what does help is turning
the skip off or writing it as a product with a drawn mask, which the graph keeps.
"""

from __future__ import annotations

import linecache
import re
import traceback

from .model_lines import is_model_file

#: Calls that draw random numbers into a tensor a branch could then read.
_DRAWS = re.compile(r"\btorch\.(rand|rand_like|randn|randint|bernoulli)\s*\(|\.(uniform_|bernoulli_)\s*\(")
#: How many lines above the branch a draw counts as what it reads.
_ABOVE = 6

HINT = ("a random draw decides whether code runs (LayerDrop, stochastic depth), and one "
        "graph runs the same ops every step: turn the skip off in training (transformers: "
        "layerdrop=0.0 in the config; peft's LoKr and LoHa draw and compare even with "
        "module_dropout=0.0, so they cannot be traced in training), or scale by a drawn "
        "mask instead of skipping, as drop-path does, which the graph keeps and remat-ir "
        "replays with eager's numbers")


NUMBER_HINT = ("a random draw read as a Python number (a crop's or a roll's offset, a size) "
               "makes a graph of its own for each value: draw it outside the forward and pass "
               "it as an int argument (remat-ir plans each value it meets, up to max_plans), or "
               "compute with it as a tensor (a shift by `F.grid_sample`, a mask), which the graph "
               "keeps and remat-ir replays with eager's numbers")

#: Reading a tensor as a Python number.
_AS_NUMBER = re.compile(r"\b(int|float|bool)\s*\(|\.(item|tolist)\s*\(")

#: A line that branches (`if float(torch.rand([])) < p:` is LayerDrop's branch still).
_BRANCH = re.compile(r"^\s*(if|elif|while)\b")

#: A line starting a function (or method) definition.
_DEF = re.compile(r"^\s*(?:async\s+)?def\s")


def drawn_branch(frames: list[traceback.FrameSummary]) -> bool:
    """Whether the model's innermost line among `frames` branches just below a random
    draw in the same function (the draw at most `_ABOVE` lines above it)."""
    lines = _lines_up_to(frames)
    return lines is not None and any(_DRAWS.search(line) for line in lines)


def drawn_number(frames: list[traceback.FrameSummary]) -> bool:
    """Whether the model's innermost line among `frames` reads a random draw as a Python
    number (`i = int(torch.randint(0, 4, ()))`): said as a branch before, with advice
    about skipped layers that fits no offset (found by hunt56)."""
    lines = _lines_up_to(frames)
    # The draw on the line itself: an input's length read below a draw is no draw's
    # (`n = int(lengths.max())` under a noise line, read as eager's; test_input_sizes).
    return (lines is not None and bool(_AS_NUMBER.search(lines[-1]) and _DRAWS.search(lines[-1]))
            and not _BRANCH.match(lines[-1]))


def _lines_up_to(frames: list[traceback.FrameSummary]) -> list[str] | None:
    """The lines of the function holding the model's innermost line among `frames`, at
    most `_ABOVE` above it, up to it; None where no frame is the model's."""
    frame = next((f for f in reversed(frames) if is_model_file(f.filename)), None)
    if frame is None or frame.lineno is None:
        return None
    lines = [linecache.getline(frame.filename, n)
             for n in range(max(1, frame.lineno - _ABOVE), frame.lineno + 1)]
    # Only the function's own lines: a helper or a module-level draw written just above it
    # made a branch on an activation "a branch on a random draw" (found by a review).
    starts = [i for i, line in enumerate(lines) if _DEF.match(line)]
    return lines[starts[-1] + 1 if starts else 0:]
