"""Fast SA on small graphs: its plans with the moves it makes now against 200,000 moves.

    python benchmarks/fastsa_small_graphs.py            # writes the results file
    python benchmarks/fastsa_small_graphs.py --per-node 3300

Fast SA made at least 200,000 moves (`fastsa.MIN_ITERATIONS`) on any graph; on a graph of
fewer than 40 nodes it now makes `SMALL_GRAPH_MOVES_PER_NODE` per node. Checkmate and
hiremate start from its plan on every call, so this is most of their time on small graphs.
Cases: chains of 3-30 layers (`tests/builders.chain`) at 90/70/50/40/30% of their peak,
and the random graphs of the property tests (`tests/strategies.training_graphs`, drawn
derandomized) at budgets of 20-100% and of 70-100% of their peak. Each case is planned
both ways; a plan counts as worse if slower, and a refusal if it names a higher floor or
refuses where the other plans. Writes benchmarks/results/fastsa_small_graphs.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from builders import chain  # noqa: E402
from plan_comparisons import answer, summarize, verdict  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from strategies import training_graphs  # noqa: E402

from remat_ir import ir  # noqa: E402
from remat_ir.solvers import fastsa as F  # noqa: E402
from remat_ir.solvers.structure import TrainingGraph  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "fastsa_small_graphs.json"
OLD_MOVES = 200_000


def plan(graph: ir.Graph, budget: int, iterations: int) -> tuple[dict, float]:
    return answer(lambda: F.fastsa(graph, budget, iterations=iterations))


def compare(rows: list, graph: ir.Graph, share: float, label: str, per_node: int) -> None:
    budget = max(1, int(ir.store_all(graph).predicted_peak_bytes * share))
    nodes = len(TrainingGraph(graph).order)
    moves = min(F.MAX_ITERATIONS, max(F.MOVES_PER_NODE * nodes, min(OLD_MOVES, per_node * nodes)))
    old, old_s = plan(graph, budget, max(OLD_MOVES, F.MOVES_PER_NODE * nodes))
    new, new_s = plan(graph, budget, moves)
    rows.append({"case": label, "nodes": nodes, "share": share, "moves": moves, "old": old,
                 "new": new, "old_s": old_s, "new_s": new_s, "verdict": verdict(old, new)})
    print(f"{label:>8} {nodes:3d} nodes {share:.2f}: {rows[-1]['verdict']} ({old_s:.2f} s -> {new_s:.2f} s)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-node", type=int, default=F.SMALL_GRAPH_MOVES_PER_NODE,
                        help="moves per node on graphs under 200,000 / per-node nodes")
    parser.add_argument("--examples", type=int, default=120, help="random graphs per budget range")
    args = parser.parse_args()
    rows: list = []
    for layers in (3, 5, 8, 12, 20, 30):
        graph, _ = chain(layers, f_time=1.0, b_time=2.0)
        for share in (0.9, 0.7, 0.5, 0.4, 0.3):
            compare(rows, graph, share, f"chain{layers}", args.per_node)
    for low in (0.2, 0.7):
        @settings(max_examples=args.examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(graph=training_graphs(), share=st.floats(low, 1.0))
        def random_graphs(graph, share):
            compare(rows, graph, share, "random", args.per_node)
        random_graphs()
    summarize(rows, OUT, f"at {args.per_node} moves per node", "with 200,000 moves",
              per_node=args.per_node)

if __name__ == "__main__":
    main()
