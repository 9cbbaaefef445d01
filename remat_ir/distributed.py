"""Plans under torch.distributed: one plan for all ranks where their inputs agree, each
rank's own where they do not (DDP with dynamic padding), never a rank left waiting.

Ranks whose calls have the same input signature (`runtimes.signatures`) get one plan:
rank 0 lowers and plans and broadcasts the graph and schedule as protobuf bytes
(`plan_together`). That saves N-1 profilings and solves, and gives every rank the same
schedule, which FSDP2 needs: the runtime gathers and frees units where the plan reads
them, so two plans would call the collectives in two orders. A planning error (an
infeasible budget) is raised on every rank.

DDP needs no such thing: each rank's step computes eager's gradients whatever its plan,
and DDP's reducer launches its all-reduces in bucket order, not in the order gradients
become ready. With dynamic padding (transformers' collators pad each batch to its
longest row) every rank meets its own lengths, so a rank whose call has a new signature
plans it alone (`ScheduledModule` asks the planner for a plan of its own when the module
is not sharded by FSDP2): it cannot wait for the others, who may have planned that shape
already. Until 2026-11-30 any rank's new signature was a collective and ranks whose
shapes differed all raised `RankMismatch`, so DDP training with dynamic padding could
not run at all. `remat` itself is called by every rank at once: ranks whose example
batches differ each plan their own there too, and say so (`per_rank`), so that a module
later sharded by FSDP2 refuses to run plans that differ across ranks.
"""

from __future__ import annotations

from collections.abc import Callable

from remat_ir.ir import Graph, RematIRError, pb


class RankMismatch(RematIRError):
    """Ranks that must share a plan called with inputs of different signatures, or
    planning failed on one rank."""


Plan = Callable[[object, tuple, dict], tuple[Graph, pb.Schedule]]


def plan_together(plan: Plan, model, args: tuple, kwargs: dict, *, same_plan: bool
                  ) -> tuple[Graph, pb.Schedule, bool]:
    """(graph, schedule, per_rank): `plan(model, args, kwargs)` run on rank 0 only and
    its result sent to every rank where all ranks' signatures agree (per_rank False);
    where they differ, each rank's own plan (per_rank True), or `RankMismatch` on every
    rank if `same_plan` (FSDP2). A collective: every rank of the default group must call
    it."""
    import torch.distributed as dist

    from remat_ir.runtimes.signatures import call_signature

    rank = dist.get_rank()
    signatures: list = [None] * dist.get_world_size()
    dist.all_gather_object(signatures, call_signature(args, kwargs))
    differing = next((other for other, signature in enumerate(signatures)
                      if signature != signatures[0]), None)
    if differing is not None:
        if same_plan:
            raise RankMismatch(
                f"rank {differing}'s inputs differ from rank 0's "
                f"({signatures[differing].difference(signatures[0])}); under FSDP2 every rank "
                "runs one plan (its gathers and frees follow the plan), so every rank must call "
                "with inputs of the same shapes (pad batches to a fixed length, "
                "padding='max_length', and give each rank the same batch size: drop_last=True "
                "in the DataLoader); DDP takes ranks of different shapes")
        return (*_planned_by_each(plan, model, args, kwargs), True)
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
        return graph, schedule, False
    received, schedule = pb.Graph(), pb.Schedule()
    received.ParseFromString(first)
    schedule.ParseFromString(second)
    return Graph(received), schedule, False


def _planned_by_each(plan: Plan, model, args: tuple, kwargs: dict) -> tuple[Graph, pb.Schedule]:
    """Each rank's own plan; a rank whose planning failed raises its error, and every
    other rank a `RankMismatch` naming it, so that none goes on alone."""
    import torch.distributed as dist

    planned = failure = None
    try:
        planned = plan(model, args, kwargs)
    except RematIRError as refused:
        failure = refused
    outcomes: list = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, None if failure is None else f"{type(failure).__name__}: {failure}")
    if failure is not None:
        raise failure
    failed = next(((other, outcome) for other, outcome in enumerate(outcomes) if outcome), None)
    if failed is not None:
        raise RankMismatch(f"planning on rank {failed[0]} failed ({failed[1]})")
    return planned
