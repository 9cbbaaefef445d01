"""The cast cache of each `torch.autocast` block inside a forward, as eager has it.

Why: eager's autocast keeps one cast of a parameter per cache (`autocast_casts`), and
whether a block caches at all is its `cache_enabled`: given, or else the setting around
the block when it was made (the caller's, on by default). torch.export traces with the
cache off, and records each block's setting resolved then: a block that left it at its
default is recorded as one that turned it off, so the two could not be told apart. A
block written `cache_enabled=False` had its weight's casts shared as a cached block's
are, 3.1e-3 relative off eager's gradients, silently (found by a review).

So while tracing (`eager_block_caches`), a block made without `cache_enabled` takes
eager's resolution: the setting of the block around it, or the call's. The exported
graph's `wrap_with_autocast` nodes then hold each block's eager setting, which
`block_caches` reads for `autocast_casts.share_autocast_casts`. Tracing itself casts
once per reader whatever the setting (AOTAutograd's tensors are not leaves).

How long a cache lives is the other half: eager clears it when the outermost autocast
block ends (`torch.autocast_decrement_nesting() == 0`), a block entered with autocast
off counting too. Called inside a block of the caller's (a training loop's
`torch.autocast(..., enabled=use_amp)`), every block of the forward shares one cache
with the caller's casts and with the module's other calls in that block; called outside
any, each top-level block has its own. A call's nesting (`types.autocast_nested`) is part
of the signature of a graph with blocks of its own (`runtimes/signatures.py`).
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.fx

from .attribute_patches import replaced

_autocast = torch.amp.autocast_mode.autocast
_WRAP = "wrap_with_autocast"


@contextlib.contextmanager
def eager_block_caches():
    """Within: a `torch.autocast` made in this thread without `cache_enabled` takes the
    setting eager would give it (module docstring), not the traced one (off)."""
    thread = threading.get_ident()
    settings = [torch.is_autocast_cache_enabled()]   # the call's, read outside tracing
    init, enter, leave = _autocast.__init__, _autocast.__enter__, _autocast.__exit__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        init(self, device_type, dtype, enabled, cache_enabled)
        if cache_enabled is None and threading.get_ident() == thread:
            self._cache_enabled = settings[-1]

    def __enter__(self):
        if threading.get_ident() == thread:
            settings.append(self._cache_enabled)
        return enter(self)

    def __exit__(self, *exc):
        if threading.get_ident() == thread and len(settings) > 1:
            settings.pop()
        return leave(self, *exc)

    with replaced(_autocast, {"__init__": __init__, "__enter__": __enter__, "__exit__": __exit__}):
        yield


def has_blocks(exported: torch.export.ExportedProgram) -> bool:
    """Whether the forward has a `torch.autocast` block that casts (one entered enabled)."""
    return any(enabled for _, settings in _top_blocks(exported.graph_module)
               for enabled, _ in settings)


def block_caches(exported: torch.export.ExportedProgram) -> dict[str, bool | None]:
    """Whether eager caches casts in each top-level `torch.autocast` block of the forward,
    by the name of its `wrap_with_autocast` node (the name a joint graph's cast names as
    its origin, `autocast_casts._region`): True or False where every enabled block in it,
    nested ones included, has that setting, None where they differ (a nested block's
    casts are named after the top-level block, so which cached cannot be told)."""
    caches = {}
    for name, settings in _top_blocks(exported.graph_module):
        found = {cache for enabled, cache in settings if enabled}
        caches[name] = found.pop() if len(found) == 1 else (None if found else True)
    return caches


def _top_blocks(module: torch.fx.GraphModule):
    """(name, [(enabled, cache_enabled) of it and each block nested in it]) per top-level
    block of `module`."""
    for node in module.graph.nodes:
        if node.op == "call_function" and _WRAP in str(node.target):
            yield node.name, list(_settings(module, node))


def _settings(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(enabled, cache_enabled) of the block `node` and of the blocks nested in it."""
    _, _, enabled, cache, body = node.args[:5]
    yield bool(enabled), bool(cache)
    inner = getattr(module, body.target, None) if isinstance(body, torch.fx.Node) else None
    if isinstance(inner, torch.fx.GraphModule):
        for nested in inner.graph.nodes:
            if nested.op == "call_function" and _WRAP in str(nested.target):
                yield from _settings(inner, nested)
