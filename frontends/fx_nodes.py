"""Building new nodes in a joint graph that later passes and the lowering read like the
traced ones.

The lowering reads each node's metadata: its fake result (`val`: shape, dtype,
storage), its module path and sequence number (error messages, names), and the
partitioner's tag (which side of the step it runs on). Rewrites (`dropout_masks`,
`view_compaction`) add nodes that stand for part of a traced one, so they copy its
metadata and compute their own fake result.
"""

from __future__ import annotations

import torch
import torch.fx


def add_call(graph: torch.fx.Graph, meta: dict, target, args: tuple, kwargs: dict | None = None
             ) -> torch.fx.Node:
    """A call of `target` at the graph's insertion point, with `meta` (less any `val`) and
    its own fake result, computed from its arguments' (call it under their fake mode)."""
    kwargs = kwargs or {}
    new = graph.call_function(target, args, kwargs)
    new.meta.update({k: v for k, v in meta.items() if k != "val"})
    new.meta["val"] = target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args],
                             **kwargs)
    return new
