"""Exactness across transformers' model families: each trains like eager or is refused.

For each family of `family_models.FAMILIES` (tiny configs, random weights), in a
process of its own with a time limit: lower it, train two SGD-with-momentum steps next
to eager under a random schedule that recomputes 80% of what it can (`tests/exactness.py`:
outputs, every gradient, every buffer and the generator state compared), then the same
through `remat_ir.remat` at 50% of the store-everything peak (at the smallest feasible
budget, in bytes, where 50% is below a tiny model's floor). Each mode ends as "bitwise",
"NOT BITWISE" (with the largest relative errors: a silent error to fix), "refused" (a
remat-ir error, the first words of its message) or "CRASH" (any other error: an error
from deep inside, to fix). The model is lowered from a copy of itself that no call has
run, as a model built again in another process would be (Funnel's refused call showed
only so).

    python benchmarks/families.py                       # every family (about 15 min on 2 cores)
    python benchmarks/families.py --families gpt-neo,patchtst   # their rows replaced

Writes benchmarks/results/families.json (one row per family) and
benchmarks/results/families.md (the table); prints a line per family as it goes.
2026-11-30 (97 entries: 96 families, SwitchTransformers also with a mask): 81 bitwise in
both modes, 16 refused by line in both, none NOT BITWISE or CRASH. A sweep before it
found PatchTST's crash and Funnel's refused call; this one's first full run, CLIP 1.3e-7
off from a first PatchTST fix. All three are fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

RESULTS = HERE / "results"
#: Seconds one family may take, all modes together.
TIME_LIMIT_S = 300


def _outcome(exc: Exception) -> str:
    from remat_ir.ir import RematIRError

    text = " ".join(str(exc).split())
    text = re.sub(r" \(Could not .*?symbols: [^)]*\)\)", "", text)   # torch's words on the expression
    text = re.sub(r"\S*site-packages/", "", text)[:300]
    if isinstance(exc, RematIRError):
        return f"refused: {type(exc).__name__}: {text}"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"CRASH: {type(exc).__name__}: {text} (at {frame.filename}:{frame.lineno})"


def _errors(errors: dict) -> str:
    if not errors:
        return "bitwise"
    worst = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    return "NOT BITWISE: " + ", ".join(f"{what} {error:.1e}" for what, error in worst)


def run_family(name: str) -> dict:
    """One family's row: its class, parameters, and each mode's outcome and seconds."""
    import torch

    import family_models
    import remat_ir
    from exactness import random_schedule, side_by_side
    from remat_ir.lowering import lower_torch
    from remat_ir.runtimes.torch import ScheduledModule

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    family_models.quiet()

    def build():
        torch.manual_seed(0)
        return family_models.FAMILIES[name]()

    model, args, kwargs, loss_of = build()
    row = {"family": name, "class": type(model).__name__,
           "parameters": sum(p.numel() for p in model.parameters())}

    def random_plan(fresh):
        graph = lower_torch(build()[0], args, example_kwargs=kwargs, cost_model="flops")
        return ScheduledModule(fresh, graph, random_schedule(graph, random.Random(1), recompute_share=0.8))

    def planned(fresh):
        budget = 0.5
        try:
            scheduled = remat_ir.remat(fresh, args, example_kwargs=kwargs, budget=budget, cost_model="flops")
        except remat_ir.InfeasibleBudget as refused:   # a tiny model's floor: its smallest plan
            if refused.smallest_feasible is None:
                raise LookupError("no plan at all") from None
            budget = refused.smallest_feasible
            scheduled = remat_ir.remat(fresh, args, example_kwargs=kwargs, budget=budget, cost_model="flops")
        row["budget"] = budget
        return scheduled

    for mode, make in (("random", random_plan), ("planned", planned)):
        start = time.perf_counter()
        model, args, kwargs, loss_of = build()
        try:
            row[mode] = _errors(side_by_side(model, make, args, kwargs, loss_of, steps=2, tolerance=1.0))
        except LookupError as missing:
            row[mode] = f"no plan: {missing}"
        except Exception as exc:  # noqa: BLE001  every outcome is a row
            row[mode] = _outcome(exc)
        row[f"{mode}_s"] = round(time.perf_counter() - start, 1)
    return row


def _table(rows: list[dict]) -> str:
    lines = ["| family | class | random schedule (80% recomputed) | remat() | budget |",
             "|---|---|---|---|---|"]
    for row in rows:
        cells = [row["family"], row.get("class", ""), row.get("random", row.get("failure", "")),
                 row.get("planned", ""), str(row.get("budget", ""))]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    counts: dict[str, int] = {}
    for row in rows:
        for mode in ("random", "planned"):
            kind = row.get(mode, "CRASH").split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
    summary = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
    return f"{len(rows)} families; outcomes over both modes: {summary}\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    import family_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", help="comma-separated names (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # the worker: one family, a JSON row out
    options = parser.parse_args()
    if options.one:
        print(json.dumps(run_family(options.one)))
        return
    names = options.families.split(",") if options.families else list(family_models.FAMILIES)
    unknown = [n for n in names if n not in family_models.FAMILIES]
    if unknown:
        sys.exit(f"unknown families {unknown}; known: {', '.join(family_models.FAMILIES)}")
    rows = []
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    for i, name in enumerate(names, 1):
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                                  timeout=TIME_LIMIT_S, env=environment, cwd=ROOT)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                "family": name, "failure": f"CRASH: worker exited {done.returncode}: "
                                           + " ".join(done.stderr.split()[-40:])}
        except subprocess.TimeoutExpired:
            row = {"family": name, "failure": f"CRASH: over {TIME_LIMIT_S} s"}
        rows.append(row)
        print(f"[{i}/{len(names)}] {name}: {row.get('random', row.get('failure', ''))[:100]} | "
              f"{row.get('planned', '')[:60]} ({time.perf_counter() - start:.0f} s)", flush=True)
    RESULTS.mkdir(exist_ok=True)
    if options.families and (RESULTS / "families.json").exists():   # some again: the others kept
        again = {row["family"]: row for row in rows}
        rows = [again.pop(row["family"], row) for row in json.loads((RESULTS / "families.json").read_text())]
        rows += list(again.values())
    (RESULTS / "families.json").write_text(json.dumps(rows, indent=1) + "\n")
    (RESULTS / "families.md").write_text("# Exactness across transformers' families\n\n"
                                         "`python benchmarks/families.py` (CPU, tiny configs)\n\n" + _table(rows))
    print(f"wrote {RESULTS / 'families.md'}")


if __name__ == "__main__":
    main()
