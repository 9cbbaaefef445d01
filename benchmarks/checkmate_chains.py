"""Checkmate MILP solve time on chains of 17, 33, 49 and 65 nodes.

Reference (the project's first measurements, flat Checkmate in CBC on this stack): 0.2 s, 2 s,
17 s, nothing in 90 s. tests/builders.chain(n) has n forward and n backward
nodes, so each size runs as the next even count (18, 34, 50, 66 nodes).
Budget: 60% of store-everything. Writes benchmarks/results/checkmate_chains.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from builders import chain  # noqa: E402

from remat_ir import ir, solvers  # noqa: E402
from remat_ir.solvers import SolverError  # noqa: E402
from remat_ir.solvers.milp import solver_name  # noqa: E402

SIZES = (17, 33, 49, 65)
REFERENCE_S = {17: 0.2, 33: 2.0, 49: 17.0, 65: None}
TIME_LIMIT_S = 90.0
SHARE = 0.6


def main() -> None:
    rows = []
    for size in SIZES:
        graph, _ = chain((size + 1) // 2)
        graph.proto.name = f"chain{size}"
        reference = ir.store_all(graph)
        budget = int(reference.predicted_peak_bytes * SHARE)
        print(f"chain of {len(graph.nodes)} nodes, budget {SHARE:.0%}...", flush=True)
        started = time.monotonic()
        try:
            s = solvers.solve(graph, budget, "checkmate", time_limit_s=TIME_LIMIT_S,
                              progress=lambda m: print("  " + m, flush=True))
            row = dict(nodes=len(graph.nodes), seconds=round(time.monotonic() - started, 3),
                       status=ir.pb.SolveStatus.Name(s.status).lower(),
                       time_over_store_all=round(s.predicted_time_s / reference.predicted_time_s, 4),
                       peak_share=round(s.predicted_peak_bytes / reference.predicted_peak_bytes, 4))
        except SolverError as error:
            row = dict(nodes=len(graph.nodes), seconds=round(time.monotonic() - started, 3),
                       status="none", error=str(error))
        row["reference_seconds"] = REFERENCE_S[size]
        rows.append(row)
        print(f"  -> {row}", flush=True)
    out = ROOT / "benchmarks" / "results" / "checkmate_chains.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(milp_backend=solver_name(), budget_share=SHARE,
                                   time_limit_s=TIME_LIMIT_S, runs=rows), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
