"""What routing gradients as eager's backward reaches them costs a training step.

    python benchmarks/gradient_routes.py [--rounds N] [--width W]

A step's parameters that only some outputs feed (a second head) are handed over by
autograd nodes of their own, which only those outputs reach (`runtimes/gradient_routes.py`),
so that a head the loss leaves out runs none of its hooks, as with eager. Each such set
of outputs costs an anchor node, and each of those outputs a node of its own: Python
autograd Functions. Rounds alternate the step as routed and the same step with every
gradient on the chain (as before the routes, and as under FSDP2), so that machine noise
hits both alike; the figure is the ratio of the medians. Models: four heads on one body
(a head on a head, one on the input: 5 anchors, 4 output nodes) and the quick GPT-2 of the
training-step benchmark (one loss output: no anchor, the same nodes). Results go to
benchmarks/results/gradient_routes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import remat_ir  # noqa: E402
from bench_models import FACTORIES  # noqa: E402
from interleaved import interleaved_seconds  # noqa: E402


class Heads(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.body, self.a = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.b, self.c, self.d = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        h = torch.relu(self.body(x))
        a = self.a(h)
        return a, self.b(h), self.c(torch.tanh(a)), self.d(x)


def _heads(width: int):
    x = torch.randn(64, width)
    return "four heads", Heads(width), (x,), lambda out: sum(o.square().mean() for o in out)


def _gpt2(width: int):
    bm = FACTORIES["gpt2"]("quick")
    return bm.description, bm.module, bm.inputs, lambda loss: loss


def measure(make, width: int, rounds: int, steps: int = 10) -> dict:
    description, model, inputs, loss_of = make(width)
    scheduled = remat_ir.remat(model, inputs, cache_dir=False)

    def step():
        scheduled.zero_grad(set_to_none=True)
        loss_of(scheduled(*inputs)).backward()

    step()
    runner = next(iter(next(reversed(scheduled._plans.values())).runners.values()))
    routes = {"routed": runner.routes, "chain": runner.chain_routes}
    times = interleaved_seconds({"routed": step, "chain": step}, rounds, steps,
                                before=lambda name: setattr(runner, "routes", routes[name]))
    runner.routes = routes["routed"]
    routed = routes["routed"]
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"model": description, "anchors": len(routed.anchors), "output_nodes": len(routed.own_nodes),
            "rounds": rounds, "routed_step_s": medians["routed"], "chain_step_s": medians["chain"],
            "ratio": medians["routed"] / medians["chain"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for make in (_heads, _gpt2):
        row = measure(make, args.width, args.rounds)
        rows.append(row)
        print(f"{row['model']}: {row['anchors']} anchors, {row['output_nodes']} output nodes; step "
              f"{row['routed_step_s'] * 1e3:.2f} ms routed, {row['chain_step_s'] * 1e3:.2f} ms all on the chain "
              f"({row['ratio']:.3f}x), medians of {args.rounds} interleaved rounds", flush=True)
    out = HERE / "results" / "gradient_routes.json"
    out.write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                               "width": args.width, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
