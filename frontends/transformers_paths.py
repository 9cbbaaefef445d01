"""transformers' models take eager's code path while torch.export traces them.

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
"""

from __future__ import annotations

import contextlib
import sys

#: The checks answered as eager answers them.
CHECKS = ("is_torchdynamo_exporting", "is_torchdynamo_compiling")
#: transformers' modules whose checks are answered (prefixes of module names).
_SCOPE = "transformers.models."


@contextlib.contextmanager
def eager_paths(changed: list[str], kept: frozenset = frozenset()):
    """Within: transformers' models see eager's answer to `CHECKS`, except at the call
    sites in `kept`; "file:line calls check()" is appended to `changed` for each call
    site whose answer that changed."""
    with swapped_globals(_SCOPE, CHECKS, lambda check, function: _as_eager(check, function, changed, kept)):
        yield


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


def _as_eager(check: str, original, changed: list[str], kept: frozenset):
    def answer(*args, **kwargs):
        traced = original(*args, **kwargs)
        if not traced:
            return traced
        caller = sys._getframe(1)
        where = f"{caller.f_code.co_filename}:{caller.f_lineno} calls {check}()"
        if where in kept:
            return traced
        if where not in changed:
            changed.append(where)
        return False
    return answer
