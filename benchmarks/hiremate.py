"""HiRemate (`hiremate`) planning time and plan quality, CBC on this machine.

    python benchmarks/hiremate.py

- GPT-2 with 12 layers (d=768, seq 512, batch 8) and a diffusers U-Net
  (64x64, batch 8), lowered with FLOP costs: hiremate at 50% and 30% of the
  store-everything peak, time limit 60 s each; planning seconds, predicted
  peak share and overhead (time / store-everything time - 1).
  Targets: <= 60 s; overhead <= 10% at 50%, <= 20% at 30%.
- GPT-2: the peak of checkpointing every transformer block (what
  torch.utils.checkpoint per block does: keep each block's input, recompute
  the block in its backward), and hiremate's time at that peak. Target: lower.
- The same runs with `leaf_solvers="checkmate"` (Checkmate's plans of the
  smallest clusters pooled with the H-ILP's options): whether the default,
  the H-ILP's options alone, is the right one.
- Chains small enough for checkmate to prove its optimum (10 to 36 nodes) at
  budgets from 90% to 40%: hiremate's time / checkmate's. Target: <= 1.03.

The MILPs run in CBC ($REMAT_IR_MILP=cbc) whatever is installed. Writes
benchmarks/results/hiremate.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ["REMAT_IR_MILP"] = "cbc"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))

import models  # noqa: E402
from builders import chain  # noqa: E402

from remat_ir import ir, solvers  # noqa: E402
from remat_ir.lowering import lower_torch  # noqa: E402
from remat_ir.solvers import InfeasibleBudget  # noqa: E402
from remat_ir.solvers.sequences import keep_set_schedule  # noqa: E402
from remat_ir.solvers.structure import TrainingGraph  # noqa: E402

SHARES = (0.5, 0.3)
TIME_LIMIT_S = 60.0
OUT = ROOT / "benchmarks" / "results" / "hiremate.json"


def say(message: str) -> None:
    print(message, flush=True)


def plan(graph: ir.Graph, budget: int, reference: ir.pb.Schedule, **options) -> dict:
    started = time.monotonic()
    try:
        s = solvers.solve(graph, budget, "hiremate", time_limit_s=TIME_LIMIT_S,
                          progress=lambda m: say("    " + m) if "structures solved" not in m else None,
                          **options)
    except InfeasibleBudget as refused:
        return dict(seconds=round(time.monotonic() - started, 2), feasible=False,
                    smallest_feasible_share=round(refused.smallest_feasible
                                                  / reference.predicted_peak_bytes, 4))
    return dict(seconds=round(time.monotonic() - started, 2), feasible=True,
                peak_share=round(s.predicted_peak_bytes / reference.predicted_peak_bytes, 4),
                overhead=round(s.predicted_time_s / reference.predicted_time_s - 1, 4))


def per_block_checkpoint(graph: ir.Graph) -> ir.pb.Schedule:
    """torch.utils.checkpoint around every transformer block: a block keeps only what
    leaves it (its output) and recomputes the rest in its backward."""
    tg = TrainingGraph(graph)
    block = {}
    for n in tg.forward:
        parts = graph.node(n).source.split(" ")[0].split(".")
        if "h" in parts and parts.index("h") + 1 < len(parts):
            block[n] = int(parts[parts.index("h") + 1])
    kept = {n for n in tg.forward if n not in block}
    kept |= {n for n in block if any(block.get(u) != block[n] for u in tg.node_users[n]
                                     if u in block or u in kept)}
    return keep_set_schedule(tg, tg.with_roots(kept), name="per-block checkpoint")


def model_rows(name: str, factory) -> dict:
    model, inputs = factory()
    say(f"{name}: lowering...")
    started = time.monotonic()
    graph = lower_torch(model, inputs, cost_model="flops")
    lowering = time.monotonic() - started
    reference = ir.store_all(graph)
    row = dict(nodes=len(graph.nodes), forward_nodes=len(graph.phase_order(ir.pb.FORWARD)),
               lowering_seconds=round(lowering, 1), runs={})
    for share in SHARES:
        say(f"{name}: hiremate at {share:.0%}")
        row["runs"][f"{share:.0%}"] = plan(graph, int(reference.predicted_peak_bytes * share), reference)
        say(f"  -> {row['runs'][f'{share:.0%}']}")
    row["runs_with_checkmate_leaves"] = {}
    for share in SHARES:
        say(f"{name}: hiremate at {share:.0%}, leaf_solvers=checkmate")
        found = plan(graph, int(reference.predicted_peak_bytes * share), reference,
                     leaf_solvers="checkmate")
        row["runs_with_checkmate_leaves"][f"{share:.0%}"] = found
        say(f"  -> {found}")
    if name == "gpt2":
        checkpoint = per_block_checkpoint(graph)
        share = checkpoint.predicted_peak_bytes / reference.predicted_peak_bytes
        say(f"{name}: per-block checkpoint peaks at {share:.1%}; hiremate there")
        ours = plan(graph, checkpoint.predicted_peak_bytes, reference)
        row["per_block_checkpoint"] = dict(
            peak_share=round(share, 4),
            overhead=round(checkpoint.predicted_time_s / reference.predicted_time_s - 1, 4),
            hiremate_at_that_peak=ours)
        say(f"  -> {row['per_block_checkpoint']}")
    return row


def small_graph_rows() -> dict:
    ratios = []
    for n in (5, 8, 12, 18):
        graph, _ = chain(n)
        peak = ir.store_all(graph).predicted_peak_bytes
        for share in (0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4):
            budget = int(peak * share)
            try:
                exact = solvers.solve(graph, budget, "checkmate", time_limit_s=TIME_LIMIT_S)
            except InfeasibleBudget:
                continue
            if exact.status != ir.pb.OPTIMAL:
                continue
            try:
                ours = solvers.solve(graph, budget, "hiremate", time_limit_s=TIME_LIMIT_S)
                ratios.append(dict(nodes=len(graph.nodes), share=share,
                                   ratio=round(ours.predicted_time_s / exact.predicted_time_s, 4)))
            except InfeasibleBudget:
                ratios.append(dict(nodes=len(graph.nodes), share=share, ratio=None))
    worst = max((r["ratio"] for r in ratios if r["ratio"] is not None), default=None)
    say(f"chains: {len(ratios)} budgets checkmate proves optimal; worst hiremate/checkmate {worst}")
    return dict(worst_ratio=worst, infeasible_for_hiremate=sum(r["ratio"] is None for r in ratios),
                runs=ratios)


def main() -> None:
    results = dict(milp_backend="cbc", cpu_count=os.cpu_count(), time_limit_s=TIME_LIMIT_S,
                   cost_model="flops", models={})
    results["models"]["gpt2"] = model_rows("gpt2", models.gpt2_base)
    results["models"]["unet"] = model_rows("unet", models.unet)
    results["small_graphs_vs_checkmate"] = small_graph_rows()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    say(f"wrote {OUT}")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
