"""Rematerialization alone against rematerialization with offloading: predicted overhead.

    python benchmarks/offload.py            # GPT-2 12 layers and the U-Net (tens of minutes)
    python benchmarks/offload.py --quick    # GPT-2 4 layers, a few minutes
    python benchmarks/offload.py --table    # only redraw offload.md from offload.json
    python benchmarks/offload.py --graphs unet   # plan these again, keep the others' rows

Graphs: benchmarks/solvers.py's (`gpt2`: GPT-2 12 layers, d=768, seq 512, batch 8;
`unet`: the diffusers U-Net; `gpt2-4` for --quick), lowered with FLOP costs and cached
there, each dropout kept one op as a CUDA lowering keeps it (the CPU lowering's split
into mask and product, `frontends/dropout_masks.py`, is not what a GPU runs). Their op
times are then re-priced for a GPU from the FLOPs and bytes each node records
(`runtimes.profiling.analytic_seconds` at the CUDA rates: 50 TFLOP/s, 1.5 TB/s, 5 us per
op): transfers are only worth comparing with a GPU's compute, and nothing of
it runs here. Links:

- `pcie4`: PCIe 4.0 x16, 25 GB/s, 10 us per copy (an A100's host link);
- `h100`: PCIe 5.0 x16 as an H100 SXM/PCIe host sees it, 50 GB/s, 10 us.

Per (graph, link, budget in 50%, 30%, 25%, 15% of the store-everything peak): the
default planner alone (`solve(graph, budget)`) and with offloading
(`offload.plan_with_offload` on the same planner, its plans at each ladder budget
computed once per graph and shared by the links; the rungs of the refinement differ
per link, so a link's planning seconds count the plans it asked for first): predicted overhead (time /
store-everything's - 1), where compute waits for transfers, host memory, planning
seconds; or the smallest budget each reaches. "ratio" is offloading's overhead over
rematerialization's: the paper (POFO, 003) reports about 2/3. The `pofo` solver (rotor's
chain DP with an offload move) is planned beside it on the same graph and link.

Nothing here is measured on a device: on a GPU, `make gpu-check` runs the offloading
tests (measured peak against simulated). Writes benchmarks/results/offload.json (rows,
run record) and offload.md (table), and offload.png (overhead against budget).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from remat_ir import ir, solvers  # noqa: E402
from remat_ir.ir import pb  # noqa: E402
from remat_ir.solvers.offload import plan_with_offload  # noqa: E402

ROOT = HERE.parent
OUT = HERE / "results" / "offload.json"
QUICK_OUT = ROOT / "build" / "offload-quick.json"
SHARES = (0.5, 0.3, 0.25, 0.15)
LINKS = {"pcie4": ("PCIe 4.0 x16", 25e9, 1e-5), "h100": ("H100 host link, PCIe 5.0 x16", 50e9, 1e-5)}
GRAPHS, QUICK_GRAPHS = ("gpt2", "unet"), ("gpt2-4",)
TIME_LIMIT_S = 30.0


def say(message: str) -> None:
    print(message, flush=True)


def gpu_costed(name: str, cache: Path) -> ir.Graph:
    """The benchmark graph with op times re-estimated for a GPU (module docstring), each
    dropout one op as on a GPU (CUDA's fused dropout is not split into mask and product)."""
    import solvers as bench_solvers  # benchmarks/solvers.py

    from remat_ir.runtimes.profiling import priced_for

    graph, _ = bench_solvers.lowered(bench_solvers.GRAPHS[name], cache, split_dropouts=False)
    return priced_for(graph, "cuda")


def _plan(function, *args):
    """(schedule, seconds) or (InfeasibleBudget, seconds)."""
    started = time.monotonic()
    try:
        result = function(*args)
    except solvers.InfeasibleBudget as refused:
        result = refused
    return result, time.monotonic() - started


def rows_for(name: str, cache: Path) -> list[dict]:
    graph = gpu_costed(name, cache)
    reference = ir.store_all(graph)
    full, base_time = reference.predicted_peak_bytes, reference.predicted_time_s
    say(f"{name}: {len(graph.nodes):,} nodes, store-everything peak {full / 2**20:.0f} MiB, "
        f"{base_time * 1e3:.1f} ms predicted on the GPU rates")
    remat_plans: dict[int, tuple[object, float]] = {}

    def remat(budget: int):
        if budget not in remat_plans:
            remat_plans[budget] = _plan(lambda: solvers.solve(graph, budget, time_limit_s=TIME_LIMIT_S))
        plan, _ = remat_plans[budget]
        if isinstance(plan, solvers.InfeasibleBudget):
            raise plan
        return plan

    def describe(plan, seconds: float) -> dict:
        if isinstance(plan, solvers.InfeasibleBudget):
            return {"reached": False, "least_share": (plan.smallest_feasible or 0) / full,
                    "planning_s": round(seconds, 1)}
        result = ir.simulate(graph, plan)
        return {"reached": True, "peak_share": result.peak_bytes / full,
                "overhead": result.total_time_s / base_time - 1, "stall_share": result.stall_s / base_time,
                "transferred_mib": result.transferred_bytes / 2**20,
                "host_peak_mib": result.host_peak_bytes / 2**20,
                "recomputations": result.recomputations, "planning_s": round(seconds, 1)}

    rows = []
    for share in SHARES:
        budget = int(share * full)
        started = time.monotonic()
        try:
            alone = remat(budget)
        except solvers.InfeasibleBudget as refused:
            alone = refused
        alone_row = describe(alone, time.monotonic() - started)
        for link_name, (_, bandwidth, latency) in LINKS.items():
            link = graph.proto.provenance.host_link
            link.bandwidth_bytes_per_s, link.latency_s, link.overlapped = bandwidth, latency, True
            link.source = "given"
            moved, seconds = _plan(plan_with_offload, graph, budget, remat)
            pofo, pofo_seconds = _plan(lambda: solvers.solve(graph, budget, "pofo"))
            row = {"graph": name, "link": link_name, "share": share, "remat": alone_row,
                   "offload": describe(moved, seconds), "pofo": describe(pofo, pofo_seconds)}
            if row["remat"]["reached"] and row["offload"]["reached"] and row["remat"]["overhead"] > 0:
                row["ratio"] = row["offload"]["overhead"] / row["remat"]["overhead"]
            say(f"  {share:.0%} {link_name}: remat {_cell(row['remat'])}; with offloading "
                f"{_cell(row['offload'])}; pofo {_cell(row['pofo'])}")
            rows.append(row)
    return rows


def _cell(d: dict) -> str:
    if not d["reached"]:
        return f"not reached (least {d['least_share']:.1%})"
    return f"{d['overhead']:+.1%} at {d['peak_share']:.1%}"


def table(rows: list[dict]) -> str:
    lines = ["| graph | link | budget | remat alone: overhead (peak) | with offloading: overhead (peak) "
             "| ratio | compute waits | moved | host memory | pofo: overhead (peak) "
             "| planning s (alone / offload / pofo) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, o = r["remat"], r["offload"]
        p = r.get("pofo")
        extra = (f"{o['stall_share']:.1%} | {o['transferred_mib']:.0f} MiB | {o['host_peak_mib']:.0f} MiB"
                 if o["reached"] else "| |")
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
        lines.append(f"| {r['graph']} | {r['link']} | {r['share']:.0%} | {_cell(a)} | {_cell(o)} | {ratio} "
                     f"| {extra} | {_cell(p) if p else ''} | {a['planning_s']} / {o['planning_s']}"
                     f"{' / ' + str(p['planning_s']) if p else ''} |")
    runs = {r["graph"]: (r["run"], r["commit"]) for r in rows if "run" in r}
    lines += [""] + [f"{graph}: run {run}, commit `{commit}`" for graph, (run, commit) in runs.items()]
    return "\n".join(lines) + "\n"


def picture(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    graphs = sorted({r["graph"] for r in rows})
    fig, axes = plt.subplots(1, len(graphs), figsize=(5.5 * len(graphs), 4), squeeze=False)
    for ax, name in zip(axes[0], graphs):
        mine = [r for r in rows if r["graph"] == name]
        first_link = mine[0]["link"]
        alone = [(r["share"], r["remat"]["overhead"]) for r in mine
                 if r["link"] == first_link and r["remat"]["reached"]]
        ax.plot([s * 100 for s, _ in alone], [o * 100 for _, o in alone], "o-", label="rematerialization alone")
        for link in LINKS:
            moved = [(r["share"], r["offload"]["overhead"]) for r in mine
                     if r["link"] == link and r["offload"]["reached"]]
            line, = ax.plot([s * 100 for s, _ in moved], [o * 100 for _, o in moved], "s--",
                            label=f"with offloading, {LINKS[link][0]}")
            dp = [(r["share"], r["pofo"]["overhead"]) for r in mine
                  if r["link"] == link and r.get("pofo", {}).get("reached")]
            ax.plot([s * 100 for s, _ in dp], [o * 100 for _, o in dp], "^:", color=line.get_color(),
                    label=f"pofo, {LINKS[link][0]}")
        least = {key: min((r[key]["least_share"] for r in mine if not r[key]["reached"]), default=None)
                 for key in ("remat", "offload")}
        ax.set_title(name + "".join(f"\nleast peak {label}: {least[key]:.1%}"
                                    for key, label in (("remat", "remat alone"),
                                                       ("offload", "with offloading"))
                                    if least[key] is not None), fontsize=9)
        ax.set_xlabel("budget, % of the store-everything peak")
        ax.set_ylabel("predicted overhead, %")
        ax.invert_xaxis()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="GPT-2 4 layers only")
    parser.add_argument("--table", action="store_true", help="only redraw the table and picture")
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "bench-graphs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--graphs", help=f"comma-separated, of {', '.join(GRAPHS)}: plan only these "
                        "again and keep the other graphs' rows of the results file (each row "
                        "records the run and commit that made it)")
    args = parser.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else OUT)
    names = args.graphs.split(",") if args.graphs else QUICK_GRAPHS if args.quick else GRAPHS
    if unknown := [n for n in names if n not in GRAPHS + QUICK_GRAPHS]:
        parser.error(f"unknown graphs {unknown}; known: {', '.join(GRAPHS + QUICK_GRAPHS)}")
    if args.table:
        record = json.loads(out.read_text())
    else:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip()
        run = datetime.datetime.now().isoformat(timespec="seconds")
        kept = []
        if args.graphs and out.exists():
            earlier = json.loads(out.read_text())
            kept = [{"run": earlier["run"], "commit": earlier["commit"], **r}
                    for r in earlier["rows"] if r["graph"] not in names]
        record = {"run": run, "commit": commit, "machine": platform.platform(), "links": LINKS,
                  "rows": kept}
        out.parent.mkdir(parents=True, exist_ok=True)
        for name in names:
            record["rows"] += [{"run": run, "commit": commit, **r} for r in rows_for(name, args.cache)]
            out.write_text(json.dumps(record, indent=1) + "\n")  # each graph as it is done
    out.with_suffix(".md").write_text(table(record["rows"]))
    drawn = picture(record["rows"], out.with_suffix(".png"))
    say(f"wrote {out}, {out.with_suffix('.md')}" + (f", {drawn}" if drawn else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
