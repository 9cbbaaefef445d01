"""What planning for the loss alone gives a Hugging Face model trained on its `.loss`.

    python benchmarks/loss_only.py [--layers 4] [--width 128] [--vocab 2048] [--seq 128] [--batch 8]

A causal language model given `labels` returns its loss and its logits. remat-ir plans
every output of the model: each gets a gradient (the logits' gradient is summed with
the one the loss gives them) and each counts until the backward ends, as for a loop that
holds the output through `backward()`. A loop that reads `.loss` alone
(`model(**batch).loss.backward()`, the Trainer's habit) needs neither, and the logits are
the largest tensor of a language model's step. `remat(model, batch, outputs=["loss"])`
plans for that loop: the logits are then an intermediate the plan may free or recompute.

GPT-2 (transformers, random weights; the quick benchmark's size by default) is lowered
both ways on FLOP costs (memory figures are bytes either way; predicted times are coarse
on FLOPs), and planned by hiremate at its floor and at byte budgets that are shares of the
whole model's store-everything peak; each plan's step is measured on CPU (the profiler's
allocator events) trained on `.loss` alone. Writes benchmarks/results/loss_only.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import provenance  # noqa: E402
from remat_ir import ir, solvers  # noqa: E402
from remat_ir.ir.schedules import store_all  # noqa: E402
from remat_ir.lowering import lower_torch  # noqa: E402
from remat_ir.runtimes.memory import measure_peak  # noqa: E402
from remat_ir.runtimes.torch import ScheduledModule  # noqa: E402

MiB = 2 ** 20


def _model(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=4, vocab_size=args.vocab,
                        n_positions=args.seq, use_cache=False, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), torch.randint(0, args.vocab, (args.batch, args.seq))


def _measured_peak(model, graph, schedule, batch) -> int:
    """The peak of a step trained on `.loss` alone (the second step: the first compiles)."""
    scheduled = ScheduledModule(model, graph, schedule)

    def step():
        out = scheduled(**batch)   # held through the backward, as the plan assumes
        out.loss.backward()

    for _ in range(2):
        scheduled.zero_grad(set_to_none=True)
        peak = measure_peak(step, "cpu").peak_bytes
    return peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shares", default="0.5,0.3", help="byte budgets, as shares of the whole model's "
                        "store-everything peak")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--output", default=str(HERE / "results" / "loss_only"))
    args = parser.parse_args(argv)
    try:
        shares = [float(s) for s in args.shares.split(",")]
    except ValueError:
        parser.error(f"--shares {args.shares!r}: write shares between 0 and 1, comma-separated, e.g. 0.5,0.3")
    if not all(0 < s <= 1 for s in shares):
        parser.error(f"--shares {args.shares!r}: each share must be above 0 and at most 1")
    model, ids = _model(args)
    batch = {"input_ids": ids, "labels": ids}
    ways = {"loss and logits (all outputs)": None, 'loss alone (outputs=["loss"])': ["loss"]}
    graphs = {}
    for way, outputs in ways.items():
        print(f"lowering: {way}...", flush=True)
        graphs[way] = lower_torch(model, (), example_kwargs=batch, cost_model="flops", outputs=outputs)
    whole = ir.simulate(graphs[next(iter(ways))], store_all(graphs[next(iter(ways))])).peak_bytes
    rows = []
    budgets = [("floor", None)] + [(f"{s:.0%} of the model's store-everything", int(s * whole)) for s in shares]
    for label, budget in budgets:
        for way, graph in graphs.items():
            store = ir.simulate(graph, store_all(graph))
            try:
                schedule = solvers.solve(graph, budget if budget is not None else 1, "hiremate",
                                         time_limit_s=args.time_limit)
            except solvers.InfeasibleBudget as refused:
                if budget is not None or refused.schedule is None:
                    rows.append({"budget": label, "way": way, "feasible": False,
                                 "floor_bytes": refused.smallest_feasible})
                    continue
                schedule = refused.schedule
            simulated = ir.simulate(graph, schedule)
            rows.append({"budget": label, "way": way, "feasible": True,
                         "store_everything_bytes": store.peak_bytes, "simulated_peak_bytes": simulated.peak_bytes,
                         "measured_peak_bytes": _measured_peak(model, graph, schedule, batch),
                         "predicted_time_ratio": round(simulated.total_time_s / store.total_time_s, 4),
                         "recomputations": simulated.recomputations})
            row = rows[-1]
            print(f"  {label}, {way}: simulated {row['simulated_peak_bytes'] / MiB:.2f} MiB, measured "
                  f"{row['measured_peak_bytes'] / MiB:.2f} MiB, predicted x{row['predicted_time_ratio']:.3f}, "
                  f"{row['recomputations']} recomputations", flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    context = {"model": f"GPT-2 {args.layers} layers, d={args.width}, vocabulary {args.vocab}, "
                        f"{args.batch} x {args.seq} tokens", "cost_model": "flops",
               "machine": platform.platform(), "torch": torch.__version__, **provenance.commit(HERE.parent)}
    out.with_suffix(".json").write_text(json.dumps({"context": context, "rows": rows}, indent=1))
    lines = [f"{context['model']}, hiremate, FLOP costs; each step trained on `.loss` alone "
             f"(commit `{context['commit']}`, torch {context['torch']}, {context['machine']}).", "",
             "| budget | remat-ir given | simulated peak MiB | measured peak MiB | predicted time vs its store-everything | recomputations |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        if row["feasible"]:
            lines.append(f"| {row['budget']} | {row['way']} | {row['simulated_peak_bytes'] / MiB:.2f} | "
                         f"{row['measured_peak_bytes'] / MiB:.2f} | x{row['predicted_time_ratio']:.3f} | "
                         f"{row['recomputations']} |")
        else:
            lines.append(f"| {row['budget']} | {row['way']} | infeasible (floor "
                         f"{row['floor_bytes'] / MiB:.2f}) | | | |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"results in {out.with_suffix('.json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
