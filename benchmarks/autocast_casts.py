"""What standing in for autocast's cached casts costs (`runtimes/autocast_anchors.py`).

    python benchmarks/autocast_casts.py [--weights 150] [--size 64] [--rounds 5] [--model small]

Two figures, written to benchmarks/results/autocast_casts.json:

- time: per call, the runtime makes one zero-stride tensor per weight standing for the
  block's bf16 cast (one autograd node per run of weights holding at most the largest
  weight's bytes: with weights of one size, the worst case, a node per weight), and the
  backward casts the summed gradient back through those nodes. Timed, interleaved round by round, against
  what the graph did before: cast each gradient back and hand it to the parameter.
  The difference is the cost of summing a module called twice in one block like eager.
  Both hand the gradients from one node, as the step's backward does (one group).
- memory: the zoo GPT-2 under bf16 autocast, planned store-everything, recompute-all and
  hiremate at 50%: simulated peak against the peak measured by the profiler (CPU). The
  float32 gradients are made when the casts' node runs, after the group that finishes
  them, so the measured peak may be below the planned one, not above it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interleaved import interleaved_seconds  # noqa: E402


def _times(weights: int, size: int, rounds: int, calls: int) -> dict:
    import torch

    from remat_ir.runtimes import autocast_anchors

    params = [torch.nn.Parameter(torch.randn(size, size)) for _ in range(weights)]
    grads = [torch.ones(size, size, dtype=torch.bfloat16) for _ in params]

    class Hand(torch.autograd.Function):
        """The step's node handing float32 gradients to the parameters, as before."""

        @staticmethod
        def forward(ctx, *tensors):
            return torch.empty(0)

        @staticmethod
        def backward(ctx, _):
            return tuple(g.to(torch.float32) for g in grads)

    class Hand16(Hand):
        """The same node handing the bf16 gradients to the casts instead."""

        @staticmethod
        def backward(ctx, _):
            return tuple(grads)

    def anchored():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.clear_autocast_cache()   # a new block each call
            made = autocast_anchors.casts([[(p, torch.bfloat16) for p in params]])[0]
        Hand16.apply(*made).sum().backward()

    def direct():
        Hand.apply(*params).sum().backward()

    def clear(_name):
        for p in params:
            p.grad = None

    seconds = interleaved_seconds({"anchored": anchored, "direct": direct}, rounds, calls, before=clear)
    extra = [a - d for a, d in zip(seconds["anchored"], seconds["direct"])]
    nodes = len(autocast_anchors._chunks(list(range(weights)), [(p, torch.bfloat16) for p in params]))
    return {"weights": weights, "nodes": nodes, "size": size, "rounds": rounds, "calls_per_round": calls,
            "anchored_ms": [s * 1e3 for s in seconds["anchored"]],
            "direct_ms": [s * 1e3 for s in seconds["direct"]],
            "extra_ms_median": statistics.median(extra) * 1e3,
            "extra_us_per_weight_median": statistics.median(extra) * 1e6 / weights}


def _peaks(size: str) -> list[dict]:
    import torch

    import zoo_models

    import remat_ir
    from remat_ir import ir
    from remat_ir.runtimes.memory import measure_peak

    rows = []
    for solver, budget in (("autograd", None), ("recompute-all", None), ("hiremate", 0.5)):
        model, args, kwargs, loss_of = zoo_models.gpt2(size)
        with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scheduled = remat_ir.remat(model, args, budget, example_kwargs=kwargs, solver=solver,
                                       cost_model="flops")

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(scheduled(*args, **kwargs))
            loss.backward()

        step()   # compiles the segments
        scheduled.zero_grad(set_to_none=True)
        measured = measure_peak(step, "cpu").peak_bytes
        simulated = ir.simulate(scheduled.graph, scheduled.schedule).peak_bytes
        casts = len(scheduled.runner(torch.device("cpu")).plan.autocast_casts)
        rows.append({"solver": solver, "budget": budget, "simulated_peak": simulated,
                     "measured_peak": measured, "ratio": measured / simulated,
                     "weights_handed_to_casts": casts})
        print(f"  {solver} {budget}: simulated {simulated:,} B, measured {measured:,} B "
              f"(x{measured / simulated:.4f}), {casts} weights", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=int, default=150)
    parser.add_argument("--size", type=int, default=64, help="each weight is size x size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50, help="calls per round and way")
    parser.add_argument("--model", default="small", help="zoo GPT-2 size (tiny, small)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "autocast_casts.json")
    options = parser.parse_args()
    print(f"time: {options.weights} weights, {options.rounds} interleaved rounds", flush=True)
    times = _times(options.weights, options.size, options.rounds, options.calls)
    print(f"  anchored {statistics.median(times['anchored_ms']):.2f} ms, direct "
          f"{statistics.median(times['direct_ms']):.2f} ms per call; extra "
          f"{times['extra_us_per_weight_median']:.1f} us per weight (median of rounds)", flush=True)
    print(f"memory: zoo GPT-2 {options.model} under bf16 autocast", flush=True)
    peaks = _peaks(options.model)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"time": times, "memory": peaks}, indent=1) + "\n")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
