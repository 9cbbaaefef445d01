"""What a forward asks of torch.distributed while traced: its rank, or a collective.

Under torch.distributed, ranks whose inputs agree share one plan, which rank 0 lowers
(`remat_ir/distributed.py`). Two things a forward may do there depend on the rank:

- It reads its rank (`dist.get_rank()`, `get_rank(group)`, a group's `rank()`: a
  per-rank offset, scale or slice). The trace
  bakes rank 0's number into the graph, and every other rank trained with it: rank 1's
  outputs 0.135 off eager DDP's, its parameters 0.04 off under FSDP2, silently (found
  by a review). The rank read is now recorded as a value the forward read
  (`TracedReads.globals`, the row `("torch.distributed", "get_rank", ("call",))`), which
  the runtime compares at every call as it compares a global: a rank whose number
  differs plans its own (as for any per-rank attribute or environment variable).
- It calls a collective (`dist.all_reduce` of a statistic, as SyncBatchNorm does;
  `torch.distributed.nn.functional.all_reduce`). Rank 0 lowers alone while the other
  ranks wait for its plan in a broadcast, so the forward's collective met theirs: every
  rank hung until the process group's timeout, and one died of heap corruption (found
  by a review). A graph could not hold one either: a plan that recomputes it calls it
  again on one rank. Refused before it runs, naming the call (docs/distributed.md lists
  collectives in the forward as not done); FSDP2's own gathers are torch's, not the
  model's, and go through.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from .attribute_patches import replaced
from .errors import LoweringError
from .model_lines import is_model_file

#: torch.distributed's collectives and point-to-point calls a forward may make.
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
                "all_gather_single", "broadcast", "broadcast_object_list", "reduce",
                "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
                "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv")
#: Where torch's own autograd collectives call them for the model (`dist.nn.all_reduce`).
_AUTOGRAD_COLLECTIVES = os.path.join("distributed", "nn", "functional.py")
#: The row a rank read is recorded as (`TracedReads.globals`).
RANK_READ = ("torch.distributed", "get_rank", ("call",))


@contextlib.contextmanager
def distributed_calls_watched(module, globals_read: dict):
    """Within, where torch.distributed is initialized: `dist.get_rank()` called by the
    code of `module` (the model) is recorded in `globals_read` (module docstring), and a
    collective it calls raises one LoweringError before it runs."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    model = type(module).__name__
    tracing = threading.get_ident()
    c10d = dist.distributed_c10d
    originals = {name: getattr(dist, name) for name in ("get_rank", *_COLLECTIVES) if hasattr(dist, name)}
    in_c10d = {name: getattr(c10d, name) for name in originals if hasattr(c10d, name)}

    def by_model(depth: int) -> str | None:
        """'file:line' of the model's code calling, `depth` frames up, also through
        torch.distributed's own code (its autograd collectives, a DeviceMesh's
        `get_local_rank()`, which reads `get_rank(group)`: baked in before, found by a
        review), or None where torch's own code outside it calls (FSDP2's gathers, run by
        a module's hooks)."""
        if threading.get_ident() != tracing:
            return None
        frame, through = sys._getframe(depth), False
        while frame is not None and _torch_distributed(frame.f_code.co_filename):
            through = through or frame.f_code.co_filename.endswith(_AUTOGRAD_COLLECTIVES)
            frame = frame.f_back
        if frame is None:
            return "torch.distributed.nn.functional" if through else None
        if not is_model_file(frame.f_code.co_filename):
            return None
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"

    def get_rank(group=None):
        rank = originals["get_rank"](group)
        if by_model(2) is not None:
            # In a group too (`get_rank(group)`, refused before): the global rank is
            # recorded, which decides the group's for groups made alike on every rank.
            globals_read.setdefault(RANK_READ, originals["get_rank"]())
        return rank

    def reading_the_rank(method):
        """`method` of a group or mesh the model holds, recording the rank read where the
        model calls it: a group's `rank()` (torch's C++ method) and a DeviceMesh's
        `get_coordinate()` (a list it made at construction) were baked in as
        `get_rank()` was (rank 1 trained 1.06 and 2.43 off under DDP, found by a review)."""
        def read(owner, *args, **kwargs):
            if by_model(2) is not None:
                globals_read.setdefault(RANK_READ, originals["get_rank"]())
            return method(owner, *args, **kwargs)
        return read

    from torch.distributed.device_mesh import DeviceMesh

    def refusing(name: str):
        def collective(*args, **kwargs):
            where = by_model(2)
            if where is not None:
                raise LoweringError(
                    f"{model}'s forward calls torch.distributed.{name} at {where}: a collective "
                    f"inside the forward is not supported (one rank lowers the model while the "
                    f"others wait, and a plan recomputing it would call it again on one rank; "
                    f"docs/distributed.md). Call it outside the module given to remat_ir.remat "
                    f"(SyncBatchNorm: use BatchNorm, or keep that layer out of the module)")
            return originals[name](*args, **kwargs)
        return collective

    patched = {"get_rank": get_rank, **{name: refusing(name) for name in originals if name != "get_rank"}}
    # Also where `distributed_c10d` holds them (`dist.distributed_c10d.get_rank()`), and
    # where the model's own files bound them by name before tracing (`from torch.distributed
    # import all_reduce`): a collective called so ran, and under several ranks hung as
    # any did (found by a review).
    with contextlib.ExitStack() as patches:
        patches.enter_context(replaced(dist, patched))
        patches.enter_context(replaced(c10d, {name: patched[name] for name in in_c10d}))
        patches.enter_context(replaced(dist.ProcessGroup, {"rank": reading_the_rank(dist.ProcessGroup.rank)}))
        patches.enter_context(replaced(DeviceMesh, {"get_coordinate": reading_the_rank(DeviceMesh.get_coordinate)}))
        by_function = {id(function): patched[name] for name, function in originals.items()}
        for namespace in _model_namespaces(module):
            bound = {name: by_function[id(value)] for name, value in list(namespace.items())
                     if id(value) in by_function}   # the originals live on: ids are theirs
            if bound:
                patches.enter_context(replaced(namespace, bound))
        yield


#: Where torch.distributed's code lives, and autograd's `Function.apply`, which its
#: autograd collectives (`torch.distributed.nn.functional`) run through.
_DISTRIBUTED = (os.path.join("torch", "distributed", ""), os.path.join("torch", "autograd", "function.py"))


def _torch_distributed(filename: str) -> bool:
    return any(part in filename for part in _DISTRIBUTED)


def _model_namespaces(module) -> list[dict]:
    """The global namespaces of the code of `module`'s classes (their `forward`'s
    `__globals__`: also a module loaded without registering it), the model's files only."""
    found: dict[int, dict] = {}
    for sub in module.modules():
        forward = getattr(type(sub), "forward", None)
        space = getattr(forward, "__globals__", None)
        code = getattr(forward, "__code__", None)
        if isinstance(space, dict) and code is not None and is_model_file(code.co_filename):
            found.setdefault(id(space), space)
    return list(found.values())


def rank_read_by_name(globals_read: dict) -> None:
    """Record the rank where the forward called `torch.distributed.get_rank` through a
    name bound before tracing (`from torch.distributed import get_rank`), which calls
    the function itself, past `distributed_calls_watched`: found among the global
    functions the forward read (`traced_reads.record_globals`), after tracing. Found by a
    review: rank 1 trained with rank 0's number, 0.116 off."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    for module, name, where in list(globals_read):
        if where == ("function",) and _global(module, name) is dist.distributed_c10d.get_rank:
            globals_read.setdefault(RANK_READ, dist.get_rank())


def _global(module: str, name: str):
    """The global `name` of the module named `module`, or None."""
    return getattr(sys.modules.get(module), name, None)
