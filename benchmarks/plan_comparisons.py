"""What the old-against-new plan benchmarks share (`fastsa_small_graphs.py`,
`hiremate_checkmate_share.py`): a verdict per case, and the summary they print and write.

An answer is {"fits": True, "time_s": ..., "peak": ...} or {"fits": False, "floor": ...}:
a plan within the budget, or the smallest feasible budget named by the refusal."""

from __future__ import annotations

import json
import time
from pathlib import Path

from remat_ir import solvers


def answer(plan) -> tuple[dict, float]:
    """`plan()`'s answer (a schedule, or an InfeasibleBudget raised) and its seconds."""
    started = time.perf_counter()
    try:
        s = plan()
        found = {"fits": True, "time_s": s.predicted_time_s, "peak": s.predicted_peak_bytes}
    except solvers.InfeasibleBudget as refused:
        found = {"fits": False, "floor": refused.smallest_feasible}
    return found, time.perf_counter() - started


def verdict(old: dict, new: dict) -> str:
    """"same", "better" or "worse": a slower plan (by over 1e-9), a refusal where the other
    plans, or a higher floor named is worse."""
    if old["fits"] and new["fits"]:
        return ("worse" if new["time_s"] > old["time_s"] * (1 + 1e-9)
                else "better" if new["time_s"] < old["time_s"] * (1 - 1e-9) else "same")
    if old["fits"] != new["fits"]:
        return "worse" if old["fits"] else "better"
    return "worse" if new["floor"] > old["floor"] else "better" if new["floor"] < old["floor"] else "same"


def summarize(rows: list, out: Path, what: str, old: str, **settings) -> dict:
    """Count the verdicts and the seconds of `rows` (each with "verdict", "old_s", "new_s"),
    print them (`what`: the new way, `old`: the old one, in words), write `out`."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("same", "better", "worse")}
    seconds = (sum(r["old_s"] for r in rows), sum(r["new_s"] for r in rows))
    summary = {**settings, "cases": len(rows), **counts,
               "seconds_old": seconds[0], "seconds_new": seconds[1]}
    print(f"{len(rows)} cases {what}: {counts}; {seconds[0]:.0f} s {old}, {seconds[1]:.0f} s now")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return summary
