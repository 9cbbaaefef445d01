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
from collections.abc import Mapping

#: module name -> the namespace lowering found its code reading, in this process.
_REMEMBERED: dict[str, Mapping] = {}


def remember(namespace: Mapping) -> None:
    """Remember `namespace` (a function's `__globals__`) under its module's name."""
    name = namespace.get("__name__")
    if isinstance(name, str) and name:
        _REMEMBERED[name] = namespace


def namespace(module_name: str) -> Mapping | None:
    """The globals of module `module_name` as the model's code reads them: the namespace
    remembered at lowering, else the registered module's; None where neither is known."""
    found = _REMEMBERED.get(module_name)
    if found is not None:
        return found
    module = sys.modules.get(module_name)
    return vars(module) if module is not None else None


class AttributeNamespace(Mapping):
    """A namespace whose names stand for attributes of one object, read when looked up:
    the code a custom autograd Function's class or a `torch.library` op's registration
    holds (`frontends/applied_code.py`), which no Python module's globals name (a class a
    factory function made). Read live, so that a method assigned to the class after
    lowering (`Rev.backward = staticmethod(...)`, `register_autograd` called again) is
    the one compared."""

    def __init__(self, name: str, owner, attributes: dict[str, str]):
        self._name, self._owner, self._attributes = name, owner, dict(attributes)

    def __getitem__(self, key: str):
        if key == "__name__":
            return self._name
        attribute = self._attributes[key]
        try:
            return getattr(self._owner, attribute)
        except AttributeError:
            raise KeyError(key) from None

    def __iter__(self):
        return iter(["__name__", *self._attributes])

    def __len__(self) -> int:
        return 1 + len(self._attributes)
