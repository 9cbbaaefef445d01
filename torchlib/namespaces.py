"""The global namespaces a model's code reads, by module name, as lowering found them.

The runtime compares the globals a forward read while traced (`runtimes/traced_reads.py`)
by module name. Looked up in `sys.modules` alone, a module the user loaded without
registering it (`importlib.util.spec_from_file_location` then `exec_module`,
`runpy.run_path`, the `hubconf.py` of `torch.hub.load(source="local")`) was never compared:
a global changed after `remat` trained on with the traced value, silently (found by a
review: 10.6 off eager's gradient); and a script run under a runner whose `__main__` is
not the script's (`python -m cProfile`) was refused at its first call, its globals read
from the runner's. The frontend remembers the namespace its functions' code reads
(`remember`: their `__globals__`, the dicts that code reads at every call), and the
runtime reads globals there first (`namespace`), from `sys.modules` where lowering was in
another process (a saved graph loaded: an unregistered module is then not compared).
"""

from __future__ import annotations

import sys

#: module name -> the namespace lowering found its code reading, in this process.
_REMEMBERED: dict[str, dict] = {}


def remember(namespace: dict) -> None:
    """Remember `namespace` (a function's `__globals__`) under its module's name."""
    name = namespace.get("__name__")
    if isinstance(name, str) and name:
        _REMEMBERED[name] = namespace


def namespace(module_name: str) -> dict | None:
    """The globals of module `module_name` as the model's code reads them: the namespace
    remembered at lowering, else the registered module's; None where neither is known."""
    found = _REMEMBERED.get(module_name)
    if found is not None:
        return found
    module = sys.modules.get(module_name)
    return vars(module) if module is not None else None
