"""transformers' models, and any code outside torch asking torch's own checks, take
eager's code path while torch.export traces them.

Model code asks `is_torchdynamo_exporting()` and `is_torchdynamo_compiling()` to pick a
path that export targets or torch.compile can run, and under torch.export both say yes.
Some of those paths compute otherwise than eager's: the gated delta rule of Qwen3-Next,
Qwen3.5 and OLMo-hybrid inverts its triangular system by forward substitution, a loop of
63 small in-place updates, where eager calls `torch.linalg.solve_triangular` (logits and
every gradient up to 1.3e-6 off eager's, at store-everything). remat-ir runs the graph
eagerly, op by op or compiled by its own backend, so the path eager takes is the one to
trace.

So while tracing, in transformers' model modules, both checks answer no, and each call
site where that changed the answer is recorded. Not in `masking_utils`, whose decisions
`transformers_masks.py` answers, nor in `import_utils`, whose `is_tracing` keeps saying
that a traced tensor holds no values, nor in `integrations`: its mixture-of-experts code
avoids `_grouped_mm` under torch.compile because the op's fake kernel refuses float32,
which its CPU kernel runs, so eager's path there cannot be traced. Where eager's path
cannot be traced in a model either (it reads a value), the caller traces again with the
last call sites given export's answer, one more each time, and says which kept export's
path (`frontends/torch.py::_trace_eager_paths`).

torch's own checks (`torch.compiler.is_compiling()`, `is_exporting()`,
`torch._dynamo.is_compiling()`, `torch.fx._symbolic_trace.is_fx_tracing()`) say yes under
torch.export too. A model's or library's branch on them (a fused path against an eager
loop, a cache skipped under compile) took the compiling path in the graph, silently
(found by a review: a loss of 0.32 where eager's is 0.09). Called from outside torch,
transformers (whose checks are answered above) and remat-ir, they answer as eager does,
alike: each call site recorded, export's answer kept where eager's path cannot be
traced. torch's own calls keep export's answer, which its tracing needs, and so do
remat-ir's (its runtime runs the model itself under export). A check imported by name
before lowering (`from torch.compiler import is_compiling`) is not seen.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys

#: The checks answered as eager answers them.
CHECKS = ("is_torchdynamo_exporting", "is_torchdynamo_compiling")
#: transformers' modules whose checks are answered (prefixes of module names).
_SCOPE = "transformers.models."
#: torch's checks, answered as eager answers them to callers outside `_KEEPING`: (module, name).
TORCH_CHECKS = (("torch.compiler", "is_compiling"), ("torch.compiler", "is_dynamo_compiling"),
                ("torch.compiler", "is_exporting"), ("torch._dynamo", "is_compiling"),
                ("torch._dynamo.external_utils", "is_compiling"), ("torch._utils", "is_compiling"),
                ("torch.fx._symbolic_trace", "is_fx_tracing"))
#: remat-ir's own code: installed, one folder; in a checkout, the package's folders (not
#: its tests, whose models are user code).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN = ((_ROOT,) if os.path.basename(_ROOT) == "remat_ir" else
        tuple(os.path.join(_ROOT, name) for name in ("remat_ir", "frontends", "runtimes", "torchlib", "ir", "solvers")))
#: Where callers keep export's answer to torch's checks: torch itself; transformers (whose
#: own checks `CHECKS` answers; its `integrations` keep export's on purpose); remat-ir,
#: whose runtime asks them to run the model itself under export (a model routed through
#: its plan, `remat(..., in_place=True)`, lowered again, recursed without end).
_KEEPING = tuple(os.path.dirname(importlib.util.find_spec(name).origin) + os.sep
                 for name in ("torch", "transformers") if importlib.util.find_spec(name) is not None) + \
    tuple(path + os.sep for path in _OWN)


@contextlib.contextmanager
def eager_paths(changed: list[str], kept: frozenset = frozenset()):
    """Within: transformers' models see eager's answer to `CHECKS`, and code outside torch,
    transformers and remat-ir eager's answer to `TORCH_CHECKS`, except at the call sites in `kept`;
    "file:line calls check()" is appended to `changed` for each call site whose answer
    that changed."""
    originals = [(importlib.import_module(module), name) for module, name in TORCH_CHECKS]
    originals = [(module, name, getattr(module, name)) for module, name in originals if hasattr(module, name)]
    with swapped_globals(_SCOPE, CHECKS, lambda check, function: _as_eager(check, function, changed, kept)):
        for module, name, function in originals:
            setattr(module, name, _as_eager(name, function, changed, kept, outside=_KEEPING))
        try:
            yield
        finally:
            for module, name, function in originals:
                setattr(module, name, function)


@contextlib.contextmanager
def swapped_globals(prefix: str, names, replacement):
    """Within: in every loaded module whose name starts with `prefix`, each callable global
    named in `names` is `replacement(name, function)`; put back after. Why per module: model
    code calls the function it imported by name, so patching its home module alone misses
    it (transformers' checks here, its `torch_compilable_check` in `tensor_checks.py`)."""
    originals = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(prefix):
            continue
        for name in names:
            function = vars(module).get(name)
            if callable(function):
                originals[(module, name)] = function
    try:
        for (module, name), function in originals.items():
            setattr(module, name, replacement(name, function))
        yield
    finally:
        for (module, name), function in originals.items():
            setattr(module, name, function)


def _as_eager(check: str, original, changed: list[str], kept: frozenset, outside: tuple = ()):
    """`original` answering False, as eager does, except at the call sites in `kept` and
    to callers whose file starts with one of `outside`."""
    def answer(*args, **kwargs):
        traced = original(*args, **kwargs)
        if not traced:
            return traced
        caller = sys._getframe(1)
        if outside and caller.f_code.co_filename.startswith(outside):
            return traced
        where = f"{caller.f_code.co_filename}:{caller.f_lineno} calls {check}()"
        if where in kept:
            return traced
        if where not in changed:
            changed.append(where)
        return False
    return answer
