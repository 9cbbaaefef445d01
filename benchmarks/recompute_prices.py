"""Where a plan's predicted time goes wrong: each recomputation's price against what it took.

    python benchmarks/recompute_prices.py [--models gpt2,cnn] [--size quick|full]
                                          [--plans hiremate@30%,hiremate@smallest]
                                          [--rounds 10] [--device cpu|cuda]

Why: on CUDA every GPU session measured deep plans faster than predicted (the quick
GPT-2's smallest plan on an H200: x1.733 predicted, x1.418 measured, run
20261130-174540-quick-cuda), while store-everything's simulated step matches its
measured one to 2% and the same plans on a CPU are predicted within 3%. Two
timelines (host and device) changed nothing there: the host bounds those steps, the
GPU idle 94-98% of them. So what is wrong is the price of what a plan adds, and the
time model benchmark, which sees whole steps, cannot say which part.

Here each model is lowered once ("profile" costs, as `remat` does) and planned; then
store-everything and the plans are timed op by op in interleaved rounds with the same
measurement the profile takes (`runtimes.timing.time_schedules`: a tick after every
op, on CUDA the host's clock beside the GPU's events). Every recomputed occurrence
(a node's second or later run in a step) is set against its price (the cost model's
`time_s`, and `host_s`/`device_s` on two timelines) and against the same node's first
run in that step, summed per op. Also per plan: the step predicted, timed with ticks
and its wall time, each against store-everything's. Writes
`benchmarks/results/recompute_prices/RUN.jsonl` and `RUN.md`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_methods as methods  # noqa: E402
import bench_report as report  # noqa: E402
import time_model  # noqa: E402
import training_step  # noqa: E402
from bench_models import FACTORIES  # noqa: E402
from remat_ir import ir  # noqa: E402
from remat_ir.runtimes.timing import time_schedules  # noqa: E402
from remat_ir.runtimes.torch import resident_values  # noqa: E402


def occurrences(timing) -> list[tuple[int, float, float, float]]:
    """(node, seconds, host seconds, device seconds) of each compute step in run order;
    host and device are 0 where the step was timed on one timeline (a CPU)."""
    split = timing.host_device or [(node, 0.0, 0.0) for node, _ in timing.occurrences]
    return [(node, seconds, host, device)
            for (node, seconds), (_, host, device) in zip(timing.occurrences, split)]


def recomputations(graph: ir.Graph, timing) -> dict[str, dict[str, float]]:
    """Per op: the recomputed occurrences' count, price and measured seconds, and the
    same nodes' first runs in the step (measured), all summed."""
    seen: set[int] = set()
    first: dict[int, tuple[float, float, float]] = {}
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for node_id, seconds, host, device in occurrences(timing):
        if node_id < 0:   # a compiled region's mark (the inductor backend): not a node
            continue
        if node_id not in seen:
            seen.add(node_id)
            first[node_id] = (seconds, host, device)
            continue
        node = graph.node(node_id)
        row = per_op[node.op]
        row["count"] += 1
        row["priced_s"] += node.cost.time_s
        row["priced_host_s"] += node.cost.host_s
        row["priced_device_s"] += node.cost.device_s
        row["measured_s"] += seconds
        row["measured_host_s"] += host
        row["measured_device_s"] += device
        row["first_run_s"] += first[node_id][0]
        row["first_run_host_s"] += first[node_id][1]
    return {op: dict(row) for op, row in per_op.items()}


def table(rows: list[dict], top: int) -> str:
    context = rows[0]
    two = any(r["two_timelines"] for r in rows)
    lines = [f"Run `{context['run']}` on {context['device']}, commit `{context['commit']}`: each plan timed op "
             f"by op beside store-everything ({context['rounds']} interleaved rounds, the profile's own "
             "measurement); a recomputation is a node's second or later run in a step. Seconds per step, "
             "summed over the plan's recomputations.", ""]
    for r in rows:
        lines += [f"**{r['model']}**, {r['plan']} ({r['recomputations']} recomputations): step time vs "
                  f"store-everything predicted x{r['predicted_ratio']:.3f}, timed with ticks "
                  f"x{r['ticked_ratio']:.3f}, wall x{r['wall_ratio']:.3f}. Recomputations priced "
                  f"{r['priced_s'] * 1e3:.3f} ms, measured {r['measured_s'] * 1e3:.3f} ms"
                  + (f" (host {r['measured_host_s'] * 1e3:.3f} ms priced {r['priced_host_s'] * 1e3:.3f}; "
                     f"device {r['measured_device_s'] * 1e3:.3f} ms priced {r['priced_device_s'] * 1e3:.3f})"
                     if two else "")
                  + f"; the same nodes' first runs {r['first_run_s'] * 1e3:.3f} ms. The step's ops outside "
                  f"recomputation: measured {r['others_s'] * 1e3:.3f} ms against store-everything's "
                  f"{r['store_all_ops_s'] * 1e3:.3f} ms.", "",
                  "| op | recomputed | priced ms | measured ms | first runs ms | priced / measured |"
                  + (" host priced / measured | device priced / measured |" if two else ""),
                  "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if two else "")]
        ops = sorted(r["per_op"].items(), key=lambda kv: -abs(kv[1]["priced_s"] - kv[1]["measured_s"]))
        for op, o in ops[:top]:
            ratio = o["priced_s"] / o["measured_s"] if o["measured_s"] else float("nan")
            line = (f"| {op} | {int(o['count'])} | {o['priced_s'] * 1e3:.3f} | {o['measured_s'] * 1e3:.3f} | "
                    f"{o['first_run_s'] * 1e3:.3f} | {ratio:.2f} |")
            if two:
                host = o["priced_host_s"] / o["measured_host_s"] if o["measured_host_s"] else float("nan")
                device = o["priced_device_s"] / o["measured_device_s"] if o["measured_device_s"] else float("nan")
                line += f" {host:.2f} | {device:.2f} |"
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,cnn", help=f"comma-separated subset of {','.join(FACTORIES)}")
    parser.add_argument("--size", choices=("quick", "full"), default="quick")
    parser.add_argument("--plans", default="hiremate@30%,hiremate@smallest",
                        help="comma-separated SOLVER@BUDGET (no offloading)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of op-by-op timing")
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per plan")
    parser.add_argument("--top", type=int, default=12, help="ops per plan in the table, most mispriced first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output-dir", default=str(HERE / "results" / "recompute_prices"))
    args = parser.parse_args(argv)
    models, plans = time_model.models_and_plans(parser, args.models, args.plans, "timed op by op here")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    device = training_step.checked_device(parser, args.device)
    context = training_step.run_context(device, "recompute-prices")
    context.update(run=f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{device.type}", rounds=args.rounds)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{context['run']}.jsonl"
    started = time.perf_counter()
    rows = []
    for name in models:
        bm = FACTORIES[name](args.size)
        bm.module.to(device)
        bm.inputs = tuple(x.to(device) for x in bm.inputs)
        training_step.say(f"{name}: lowering and planning")
        planner = methods.RematPlanner(bm, training_step.say)
        graph = planner.graph
        labels, schedules = [], []
        for solver, budget, _ in plans:
            if planner.method(solver, budget, time_limit_s=args.time_limit).step is not None:  # says if infeasible
                labels.append(f"{solver} {budget}")
                schedules.append(planner.plans[(solver, budget, False)][0])
        store = ir.store_all(graph)
        training_step.say(f"{name}: timing store-everything and {len(schedules)} plans op by op")
        timings = time_schedules(graph, [store, *schedules], resident_values(planner.model, graph, bm.inputs),
                                 device, steps=args.rounds, max_seconds=float("inf"))
        store_timing = timings[0]
        store_ops = sum(s for _, s in store_timing.occurrences)
        for label, schedule, timing in zip(labels, schedules, timings[1:]):
            per_op = recomputations(graph, timing)
            totals = {key: sum(o[key] for o in per_op.values())
                      for key in ("priced_s", "priced_host_s", "priced_device_s", "measured_s",
                                  "measured_host_s", "measured_device_s", "first_run_s")}
            row = dict(context, model=name, model_description=bm.description, plan=label,
                       recomputations=int(sum(o["count"] for o in per_op.values())),
                       two_timelines=bool(timing.host_device),
                       predicted_ratio=ir.simulate(graph, schedule).total_time_s / planner.store_all_time,
                       ticked_ratio=sum(s for _, s in timing.occurrences) / store_ops,
                       wall_ratio=timing.step_s / store_timing.step_s,
                       others_s=sum(s for _, s in timing.occurrences) - totals["measured_s"],
                       store_all_ops_s=store_ops, per_op=per_op, **totals)
            rows.append(row)
            report.append_jsonl(jsonl, [row])
            training_step.say(f"  {label}: predicted x{row['predicted_ratio']:.3f}, wall x{row['wall_ratio']:.3f}; "
                              f"recomputations priced {row['priced_s'] * 1e3:.2f} ms, "
                              f"measured {row['measured_s'] * 1e3:.2f} ms")
    if not rows:
        training_step.say("no plan was made")
        return 1
    md = jsonl.with_suffix(".md")
    md.write_text(table(rows, args.top) + "\n")
    training_step.say(f"all models in {time.perf_counter() - started:.0f} s; {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
