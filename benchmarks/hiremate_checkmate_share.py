"""Hiremate on graphs small enough for Checkmate's exact MILP: its plans with the MILP
given all the time left in hiremate's planning phase against a share of it.

    python benchmarks/hiremate_checkmate_share.py                  # writes the results file
    python benchmarks/hiremate_checkmate_share.py --share 0.25 --time-limit 30

On a graph whose exact MILP has at most `hiremate.EXACT_BINARIES` binaries, hiremate runs
Checkmate's MILP after its own plans, warm-started from the fastest that fits. That MILP
rarely proves optimality on such graphs (the 70-node MLP with dropout at 90%: a 32% gap
after 8 s), so it ran until the phase's deadline: most of a small model's planning time.
Cases: chains of 12-60 layers (`tests/builders.chain`), the tiny zoo models and ONNX zoo
graphs that take that path, each at 90/70/50/35% of its store-everything peak. Each case
is planned both ways, alternately (the machine's load touches both alike); a plan counts
as worse if slower by more than 1e-9, a refusal if it names a higher floor. Writes
benchmarks/results/hiremate_checkmate_share.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plan_comparisons import answer, summarize, verdict  # noqa: E402

from remat_ir import ir, solvers  # noqa: E402
from remat_ir.solvers import hiremate as H  # noqa: E402
from remat_ir.solvers.checkmate import binaries  # noqa: E402
from remat_ir.solvers.structure import TrainingGraph  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "hiremate_checkmate_share.json"
SHARES_OF_PEAK = (0.9, 0.7, 0.5, 0.35)


def graphs(quick: bool):
    """(label, graph) of every case graph that takes hiremate's Checkmate path."""
    from builders import chain

    for layers in (12, 24) if quick else (12, 24, 40, 60):
        yield f"chain{layers}", chain(layers, f_time=1.0, b_time=2.0)[0]
    from exactness import lowered
    import zoo_models
    for name in ("mlp_dropout",) if quick else sorted(zoo_models.ZOO):
        graph = lowered(name)
        if binaries(TrainingGraph(graph)) <= H.EXACT_BINARIES:
            yield name, graph
    if not quick:
        import onnx_models as om
        from remat_ir.lowering import lower_onnx_module
        from remat_ir.frontends import onnx as onnx_frontend
        for name in ("bvlc_alexnet", "zfnet512"):
            module, examples = onnx_frontend.to_torch(om.rebatched(om.zoo_paths()[name], 64),
                                                      trainable="constants")
            yield name, lower_onnx_module(module, examples, cost_model="flops")


def plan(graph: ir.Graph, budget: int, share: float, limit: float) -> tuple[dict, float]:
    H.CHECKMATE_SHARE = share
    own = ir.Graph(ir.pb.Graph.FromString(graph.proto.SerializeToString()))
    return answer(lambda: solvers.solve(own, budget, "hiremate", time_limit_s=limit))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--share", type=float, default=H.CHECKMATE_SHARE,
                        help="the MILP's share of the phase's time left (compared with 1.0)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="hiremate's time limit (s)")
    parser.add_argument("--quick", action="store_true", help="two chains and the MLP only")
    args = parser.parse_args()
    rows: list = []
    for label, graph in graphs(args.quick):
        peak = ir.store_all(graph).predicted_peak_bytes
        for share_of_peak in SHARES_OF_PEAK:
            budget = int(peak * share_of_peak)
            old, old_s = plan(graph, budget, 1.0, args.time_limit)
            new, new_s = plan(graph, budget, args.share, args.time_limit)
            rows.append({"case": label, "nodes": len(graph.proto.nodes), "budget_share": share_of_peak,
                         "old": old, "new": new, "old_s": old_s, "new_s": new_s,
                         "verdict": verdict(old, new)})
            print(f"{label:>14} {share_of_peak:.2f}: {rows[-1]['verdict']} "
                  f"({old_s:.1f} s -> {new_s:.1f} s)", flush=True)
    summarize(rows, OUT, f"with the MILP at {args.share} of the time left", "with all of it",
              share=args.share, time_limit_s=args.time_limit)

if __name__ == "__main__":
    main()
