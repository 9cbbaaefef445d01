"""Step time of training through remat-ir's store-everything schedule, relative to eager.

    python benchmarks/torch_overhead.py [--rounds N] [--device cpu|cuda]

Eager and scheduled steps (forward + backward + zero_grad) alternate in one
run, so that machine noise hits both alike; the figure is the ratio of their
medians. Target: <= 1.05 for GPT-2. Results go to
benchmarks/results/torch_overhead.json.

A third row runs the plan's generated segments alone (`runtimes.timing.segments_step`:
no autograd, no per-call checks, gradients dropped). The scheduled step's time beyond
it is the runtime's per-call overhead (handing the gradients to `.grad` included), the
same for every plan of the model (issue 25: a constant left out makes every
recomputation look dearer relative to the step; on CPU about 4% of the quick GPT-2's
step, and a step bound by the host, as small models on a GPU are, pays it in full). The
time model prices it since IR 1.13 (`cost_model.call_overhead_s`), measured at profiling
within the same calls (`runtimes/call_overhead.py`); this benchmark measures it apart, from
separate steps, as a check.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import remat_ir  # noqa: E402
from models import gpt2  # noqa: E402
from remat_ir.runtimes.timing import segments_step  # noqa: E402
from remat_ir.runtimes.torch import resident_values  # noqa: E402


def timed_step(module, inputs, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    module(**inputs).loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    module.zero_grad(set_to_none=True)
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "torch_overhead.json"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model, inputs = gpt2()
    model.to(device)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    eager = copy.deepcopy(model)
    print(f"lowering GPT-2 on {device}...", flush=True)
    scheduled = remat_ir.remat(model, (), example_kwargs=inputs, solver="autograd")
    segments = segments_step(scheduled.graph, scheduled.schedule,
                             resident_values(model, scheduled.graph, (), inputs), device)
    for _ in range(3):  # warm-up all (compilation of the segments, allocator caches)
        timed_step(eager, inputs, device), timed_step(scheduled, inputs, device), segments()
    times = {"eager": [], "remat_store_all": [], "segments_alone": []}
    for r in range(args.rounds):
        times["eager"].append(timed_step(eager, inputs, device))
        times["remat_store_all"].append(timed_step(scheduled, inputs, device))
        times["segments_alone"].append(segments())
        if (r + 1) % 10 == 0:
            print(f"  round {r + 1}/{args.rounds}", flush=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratio = medians["remat_store_all"] / medians["eager"]
    call_overhead = medians["remat_store_all"] - medians["segments_alone"]
    result = {
        "benchmark": "store_all step time / eager step time, GPT-2 (examples/models.py:gpt2)",
        "ratio": round(ratio, 4), "target": 1.05, "rounds": args.rounds,
        "median_step_s": {k: round(v, 6) for k, v in medians.items()},
        "call_overhead_s": round(call_overhead, 6),
        "call_overhead_share": round(call_overhead / medians["remat_store_all"], 4),
        "graph_nodes": len(scheduled.graph.nodes),
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"store_all / eager step time: {ratio:.3f} (target <= 1.05); runtime's per-call overhead "
          f"beyond the segments: {call_overhead * 1e3:.2f} ms ({call_overhead / medians['remat_store_all']:.1%} "
          f"of the step); wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
