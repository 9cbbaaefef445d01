"""Where in the user's code something happened: the innermost frame outside torch and
remat-ir's frontends, which is the model's own line (a branch on tensor data that
export failed on, a gradient hook put on in the forward)."""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
import traceback

import torch

_SKIPPED = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
#: PyTorch's own modules a model calls (its layers, distributions, functional ops).
_LIBRARY = tuple(os.path.join(os.path.dirname(torch.__file__), part)
                 for part in ("nn", "distributions", "functional.py", "ao"))


def is_model_file(filename: str) -> bool:
    """Whether code in `filename` is the model's (or its libraries'), not torch's, the
    frontends' or Python's standard library's (torch.export entering a `contextlib`
    context is no line of the model: a failure there was named as the model's own, "eager
    raises it too"), nor code made at run time (a BatchNorm with `momentum=None` failed
    "at <string>:1 in <lambda>", a frame of torch's symbolic shapes)."""
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return False   # code made at run time (`<string>`, FX's `<eval_with_key>.3`)
    path = os.path.abspath(filename)
    return not path.startswith(_SKIPPED) and not (path.startswith(_STDLIB)
                                                  and not path.startswith(_PACKAGES))


#: Where installed packages live (inside the standard library's folder on some systems).
_PACKAGES = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep
                   for key in ("purelib", "platlib")})
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
#: Where installed packages and the standard library live: code there is a library's.
_INSTALLED = (*_PACKAGES, _STDLIB)


#: Code of remat-ir's own functions that stand between the model's line and a hook looking
#: for it: `Tensor.__setattr__` while tracing (`tensor_attributes`) runs the property
#: setters other hooks install (`.data`, `.grad`, `requires_grad`), which then found it
#: where they looked for the model's line, and let a refused write through.
_PASSING: set = set()


def passing(function):
    """Mark `function` as one `model_caller` and `past_passing` look past."""
    _PASSING.add(function.__code__)
    return function


def past_passing(frame):
    """`frame`, or the first frame above it that is not a `passing` function's."""
    while frame is not None and frame.f_code in _PASSING:
        frame = frame.f_back
    return frame


def model_caller(depth: int) -> str | None:
    """'file:line' of the frame `depth` above the function calling this one (`passing`
    functions not counted), where that frame runs the model's code (`is_model_file`); else
    None. For the tracing hooks that note what the model's own code does, and not torch's."""
    frame = past_passing(sys._getframe(depth + 1))
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if is_model_file(frame.f_code.co_filename) else None


def is_users_file(filename: str) -> bool:
    """Whether code in `filename` is the user's own, not an installed package's (a
    library such as transformers keeps private bookkeeping on modules) nor torch's."""
    if os.path.isabs(filename):
        return _is_users_path(filename)
    return is_model_file(filename) and not os.path.abspath(filename).startswith(_INSTALLED)


@functools.lru_cache(maxsize=4096)
def _is_users_path(path: str) -> bool:
    """`is_users_file` of an absolute path, which the working directory does not change:
    each lowering asks it of every object in the user's globals."""
    return is_model_file(path) and not os.path.abspath(path).startswith(_INSTALLED)


def in_users_file(module_name: str) -> bool:
    """Whether the Python module `module_name` (a class's or function's `__module__`) is
    one of the user's own files: a library's objects keep bookkeeping of their own."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if module_name == "__main__" and module is not None and not (isinstance(file, str) and os.path.isfile(file)):
        return True   # a notebook's, `python -c`'s, `python - < f`'s (taken for a library's: review R5)
    return isinstance(file, str) and is_users_file(file)


def model_line(frames: list[traceback.FrameSummary]) -> str | None:
    """'file:line in function' of the innermost of `frames` outside torch and the
    frontends, or None if every frame is theirs."""
    found = None
    for frame in frames:
        if is_model_file(frame.filename):
            found = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return found


def library_line(frames: list[traceback.FrameSummary]) -> str | None:
    """'torch/nn/modules/batchnorm.py:193 in forward': the innermost of `frames` below the
    model's own line that is in the PyTorch modules a model calls (its layers other than
    `Module`'s call machinery, distributions, functional ops), or None."""
    last = max((i for i, f in enumerate(frames) if is_model_file(f.filename)), default=-1)
    found = None
    for frame in frames[last + 1:]:
        path = os.path.abspath(frame.filename)
        if path.startswith(_LIBRARY) and not path.endswith(os.path.join("modules", "module.py")):
            shown = os.path.relpath(path, os.path.dirname(os.path.dirname(torch.__file__)))
            found = f"{shown}:{frame.lineno} in {frame.name}"
    return found


def node_line(node) -> str | None:
    """'file:line in function' of the model's own code that made FX `node` (its innermost
    frame outside torch and the frontends), from the stack trace tracing recorded."""
    text = getattr(node, "meta", {}).get("stack_trace") or ""
    frames = [traceback.FrameSummary(f, int(line), name, lookup_line=False)
              for f, line, name in re.findall(r'File "(.*?)", line (\d+), in (\S+)', text)]
    return model_line(frames)
