"""Train GPT-2 for a few steps through remat-ir next to eager PyTorch, and compare.

    python examples/train.py

Schedules: autograd's (store what backward reads), hiremate's at half of that
peak (remat-ir's default solver), and recompute-all (least memory). Prints, per
schedule: loss and gradients against eager, memory saved for backward,
simulated and measured peak.
"""

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remat_ir  # noqa: E402
from remat_ir import ir  # noqa: E402
from remat_ir.ir.units import human_bytes  # noqa: E402
from remat_ir.runtimes.memory import measure_peak  # noqa: E402
from models import gpt2  # noqa: E402


def train_step(module, inputs) -> float:
    # The outputs (the logits too, 1 MiB here) are held until backward ends: the
    # simulator counts a step's outputs as live to its end, since a caller may read
    # them after backward. Dropping them at once measures that much below it.
    out = module(**inputs)
    out.loss.backward()
    return out.loss.item()


def main(steps: int = 3) -> None:
    model, inputs = gpt2()
    for solver, budget in (("autograd", None), ("hiremate", "50%"), ("recompute-all", None)):
        eager, mine = copy.deepcopy(model), copy.deepcopy(model)
        print(f"[{solver}{f' at {budget}' if budget else ''}] lowering and planning...", flush=True)
        scheduled = remat_ir.remat(mine, (), example_kwargs=inputs, solver=solver, budget=budget)
        sim = ir.simulate(scheduled.graph, scheduled.schedule)
        opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
        opt_s = torch.optim.AdamW(scheduled.parameters(), lr=1e-3)
        for step in range(steps):
            torch.manual_seed(step)
            loss_e = eager(**inputs).loss
            loss_e.backward()
            torch.manual_seed(step)
            measured = measure_peak(lambda: train_step(scheduled, inputs), "cpu")
            same = all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), scheduled.parameters()))
            print(f"  step {step}: loss eager {loss_e.item():.6f} remat {measured.result:.6f}; "
                  f"gradients bitwise equal to eager: {same}; peak measured "
                  f"{human_bytes(measured.peak_bytes)} / simulated {human_bytes(sim.peak_bytes)}")
            opt_e.step(), opt_s.step()
            opt_e.zero_grad(), opt_s.zero_grad()
        # Each lowering profiles its own costs: compare times on the same graph only.
        store = ir.simulate(scheduled.graph, ir.store_all(scheduled.graph))
        print(f"  saved for backward {human_bytes(sim.saved_bytes)}, {sim.recomputations} recomputations, "
              f"predicted time x{sim.total_time_s / store.total_time_s:.2f} of storing everything")


if __name__ == "__main__":
    main()
