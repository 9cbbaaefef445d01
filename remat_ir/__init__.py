"""remat-ir: train in less memory by recomputing activations, with the least slowdown.

The facade wires the layers together: `remat_ir.ir` (the IR, files, simulator),
`remat_ir.frontends`, `remat_ir.solvers`, `remat_ir.runtimes`, and the
`remat-ir` command (`remat_ir.cli`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("remat-ir")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"


def __getattr__(name):
    # `remat` and `remat_onnx` import torch; load it on first use so that `import remat_ir.ir` stays light.
    if name in ("remat", "remat_onnx", "plan", "parse_budget", "InfeasibleBudget"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'remat_ir' has no attribute {name!r}")
