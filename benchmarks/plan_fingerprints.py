"""Every solver's plan on a few graphs, as figures to compare between two trees.

    python benchmarks/plan_fingerprints.py                        # writes the results file
    python benchmarks/plan_fingerprints.py --compare OTHER.json   # and lists what differs

A change that only moves code (a memory-model refactor) must leave every plan's
predicted peak and time where they were; a change meant to improve plans shows
where it did. Graphs: a 12-link chain and examples/mlp.rir (every solver), the tiny
GPT-2 and U-Net of examples/models.py with FLOP costs (rotor, hiremate, sqrt), at
80%, 50% and 30% of the store-everything peak. MILPs run in CBC. Writes
benchmarks/results/plan_fingerprints.json: per case, peak bytes, predicted
seconds and a digest of the compute sequence, or the refusal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ["REMAT_IR_MILP"] = "cbc"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))

import models  # noqa: E402
import torch  # noqa: E402
from builders import chain  # noqa: E402

from remat_ir import ir, solvers  # noqa: E402
from remat_ir.lowering import lower_torch  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "plan_fingerprints.json"
SHARES = (0.8, 0.5, 0.3)
EVERY_SOLVER = ("rotor", "hiremate", "checkmate", "sqrt", "recompute-all")
LARGE_SOLVERS = ("rotor", "hiremate", "sqrt")


def graphs():
    yield "chain12", chain(12)[0], EVERY_SOLVER
    yield "mlp", ir.load(ROOT / "examples" / "mlp.rir"), EVERY_SOLVER
    for name in ("gpt2", "unet"):
        torch.manual_seed(0)
        model, inputs = getattr(models, name)()
        yield name, lower_torch(model, inputs, cost_model="flops"), LARGE_SOLVERS


def fingerprint(graph: ir.Graph, solver: str, share: float):
    try:
        s = solvers.solve(graph, f"{share:.0%}", solver, time_limit_s=120)
    except solvers.InfeasibleBudget as refused:
        return f"refused: smallest feasible {refused.smallest_feasible}"
    computes = ",".join(str(step.compute) for step in s.steps if step.HasField("compute"))
    return [s.predicted_peak_bytes, round(s.predicted_time_s, 9),
            hashlib.sha1(computes.encode()).hexdigest()[:12]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", type=Path, help="an earlier results file to list differences from")
    args = parser.parse_args()
    results = {}
    for name, graph, names in graphs():
        for solver in names:
            for share in SHARES:
                key = f"{name}/{solver}/{share:.0%}"
                results[key] = fingerprint(ir.loads(ir.dumps(graph)), solver, share)
                print(key, results[key], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {OUT}")
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = [k for k in results if before.get(k) != results[k]]
        print(f"{len(results)} cases, {len(differ)} differ from {args.compare}")
        for k in differ:
            print(f"  {k}: {before.get(k)} -> {results[k]}")


if __name__ == "__main__":
    main()
