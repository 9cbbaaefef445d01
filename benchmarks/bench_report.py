"""Tables and pictures from a training-step results file (`training_step.py`).

    python benchmarks/bench_report.py RESULTS.jsonl [--readme]

remakes `RESULTS.md` and one `RESULTS-MODEL.png` per model from the JSON lines
alone, so that every figure shown comes from a results file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from remat_ir.runtimes.timing import ratio_interval

README_BEGIN = "<!-- training-step results: begin (written by benchmarks/training_step.py --readme) -->"
README_END = "<!-- training-step results: end -->"

FAMILY_STYLE = {  # matplotlib marker and colour per method family
    "eager": ("o", "black"), "checkpoint": ("s", "tab:orange"),
    "compile": ("^", "tab:green"), "remat-ir": ("D", "tab:blue"),
}


#: How far a prediction may be from the measured ratio's interval and still count as
#: right (issue 25's target), and the interval's level: `training_step.judge_prediction`
#: judges by them and every table and picture here says them.
PREDICTION_TOLERANCE = 0.03
INTERVAL_LEVEL = 0.95
TOLERANCE_TEXT, LEVEL_TEXT = f"{PREDICTION_TOLERANCE:.0%}", f"{INTERVAL_LEVEL:.0%}"


def append_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _mib(n) -> str:
    return f"{n / 2**20:,.1f}"


def _by_model(rows: list[dict]) -> dict[str, list[dict]]:
    models: dict[str, list[dict]] = {}
    for row in rows:
        models.setdefault(row["model"], []).append(row)
    return models


def table(rows: list[dict]) -> str:
    """The markdown table of one run: a section per model, a line per method."""
    first = rows[0]
    versions = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    lines = [f"Run `{first['run']}` ({first['mode']} mode) on {first['device']} "
             f"({first['machine']['cpus']} CPUs, {first['machine']['platform']}), commit "
             f"`{first['commit']}`{' with local changes' if first['commit_dirty'] else ''}; {versions}; "
             f"allocator: {first.get('allocator', 'default')}. "
             "Peak: allocator peak of one forward + backward step above what was allocated before it. "
             "Time: median step time over interleaved rounds, as a ratio to eager's in the same run. "
             "remat-ir's predicted figures come from its simulator; the last two columns are step time "
             "relative to remat-ir's own store-everything schedule run with the same backend, predicted "
             "(from op times measured with that backend: compiled regions' times for [inductor] rows) "
             "and measured (what the "
             f"time model is judged by, with the {LEVEL_TEXT} interval that resampling the run's rounds gives it); "
             "its budgets are shares of the simulated store-everything peak.", ""]
    for model, model_rows in _by_model(rows).items():
        ok = [r for r in model_rows if r["status"] == "ok"]
        nodes = next((r["graph_nodes"] for r in model_rows if "graph_nodes" in r), None)
        lines += [f"**{model}**: {model_rows[0]['model_description']}"
                  + (f"; {nodes:,} IR nodes" if nodes else "") + ".", "",
                  "| method | peak MiB | peak vs eager | step time vs eager | setup s | "
                  "remat-ir predicted peak MiB | time vs store-everything: predicted | measured |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in ok:
            measured = _measured_cell(r)
            predicted = (f"{_mib(r['predicted_peak_bytes'])} | x{r['predicted_time_ratio']:.3f} | {measured}"
                         if "predicted_peak_bytes" in r else "| | ")
            lines.append(f"| {r['method']} | {_mib(r['peak_bytes'])} | {r['peak_ratio']:.1%} | "
                         f"x{r['step_time_ratio']:.3f} | {r['setup_s']:.1f} | {predicted} |")
        for r in model_rows:
            if r["status"] == "infeasible":
                smallest = r.get("smallest_feasible_bytes")
                share = (f"; smallest feasible {smallest / r['store_all_predicted_peak_bytes']:.1%} "
                         "of store-everything" if smallest else "")
                lines.append(f"| {r['method']} | infeasible{share} | | | {r['planning_s']:.1f} | | | |")
        lines.append("")
        lines += time_model_summary(ok)
        lines += peer_points(model_rows)
    return "\n".join(lines)


def _measured_cell(r: dict) -> str:
    """The measured ratio, with the interval the run's rounds give it where recorded."""
    if "measured_time_ratio" not in r:
        return ""
    interval = r.get("measured_time_interval")
    return f"x{r['measured_time_ratio']:.3f}" + (f" ({interval[0]:.3f}-{interval[1]:.3f})" if interval else "")


def time_model_summary(ok_rows: list[dict]) -> list[str]:
    """One line: how many remat-ir plans' predictions lie within the tolerance of the
    interval of their measured ratio, naming those that do not (store-everything, 1.0
    against itself, left out)."""
    judged = [r for r in ok_rows if "prediction_within_tolerance" in r and r.get("budget") != "store-everything"]
    if not judged:
        return []
    off = [f"{r['method'].replace('remat-ir ', '')} (predicted x{r['predicted_time_ratio']:.3f})"
           for r in judged if not r["prediction_within_tolerance"]]
    lines = [f"Time model: {len(judged) - len(off)} of {len(judged)} plans predicted within {TOLERANCE_TEXT} of "
             f"the {LEVEL_TEXT} interval of their measured ratio (rounds resampled)"
             + (f"; not: {', '.join(off)}." if off else ".")]
    priced = [r for r in judged if "prediction_without_call_within_tolerance" in r]
    if priced:  # the same plans of the same run judged without the runtime's time per call
        calls = sorted({r["call_overhead_s"] * 1e3 for r in priced})
        measured = f"{calls[0]:.2f} ms" if len(calls) == 1 else f"{calls[0]:.2f}-{calls[-1]:.2f} ms"
        with_it = sum(r["prediction_within_tolerance"] for r in priced)
        without = sum(r["prediction_without_call_within_tolerance"] for r in priced)
        lines.append(f"Of the {len(priced)} plans priced with the runtime's time per call ({measured} "
                     f"measured at profiling): {with_it} within {TOLERANCE_TEXT} with it, {without} without it.")
    return lines + [""]


def peer_points(model_rows: list[dict]) -> list[str]:
    """Lines of the table that sets each peer (checkpointing, torch.compile at a budget)
    beside remat-ir planned at the peer's measured peak, per backend, from one run."""
    ok = {r["method"]: r for r in model_rows if r["status"] == "ok"}
    at = {}
    for r in model_rows:
        if "peer" in r:
            at.setdefault(r["peer"], {})[r.get("backend", "eager")] = r
    if not at:
        return []
    backends = sorted({b for by in at.values() for b in by}, key=lambda b: b != "eager")
    kept = all("step_times_s" in r for r in model_rows if r["status"] == "ok")  # older runs did not
    lines = ["At each peer's measured peak (step time vs eager; remat-ir planned with that peak "
             "as its byte budget):", "",
             "| peer | peer peak vs eager | peer time | " + " | ".join(f"remat-ir {b}: peak, time"
                                                                   for b in backends)
             + (f" | best remat-ir / peer ({LEVEL_TEXT} interval, rounds resampled) |" if kept
                else " | best remat-ir / peer |"),
             "|---|---:|---:|" + "---:|" * len(backends) + "---:|"]
    for peer, by in at.items():
        p = ok.get(peer)
        if p is None:
            continue
        cells, best = [], None
        for b in backends:
            r = by.get(b)
            if r is None or r["status"] != "ok":
                cells.append("infeasible" if r is not None else "")
                continue
            cells.append(f"{r['peak_ratio']:.1%}, x{r['step_time_ratio']:.3f}")
            if best is None or r["step_time_ratio"] < best["step_time_ratio"]:
                best = r
        ratio = f"{best['step_time_ratio'] / p['step_time_ratio']:.3f}" if best else ""
        if best and "step_times_s" in best and "step_times_s" in p:
            low, high = ratio_interval(best["step_times_s"], p["step_times_s"], per_round=best["timed_per_round"])
            ratio += f" ({low:.3f}-{high:.3f})"
        lines.append(f"| {peer} | {p['peak_ratio']:.1%} | x{p['step_time_ratio']:.3f} | "
                     + " | ".join(cells) + f" | {ratio} |")
    return lines + [""]


def picture(rows: list[dict], path: Path) -> None:
    """Step-time ratio against peak memory (share of eager's) for every method of one
    model: the lower left is better; the Pareto front is what a user can choose from."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for family, (marker, colour) in FAMILY_STYLE.items():
        points = [r for r in ok if r["family"] == family]
        if points:
            ax.scatter([100 * r["peak_ratio"] for r in points], [r["step_time_ratio"] for r in points],
                       marker=marker, color=colour, label=family, s=50, zorder=3)
    placed: list[tuple[float, float]] = []
    for r in sorted(ok, key=lambda r: r["peak_ratio"]):
        label = r["method"].replace("remat-ir ", "").replace("torch.compile budget", "compile")
        x, y = 100 * r["peak_ratio"], r["step_time_ratio"]
        # A point within 12 points of peak and 15% of time of one labelled already gets its
        # label below the marker, so that the two labels do not overprint.
        near = any(abs(x - px) < 12 and abs(y / py - 1) < 0.15 for px, py in placed)
        ax.annotate(label, (x, y), fontsize=7, xytext=(4, -9 if near else 3),
                    textcoords="offset points")
        placed.append((x, y))
    front, best = [], float("inf")
    for r in sorted(ok, key=lambda r: (r["peak_ratio"], r["step_time_ratio"])):
        if r["step_time_ratio"] < best:
            front.append(r)
            best = r["step_time_ratio"]
    ax.step([100 * r["peak_ratio"] for r in front], [r["step_time_ratio"] for r in front],
            where="post", color="grey", linewidth=0.8, linestyle="--", label="Pareto front", zorder=1)
    first = rows[0]
    ax.set_title(f"{first['model_description']} ({first['device']})", fontsize=9)
    ratios = [r["step_time_ratio"] for r in ok]
    if max(ratios) > 4 * min(ratios):  # one extreme plan would flatten all the others
        ax.set_yscale("log")
    ax.set_xlabel("peak memory of a training step, % of eager")
    ax.set_ylabel("step time / eager step time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def time_model_picture(rows: list[dict], path: Path) -> bool:
    """Predicted against measured step time (both relative to remat-ir's store-everything)
    for every remat-ir plan of the run, one colour per cost model: the time model is good
    where points lie in the band around the diagonal. Whether it was drawn: not where no
    plan ran beside store-everything (every budget asked below the floor)."""
    # Store-everything is 1.0 against itself by definition: left out.
    points = [r for r in rows if "measured_time_ratio" in r and r.get("budget") != "store-everything"]
    if not points:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    models = sorted({r.get("cost_model", "profile") for r in points})
    for model, colour in zip(models, ("tab:blue", "tab:orange", "tab:green")):
        mine = [r for r in points if r.get("cost_model", "profile") == model]
        ax.scatter([r["measured_time_ratio"] for r in mine], [r["predicted_time_ratio"] for r in mine],
                   color=colour, label=f"{model} costs", s=40, zorder=3)
        spans = [r for r in mine if "measured_time_interval" in r]
        if spans:  # the interval the run's rounds give each measured ratio
            ax.errorbar([r["measured_time_ratio"] for r in spans], [r["predicted_time_ratio"] for r in spans],
                        xerr=[[r["measured_time_ratio"] - r["measured_time_interval"][0] for r in spans],
                              [r["measured_time_interval"][1] - r["measured_time_ratio"] for r in spans]],
                        fmt="none", ecolor=colour, alpha=0.5, linewidth=1, zorder=2)
        for r in mine:
            label = f"{r['model']} {r['method'].replace('remat-ir ', '').split(' (')[0]}"
            ax.annotate(label, (r["measured_time_ratio"], r["predicted_time_ratio"]), fontsize=6,
                        xytext=(4, 2), textcoords="offset points")
    ends = [min(min(r["measured_time_ratio"], r["predicted_time_ratio"]) for r in points) * 0.97,
            max(max(r["measured_time_ratio"], r["predicted_time_ratio"]) for r in points) * 1.03]
    ax.plot(ends, ends, color="grey", linewidth=0.8)
    ax.fill_between(ends, [e * (1 - PREDICTION_TOLERANCE) for e in ends],
                    [e * (1 + PREDICTION_TOLERANCE) for e in ends], color="grey", alpha=0.15,
                    label=f"within {TOLERANCE_TEXT}")
    ax.set_xlabel("measured step time / store-everything's")
    ax.set_ylabel("predicted step time / store-everything's")
    ax.set_title(f"time model, run {rows[0]['run']} ({rows[0]['device']})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(jsonl: Path) -> tuple[Path, list[Path]]:
    """Write the table and the pictures next to `jsonl`; return their paths."""
    jsonl = Path(jsonl)
    rows = read_jsonl(jsonl)
    md = jsonl.with_suffix(".md")
    md.write_text(table(rows) + "\n")
    pictures = []
    for model, model_rows in _by_model(rows).items():
        path = jsonl.with_name(f"{jsonl.stem}-{model}.png")
        picture(model_rows, path)
        pictures.append(path)
    path = jsonl.with_name(f"{jsonl.stem}-time-model.png")
    if time_model_picture(rows, path):
        pictures.append(path)
    return md, pictures


def update_readme(readme: Path, md: Path, pictures: list[Path]) -> None:
    """Replace what lies between README's benchmark markers with the table and pictures."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{readme}: the markers {README_BEGIN!r} and {README_END!r} are missing")
    root = readme.resolve().parent
    images = " ".join(f"![{p.stem}]({p.resolve().relative_to(root).as_posix()})" for p in pictures)
    body = (f"From `{md.resolve().relative_to(root).as_posix()}` (and its `.jsonl`):\n\n"
            f"{md.read_text().strip()}\n\n{images}")
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    readme.write_text(pattern.sub(lambda _: f"{README_BEGIN}\n{body}\n{README_END}", text))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a benchmarks/results/training_step/*.jsonl file")
    parser.add_argument("--readme", action="store_true", help="put the table and pictures into README.md")
    args = parser.parse_args(argv)
    md, pictures = write(Path(args.results))
    print(f"wrote {md} and {len(pictures)} pictures")
    if args.readme:
        update_readme(Path(__file__).resolve().parent.parent / "README.md", md, pictures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
