"""Peak memory, step time and planning time of a training step, method against method.

    python benchmarks/training_step.py [--mode quick|full] [--models gpt2,cnn]
                                       [--device cpu|cuda] [--rounds N] [--readme]

For each model (`bench_models.py`) this builds every method (`bench_methods.py`):
eager; `torch.utils.checkpoint` on every block; `torch.compile` with an activation
memory budget of 0.5 and 0.1 (the quick mode compiles GPT-2 only); remat-ir's
store-everything schedule, `hiremate` at 50%, 30% and its smallest feasible budget,
`rotor` at 50% and 30%, and `checkmate` at 50% on graphs small enough for its MILP. remat-ir's budgets are shares of the
store-everything peak its simulator predicts.

Then, for each method: two warm-up steps; the peak memory of one step (CPU: the
profiler's allocator events; CUDA: max_memory_allocated), above what was allocated
before it; and step times measured interleaved: every round runs every method for
one untimed step then `TIMED_PER_ROUND` timed ones, so that machine noise hits all
alike while each timed step starts from its own method's allocator state (after
another method's step, CPU steps paged memory in and out that a training loop,
which repeats one method, never does: up to 20 MB per step on GPT-2, and ratios
that moved by 10% between runs). Figures are ratios to eager's measured peak and
to eager's median step time, from the same run. A step is forward + backward of the
loss (the optimizer's update is the same for every method and left out).

On CPU, glibc's allocator thresholds are fixed first (`steady_allocator`): by default
glibc moves its mmap threshold as large blocks are freed, so whether a step's large
tensors are paged in afresh at every step depends on what the process did before, and
the same plan's step-time ratio moved by up to 15% between processes (GPT-2 quick,
hiremate at the smallest budget: 2.10x to 2.46x store-everything's step). Fixed
thresholds keep freed memory, as CUDA's caching allocator does; every method runs
under them. `--default-allocator` measures with glibc's defaults instead.

remat-ir rows also give their step time relative to remat-ir's own store-everything
schedule run with the same backend, measured and as the simulator predicts it (from op
times measured on the eager backend), which is what the time model
(`cost_model`) is judged by; hiremate at 50% and 30% is also planned on isolated op
times (`cost_model="isolated"`, the model before in-step timing), in the same run.

Writes `benchmarks/results/training_step/RUN.jsonl` (one line per model and method,
each with the machine, device, versions and commit), `RUN.md` (the table) and
`RUN-MODEL.png` (step-time ratio against peak memory, per model), `RUN-time-model.png`
(predicted against measured step time of every remat-ir plan); `--readme` puts
the table and pictures into README.md between its benchmark markers.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_methods as methods  # noqa: E402
import bench_report as report  # noqa: E402
import provenance  # noqa: E402
from bench_models import FACTORIES, BenchModel  # noqa: E402
from remat_ir.runtimes.memory import measure_peak  # noqa: E402
from remat_ir.runtimes.timing import ratio_interval  # noqa: E402

#: What each mode runs. quick: `make bench`, about 20 minutes on 2 CPU cores the first time (README).
MODES = {
    # Inductor compiles the CNN's many distinct kernels for minutes per variant on 2 cores
    # (the first run; its cache serves the next ones).
    "quick": dict(models=["gpt2", "cnn"], rounds=10, compile_budgets=[0.5, 0.1, 0.0], compile_models=["gpt2", "cnn"],
                  checkmate_max_nodes=300, time_limit_s=60, other_cost_models=["isolated"]),
    "full": dict(models=["gpt2", "bert", "unet", "cnn"], rounds=10, compile_budgets=[1.0, 0.5, 0.1, 0.0],
                 compile_models=["gpt2", "bert", "unet", "cnn"], checkmate_max_nodes=600, time_limit_s=120,
                 other_cost_models=["isolated"]),
}

#: Timed steps per method and round, each round after one untimed step (see above).
TIMED_PER_ROUND = 2

#: How far a prediction may be from the measured ratio's interval and still count as
#: right, and the interval's level (defined with the tables that say them).
PREDICTION_TOLERANCE, INTERVAL_LEVEL = report.PREDICTION_TOLERANCE, report.INTERVAL_LEVEL

#: Backends remat-ir runs its plans at the peers' peaks with.
BACKENDS = ("eager", "inductor")

#: The remat-ir plans also made on each of the mode's `other_cost_models`.
COMPARED_PLANS = [("hiremate", "50%"), ("hiremate", "30%")]


def say(message: str) -> None:
    print(message, flush=True)


#: glibc's mallopt parameters (malloc.h) and the values `steady_allocator` sets: large
#: blocks up to 32 MiB come from the heap, and up to 256 MiB of freed heap stays mapped.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_MMAP_THRESHOLD, STEADY_TRIM_THRESHOLD = 32 * 2**20, 256 * 2**20


def steady_allocator() -> str:
    """Fix glibc's allocator thresholds (see the module docstring); returns what was done,
    for the results' context."""
    import ctypes
    import ctypes.util

    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return "default (not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not (libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
            and libc.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD)):
        return "default (mallopt refused)"
    return f"glibc mmap threshold {STEADY_MMAP_THRESHOLD >> 20} MiB, trim threshold {STEADY_TRIM_THRESHOLD >> 20} MiB"


def checked_models(parser: argparse.ArgumentParser, names: list[str]) -> list[str]:
    """`names`, each a bench model, or one line through `parser` naming those that are not."""
    unknown = [m for m in names if m not in FACTORIES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose among {', '.join(FACTORIES)}")
    return names


def checked_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """`--device`, or one line through `parser` where it asks for CUDA torch does not see."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    return device


def run_context(device: torch.device, mode: str) -> dict:
    """What a result depends on besides the code: machine, device, versions, commit."""
    import diffusers
    import mip
    import transformers

    return {
        "mode": mode,
        **provenance.commit(ROOT),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "diffusers": diffusers.__version__,
                     "mip": mip.__version__},
    }


def build_methods(bm: BenchModel, settings: dict) -> tuple[list[methods.Method], list[methods.Method]]:
    """(methods to measure, remat-ir plans that were infeasible)."""
    built = [methods.eager(bm), methods.checkpoint_every_block(bm)]
    for budget in settings["compile_budgets"] if bm.name in settings["compile_models"] else []:
        say(f"  compiling with activation_memory_budget={budget:g}...")
        built.append(methods.compiled(bm, budget))
        say(f"  compiled in {built[-1].setup_s:.0f} s")
    planner = methods.RematPlanner(bm, say)
    plans = [("autograd", None), ("hiremate", "50%"), ("hiremate", "30%"), ("hiremate", "smallest"),
             ("rotor", "50%"), ("rotor", "30%")]
    if len(planner.graph.nodes) <= settings["checkmate_max_nodes"]:
        plans.append(("checkmate", "50%"))
    planner.prepare(plans, settings["time_limit_s"], settings["jobs"])
    remat = [planner.method(solver, budget, time_limit_s=settings["time_limit_s"]) for solver, budget in plans]
    # Plans run compiled are made on compiled costs (runtimes/compiled_costs.py).
    compiled = methods.RematPlanner(bm, say, backend="inductor")
    remat.append(compiled.method("autograd", None))
    remat += at_peer_peaks({"eager": planner, "inductor": compiled}, built[1:], settings)
    for cost_model in settings["other_cost_models"]:
        other = methods.RematPlanner(bm, say, cost_model)
        other.prepare(COMPARED_PLANS, settings["time_limit_s"], settings["jobs"])
        remat += [other.method(solver, budget, time_limit_s=settings["time_limit_s"])
                  for solver, budget in COMPARED_PLANS]
    return built + [m for m in remat if m.step], [m for m in remat if not m.step]


def at_peer_peaks(planners: dict[str, methods.RematPlanner], peers: list[methods.Method], settings: dict
                  ) -> list[methods.Method]:
    """remat-ir (the default planner) at each peer's measured peak, as a byte budget, with
    each backend's planner (`planners`, by backend: each plans on its own backend's
    costs): the points of remat-ir's front to set beside the peers' own."""
    for peer in peers:
        for _ in range(2):
            peer.step()
        peer.info["peer_peak_bytes"] = measure_peak(peer.step, planners["eager"].bm.inputs[0].device).peak_bytes
    for backend in BACKENDS:
        planners[backend].prepare([("hiremate", peer.info["peer_peak_bytes"]) for peer in peers],
                                  settings["time_limit_s"], settings["jobs"])
    return [planners[backend].method("hiremate", peer.info["peer_peak_bytes"], time_limit_s=settings["time_limit_s"],
                                     label=f"at {peer.name}'s peak", info={"peer": peer.name})
            for peer in peers for backend in BACKENDS]


def measure(built: list[methods.Method], device: torch.device, rounds: int) -> dict[str, dict]:
    """Peak bytes of one step per method, then `rounds` interleaved timed steps each."""
    # Lowering, planning and compiling leave millions of Python objects behind; a full
    # collection walking them would land in whichever step triggers it. Freeze them out of
    # the collector's reach (objects the steps create are still collected).
    gc.collect()
    gc.freeze()
    figures = {}
    for method in built:
        for _ in range(2):
            method.step()
        measured = measure_peak(method.step, device)
        figures[method.name] = {"peak_bytes": measured.peak_bytes, "loss": measured.result, "times": []}
    for r in range(rounds):
        order = built[r % len(built):] + built[:r % len(built)]  # rotate who runs first
        for method in order:
            method.step()  # untimed: the allocator settles into this method's state
            for _ in range(TIMED_PER_ROUND):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                method.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                figures[method.name]["times"].append(time.perf_counter() - started)
        say(f"  timing round {r + 1}/{rounds}")
    return figures


def judge_prediction(predicted: float, interval: tuple[float, float],
                     tolerance: float = PREDICTION_TOLERANCE) -> bool:
    """Whether `predicted` lies within `tolerance` of the measured ratio's interval."""
    low, high = interval
    return low * (1 - tolerance) <= predicted <= high * (1 + tolerance)


def records(bm: BenchModel, built, infeasible, figures, context: dict) -> list[dict]:
    eager = figures["eager"]
    eager_median = statistics.median(eager["times"])
    # remat-ir's store-everything step per backend: a plan run compiled is measured against
    # store-everything run compiled, as its prediction is made against the same schedule.
    store_times = {m.info["backend"]: figures[m.name]["times"] for m in built
                   if m.family == "remat-ir" and m.info.get("budget") == "store-everything"
                   and m.info.get("cost_model") == "profile"}
    rows = []
    for method in built:
        f = figures[method.name]
        median = statistics.median(f["times"])
        store = store_times.get(method.info.get("backend", "eager"), store_times.get("eager"))
        if method.family == "remat-ir" and store:
            # What the time model is judged by: measured against predicted, both relative to
            # remat-ir's own store-everything schedule run with the same backend, with the
            # interval the run's rounds give the measured ratio.
            measured = median / statistics.median(store)
            interval = ratio_interval(f["times"], store, per_round=TIMED_PER_ROUND, level=INTERVAL_LEVEL)
            predicted = method.info["predicted_time_ratio"]
            method.info.update(measured_time_ratio=round(measured, 4),
                               measured_time_interval=[round(x, 4) for x in interval],
                               prediction_error=round(predicted / measured - 1, 4),
                               prediction_within_tolerance=judge_prediction(predicted, interval))
            if "predicted_time_ratio_without_call" in method.info:
                method.info["prediction_without_call_within_tolerance"] = judge_prediction(
                    method.info["predicted_time_ratio_without_call"], interval)
        rows.append({**context, "model": bm.name, "model_description": bm.description,
                     "method": method.name, "family": method.family, "status": "ok",
                     "peak_bytes": f["peak_bytes"], "peak_ratio": round(f["peak_bytes"] / eager["peak_bytes"], 4),
                     "median_step_s": round(median, 5), "step_time_ratio": round(median / eager_median, 4),
                     "rounds": len(f["times"]), "setup_s": round(method.setup_s, 2), "loss": f["loss"],
                     # every timed step, in round order: intervals of any two methods' ratio
                     "step_times_s": [round(t, 6) for t in f["times"]], "timed_per_round": TIMED_PER_ROUND,
                     **method.info})
    for method in infeasible:
        rows.append({**context, "model": bm.name, "model_description": bm.description,
                     "method": method.name, "family": method.family, **method.info})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--models", help=f"comma-separated subset of {','.join(FACTORIES)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, help="timed steps per method (default: by mode)")
    parser.add_argument("--compile-budgets", help="torch.compile activation budgets, comma-separated, "
                        "for every model (default: by mode; '' for none)")
    parser.add_argument("--output-dir", default=str(HERE / "results" / "training_step"))
    parser.add_argument("--readme", action="store_true", help="put the table and pictures into README.md")
    parser.add_argument("--jobs", type=int, default=1,
                        help="plans made at once, in processes of their own (default 1: each solver has the "
                        "machine for its time limit; a machine with many cores plans in a fraction of the time)")
    parser.add_argument("--default-allocator", action="store_true",
                        help="CPU: keep glibc's dynamic allocator thresholds (see the module docstring)")
    args = parser.parse_args(argv)
    settings = dict(MODES[args.mode], jobs=args.jobs)
    models = checked_models(parser, args.models.split(",") if args.models else settings["models"])
    device = checked_device(parser, args.device)
    rounds = args.rounds or settings["rounds"]
    if args.compile_budgets is not None:
        settings["compile_budgets"] = [float(b) for b in args.compile_budgets.split(",") if b.strip()]
        settings["compile_models"] = models
    context = run_context(device, args.mode)
    context["allocator"] = ("default" if args.default_allocator or device.type != "cpu"
                            else steady_allocator())
    say(f"allocator: {context['allocator']}")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run = f"{stamp}-{args.mode}-{'cpu' if device.type == 'cpu' else 'cuda'}"
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{run}.jsonl"
    context["run"] = run
    started = time.perf_counter()
    for index, name in enumerate(models, 1):
        say(f"[{index}/{len(models)}] {name} ({args.mode}) on {context['device']}")
        bm = FACTORIES[name](args.mode)
        bm.module.to(device)
        bm.inputs = tuple(x.to(device) for x in bm.inputs)
        say(f"  {bm.description}")
        built, infeasible = build_methods(bm, settings)
        figures = measure(built, device, rounds)
        rows = records(bm, built, infeasible, figures, context)
        report.append_jsonl(jsonl, rows)
        for row in rows:
            if row["status"] == "ok":
                model_figures = (f"  vs store-everything: predicted x{row['predicted_time_ratio']:.3f}, "
                                 f"measured x{row['measured_time_ratio']:.3f} "
                                 f"({row['measured_time_interval'][0]:.3f}-{row['measured_time_interval'][1]:.3f})"
                                 if "measured_time_ratio" in row else "")
                say(f"  {row['method']:<40} peak {row['peak_ratio']:7.1%}  time x{row['step_time_ratio']:.3f}"
                    + model_figures)
        del built, figures
        gc.unfreeze()
    say(f"all models in {time.perf_counter() - started:.0f} s; results in {jsonl}")
    table, pictures = report.write(jsonl)
    say(f"table {table}; pictures {', '.join(str(p) for p in pictures)}")
    if args.readme:
        report.update_readme(ROOT / "README.md", table, pictures)
        say("README.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
