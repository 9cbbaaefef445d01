"""Plan once for all ranks: rank 0 lowers and plans, every rank runs its plan.

Under DDP or FSDP every rank trains the same model on inputs of the same shapes,
so one plan serves all. Planning on each rank would profile and solve N times
and, with profiled costs or a solver time limit, could give ranks different
schedules (different recomputations, hence different collectives' timing, and
with FSDP different unshard orders). `plan_once` therefore first compares the
ranks' input signatures (`runtimes.signatures`): a rank whose call differs gets
one error naming the rank and the argument, on every rank at once (no rank is
left waiting in a collective). Then rank 0 plans and broadcasts the graph and
schedule as protobuf bytes; an error while planning (an infeasible budget) is
raised on every rank too.
"""

from __future__ import annotations

from collections.abc import Callable

from remat_ir.ir import Graph, RematIRError, pb


class RankMismatch(RematIRError):
    """Ranks called with inputs of different signatures, or planning failed on rank 0."""


def plan_once(plan: Callable[[object, tuple, dict], tuple[Graph, pb.Schedule]], model,
              args: tuple, kwargs: dict) -> tuple[Graph, pb.Schedule]:
    """`plan(model, args, kwargs)` run on rank 0 only, its result on every rank (a
    collective: every rank of the default group must call it)."""
    import torch.distributed as dist

    from remat_ir.runtimes.signatures import call_signature

    rank = dist.get_rank()
    signatures: list = [None] * dist.get_world_size()
    dist.all_gather_object(signatures, call_signature(args, kwargs))
    for other, signature in enumerate(signatures):
        if signature != signatures[0]:
            raise RankMismatch(
                f"rank {other}'s inputs differ from rank 0's ({signature.difference(signatures[0])}); "
                "remat-ir plans once for all ranks, so every rank must call with inputs of the "
                "same shapes (give each rank the same batch size: drop_last=True in the "
                "DataLoader, or pad the last batch)")
    payload: list = [None]
    if rank == 0:
        try:
            graph, schedule = plan(model, args, kwargs)
            payload[0] = ("plan", graph.proto.SerializeToString(), schedule.SerializeToString())
        except RematIRError as refused:
            payload[0] = ("error", type(refused).__name__, str(refused))
            dist.broadcast_object_list(payload, src=0)
            raise
    dist.broadcast_object_list(payload, src=0)
    kind, first, second = payload[0]
    if kind == "error":
        raise RankMismatch(f"planning on rank 0 failed ({first}): {second}")
    if rank == 0:
        return graph, schedule
    received, schedule = pb.Graph(), pb.Schedule()
    received.ParseFromString(first)
    schedule.ParseFromString(second)
    return Graph(received), schedule
