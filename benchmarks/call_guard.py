"""The per-call guard's share of a training step (issue 23: store-everything overhead).

    python benchmarks/call_guard.py [--models cnn,gpt2] [--rounds N]

Every training call of a remat-ir module first runs its plan's generated guard
(`runtimes/call_guard.py`): what the model looks like, checked against what the plan was
made for. For each quick benchmark model, rounds alternate a store-everything training
step and a batch of guard calls, so that machine noise hits both alike; the figure is
the guard's median time per call as a share of the step's median time. Results go to
benchmarks/results/call_guard.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import remat_ir  # noqa: E402
from bench_models import FACTORIES  # noqa: E402
from training_step import steady_allocator  # noqa: E402


def measure(name: str, rounds: int, calls: int = 50) -> dict:
    bm = FACTORIES[name]("quick")
    scheduled = remat_ir.remat(bm.module, bm.inputs)

    def step():
        scheduled.zero_grad(set_to_none=True)
        scheduled(*bm.inputs).backward()

    for _ in range(3):
        step()
    guard = next(reversed(scheduled._plans.values())).guard
    model = scheduled._model
    if guard.model_tensors(model) is None:
        raise RuntimeError(f"{name}: the guard does not pass the model it was armed with")
    steps, checks = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        steps.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(calls):
            guard.model_tensors(model)
        checks.append((time.perf_counter() - start) / calls)
    step_s, guard_s = statistics.median(steps), statistics.median(checks)
    return {"model": name, "description": bm.description, "rounds": rounds, "step_s": step_s,
            "guard_s": guard_s, "guard_share_of_step": guard_s / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,gpt2")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    allocator = steady_allocator()   # as the training-step benchmark, whose steps these are
    rows = []
    for name in args.models.split(","):
        row = measure(name, args.rounds)
        rows.append(row)
        print(f"{name}: guard {row['guard_s'] * 1e6:.0f} us per call, {row['guard_share_of_step']:.2%} of a "
              f"store-everything step ({row['step_s'] * 1e3:.1f} ms), medians over {args.rounds} rounds",
              flush=True)
    out = HERE / "results" / "call_guard.json"
    out.write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                               "allocator": allocator, "rows": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
