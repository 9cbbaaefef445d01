"""The time model judged with enough rounds to tell 3%: predicted against measured step time.

    python benchmarks/time_model.py [--models gpt2,cnn] [--rounds 100] [--device cpu|cuda]
                                    [--size quick|full] [--backend eager|inductor] [--offload]
                                    [--plans hiremate@50%,hiremate@30%+offload]

Why a benchmark of its own: `training_step.py` times every method (torch.compile
variants, checkpointing, remat-ir at the peers' peaks) for 10 rounds, and on a
shared 2-core CPU the 95% interval of a plan's step-time ratio to store-everything
is then 13-32% wide (one step moves by 10-20% from the next; quick run
20261126-070303, commit fa26776), so a prediction within 3% cannot be told from one
that is not. Here only remat-ir runs: each model is lowered once (profiled costs,
as `remat` does) and planned at a sweep of budgets, and every plan steps beside
store-everything and eager for `--rounds` interleaved rounds (one untimed step, then
two timed ones each, as `training_step.measure` does), so that the interval shrinks
with the square root of the rounds.

Each plan's row gives its predicted ratio to store-everything (the simulator on the
graph's costs), the measured one (ratio of median steps) and its 95% interval from
resampled rounds (`remat_ir.runtimes.timing.ratio_interval`), and whether the
prediction lies within 3% of that interval. Writes
`benchmarks/results/time_model/RUN.jsonl`, `RUN.md` and `RUN.png` (predicted against
measured, with the intervals).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_methods as methods  # noqa: E402
import bench_report as report  # noqa: E402
import training_step  # noqa: E402
from bench_models import FACTORIES  # noqa: E402
from remat_ir.solvers import BadRequest, UnknownSolver, parse_budget  # noqa: E402
from remat_ir.solvers import find as find_solver  # noqa: E402

#: Budgets each model's plans are made at (shares of the simulated store-everything peak;
#: "smallest" is the least hiremate reaches), per solver. Budgets below a model's floor
#: are reported as infeasible.
PLANS = [("hiremate", share) for share in ("95%", "85%", "70%", "60%", "50%", "30%", "smallest")] + \
        [("rotor", "50%"), ("rotor", "30%")]
#: With --offload (issue 22's budgets): hiremate with offloading over the measured host
#: link at each, and hiremate alone where `PLANS` has no plan.
OFFLOAD_SHARES = ("50%", "30%", "25%", "15%")


def models_and_plans(parser: argparse.ArgumentParser, models: str, plans: str,
                     offloading: str | None = None) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """`--models` and `--plans` of a benchmark that plans the bench models, each refused in
    one line through `parser`; `offloading`: why plans with offloading are refused here
    (None: they are allowed)."""
    names = training_step.checked_models(parser, models.split(","))
    try:
        parsed = parse_plans(plans)
    except ValueError as exc:
        parser.error(str(exc))
    if offloading and any(offload for *_, offload in parsed):
        parser.error(f"--plans: offloading plans are not {offloading}")
    return names, parsed


def parse_plans(text: str) -> list[tuple[str, str, bool]]:
    """'hiremate@50%,hiremate@30%+offload' -> [(solver, budget, offload), ...]."""
    plans = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        solver, at, budget = item.partition("@")
        if not at or not solver or not budget:
            raise ValueError(f"plan {item!r}: write SOLVER@BUDGET or SOLVER@BUDGET+offload, "
                             "e.g. hiremate@50% or hiremate@30%+offload")
        budget, plus, extra = budget.partition("+")
        if plus and extra != "offload":
            raise ValueError(f"plan {item!r}: only '+offload' may follow the budget")
        plans.append((solver, budget, bool(plus)))
    return plans


def default_plans(offload: bool) -> list[tuple[str, str, bool]]:
    """`PLANS`, and with `offload` the plans of `OFFLOAD_SHARES` alone and offloaded."""
    plans = [(solver, budget, False) for solver, budget in PLANS]
    if offload:
        plans += [("hiremate", share, False) for share in OFFLOAD_SHARES if ("hiremate", share) not in PLANS]
        plans += [("hiremate", share, True) for share in OFFLOAD_SHARES]
    return plans


def plan_methods(bm, time_limit_s: float, backend: str = "eager",
                 plans: list[tuple[str, str, bool]] | None = None, jobs: int = 1
                 ) -> tuple[list[methods.Method], list[methods.Method]]:
    """(eager, store-everything and every feasible plan of `plans` (solver, budget,
    offload; default `default_plans(False)`), planned on `backend`'s costs, `jobs` at a
    time (`RematPlanner.prepare`), and run with it; the infeasible ones)."""
    planner = methods.RematPlanner(bm, training_step.say, backend=backend)
    built = [methods.eager(bm), planner.method("autograd", None)]
    plans = default_plans(False) if plans is None else plans
    planner.prepare(plans, time_limit_s, jobs)
    for solver, budget, offloaded in plans:
        built.append(planner.method(solver, budget, time_limit_s=time_limit_s, offload=offloaded))
    return [m for m in built if m.step], [m for m in built if not m.step]


def _plan_name(row: dict) -> str:
    return f"{row['solver']} {row['budget']}" + (" + offload" if row.get("offload") else "")


def table(rows: list[dict]) -> str:
    """The markdown table of a run: one line per plan, and per model how many predictions
    lie within 3% of their measured interval."""
    first = rows[0]
    lines = [f"Run `{first['run']}` on {first['device']} ({first['machine']['cpus']} CPUs), commit "
             f"`{first['commit']}`, {first['timing_rounds']} rounds of {training_step.TIMED_PER_ROUND} timed steps per "
             "method. Step time relative to remat-ir's store-everything schedule: predicted by the simulator "
             f"on the graph's profiled costs, measured (ratio of median steps) with its {report.LEVEL_TEXT} "
             f"interval from resampled rounds; a prediction counts as right within {report.TOLERANCE_TEXT} of "
             "that interval.", ""]
    for model, model_rows in report._by_model(rows).items():
        price = next(r["peak_byte_s"] for r in model_rows if "peak_byte_s" in r)
        backend = next(r["backend"] for r in model_rows if "backend" in r)
        two = any(r.get("two_timelines") for r in model_rows)
        lines += [f"**{model}**: {model_rows[0]['model_description']}; backend {backend}; footprint price "
                  f"{price * 2**20 * 1e3:.3f} ms per MiB of peak"
                  + (_two_timelines_text(model_rows) if two else "."), "",
                  "| plan | peak vs store-everything (predicted) | measured / predicted peak | predicted | "
                  + ("one timeline | " if two else "")
                  + f"measured | {report.LEVEL_TEXT} interval | prediction / measured | within {report.TOLERANCE_TEXT} |",
                  "|---|---:|---:|---:|" + ("---:|" if two else "") + "---:|---|---:|---|"]
        judged = [r for r in model_rows if "measured_time_interval" in r and r["budget"] != "store-everything"]
        for r in judged:
            low, high = r["measured_time_interval"]
            one = f"x{r['predicted_time_ratio_one_timeline']:.3f} | " if two else ""
            lines.append(f"| {_plan_name(r)} | {r['predicted_peak_share']:.1%} | "
                         f"{r['peak_bytes'] / r['predicted_peak_bytes']:.3f} | "
                         f"x{r['predicted_time_ratio']:.3f} | {one}x{r['measured_time_ratio']:.3f} | "
                         f"{low:.3f}-{high:.3f} | {1 + r['prediction_error']:.3f} | "
                         f"{'yes' if r['prediction_within_tolerance'] else 'no'} |")
        for r in model_rows:
            if r.get("status") == "infeasible":
                lines.append(f"| {_plan_name(r)} | infeasible |" + " |" * (7 if two else 6))
        lines.append("")
        lines += report.time_model_summary(judged)
    return "\n".join(lines)


def _two_timelines_text(rows: list[dict]) -> str:
    """What the header says of a model whose costs have two timelines (CUDA)."""
    row = next(r for r in rows if r.get("two_timelines"))
    return ("; predicted on two timelines (host and device; store-everything's host busy "
            f"{row['store_all_host_busy_s'] * 1e3:.2f} ms and device busy {row['store_all_device_busy_s'] * 1e3:.2f} ms "
            "per step, simulated), with one timeline's prediction beside it (before IR 1.9).")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,cnn", help=f"comma-separated subset of {','.join(FACTORIES)}")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per plan")
    parser.add_argument("--backend", choices=("eager", "inductor"), default="eager",
                        help="how remat-ir runs the plans; plans are made and predicted on that backend's costs "
                        "(compiled regions' times for inductor)")
    parser.add_argument("--offload", action="store_true",
                        help=f"also hiremate with offloading at {', '.join(OFFLOAD_SHARES)} (and alone there)".replace("%", "%%"))
    parser.add_argument("--plans", help="comma-separated SOLVER@BUDGET[+offload] instead of the default sweep, "
                        "e.g. hiremate@50%%,hiremate@30%%+offload")
    parser.add_argument("--jobs", type=int, default=1,
                        help="plans made at once, in processes of their own (default 1: each solver has the "
                        "machine for its time limit)")
    parser.add_argument("--size", choices=("quick", "full"), default="quick",
                        help="the models' configurations (bench_models): quick ones leave an H200 idle "
                        "most of a step (the host issues ops slower than the GPU runs them); full ones "
                        "(GPT-2 12 layers d=768, ResNet-50) keep it busy, where offloading pays")
    parser.add_argument("--output-dir", default=str(HERE / "results" / "time_model"))
    args = parser.parse_args(argv)
    models = training_step.checked_models(parser, args.models.split(","))
    try:
        plans = parse_plans(args.plans) if args.plans else default_plans(args.offload)
        for solver, budget, _ in plans:   # refused before minutes of lowering
            find_solver(solver)
            if budget != "smallest":
                parse_budget(budget, 1)
    except (ValueError, UnknownSolver, BadRequest) as exc:
        parser.error(str(exc))
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (an interval needs rounds to resample)")
    device = training_step.checked_device(parser, args.device)
    context = training_step.run_context(device, "time-model")
    context["allocator"] = training_step.steady_allocator() if device.type == "cpu" else "default"
    run = (f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{'cpu' if device.type == 'cpu' else 'cuda'}"
           + ("" if args.backend == "eager" else f"-{args.backend}"))
    context.update(run=run, timing_rounds=args.rounds)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{run}.jsonl"
    started = time.perf_counter()
    for index, name in enumerate(models, 1):
        training_step.say(f"[{index}/{len(models)}] {name} on {context['device']}")
        bm = FACTORIES[name](args.size)
        bm.module.to(device)
        bm.inputs = tuple(x.to(device) for x in bm.inputs)
        built, infeasible = plan_methods(bm, args.time_limit, args.backend, plans, args.jobs)
        figures = training_step.measure(built, device, args.rounds)
        rows = training_step.records(bm, built, infeasible, figures, context)
        report.append_jsonl(jsonl, rows)
        for r in rows:
            if "measured_time_interval" in r:
                training_step.say(f"  {r['method']:<40} predicted x{r['predicted_time_ratio']:.3f}  measured "
                                  f"x{r['measured_time_ratio']:.3f} ({r['measured_time_interval'][0]:.3f}-"
                                  f"{r['measured_time_interval'][1]:.3f}); peak measured/predicted "
                                  f"{r['peak_bytes'] / r['predicted_peak_bytes']:.3f}")
    rows = report.read_jsonl(jsonl)
    md = jsonl.with_suffix(".md")
    md.write_text(table(rows) + "\n")
    picture = jsonl.with_suffix(".png")
    drawn = report.time_model_picture(rows, picture)
    training_step.say(f"all models in {time.perf_counter() - started:.0f} s; {md}"
                      + (f", {picture}" if drawn else " (no plan ran beside store-everything: no picture)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
