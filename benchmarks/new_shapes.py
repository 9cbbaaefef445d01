"""New input shapes (dynamic padding): the first call of each new length with plan reuse
and without, and how fast the reused plans are predicted to run.

    python benchmarks/new_shapes.py [--layers 4] [--width 128] [--batch 4]
                                    [--lengths 128,96,64,112,200] [--budget 50%]

A Llama (transformers, random weights, vocabulary 1024; the README's quick start) is
wrapped twice by `remat(..., budget)` for the first length: once as users get it
(`reuse_plans=True`) and once planning every shape itself (`reuse_plans=False`). Each
later length is then called once through both, in alternating order (this machine is
shared: interleaving keeps the two under the same load), timing the call, which lowers,
profiles and plans (or reuses) before its forward and backward. For each length the
predicted step time of the plan used, relative to store-everything on its own graph, is
recorded for both, priced on the same graph (the planned module's): what reuse costs in
plan quality; and where a plan was reused, its own prediction (on the source's in-step
times scaled to the shape: no step is timed for it) against that plan on the shape's
profile, and its peak there. Writes
benchmarks/results/new_shapes.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _model(layers: int, width: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=width, intermediate_size=width * 8 // 3,
                                        num_hidden_layers=layers, num_attention_heads=4, use_cache=False))


def _on(graph, schedule):
    """`schedule` simulated on `graph` (a lowering of the same shape), whatever its budget."""
    from remat_ir import ir
    unbounded = ir.pb.Schedule()
    unbounded.CopyFrom(schedule)
    unbounded.ClearField("budget_bytes")
    result = ir.simulate(graph, unbounded)
    assert result.valid, result.violation
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lengths", default="128,96,64,112,200",
                        help="the first is planned by remat(); each later one is a new shape")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "new_shapes.json")
    args = parser.parse_args(argv)
    import torch

    import remat_ir
    from remat_ir import ir

    lengths = [int(n) for n in args.lengths.split(",")]
    model = _model(args.layers, args.width)
    ids = torch.randint(0, 1024, (args.batch, max(lengths)))

    def batch(length: int) -> dict:
        x = ids[:, :length].contiguous()
        return dict(input_ids=x, labels=x)

    modules = {}
    for reuse in (True, False):
        start = time.perf_counter()
        modules[reuse] = remat_ir.remat(model, batch(lengths[0]), budget=args.budget, reuse_plans=reuse)
        print(f"remat(reuse_plans={reuse}) at length {lengths[0]}: {time.perf_counter() - start:.1f} s",
              flush=True)
    rows = []
    for k, length in enumerate(lengths[1:]):
        row = {"length": length}
        for reuse in ((True, False) if k % 2 == 0 else (False, True)):
            scheduled = modules[reuse]
            start = time.perf_counter()
            scheduled(**batch(length)).loss.backward()
            seconds = time.perf_counter() - start
            scheduled.zero_grad(set_to_none=True)
            key = "reuse" if reuse else "own"
            row[f"{key}_first_call_s"] = seconds
            row[f"{key}_reused_from"] = scheduled.schedule.solver_params.get("reused_from", "")
        # Both plans priced on the planned module's graph: two lowerings' profiled costs
        # differ by a few percent, which would blur what reuse costs.
        graph = modules[False].graph
        everything = ir.store_all(graph)
        reused, own = _on(graph, modules[True].schedule), _on(graph, modules[False].schedule)
        row["reuse_predicted_vs_store_all"] = reused.total_time_s / everything.predicted_time_s
        row["own_predicted_vs_store_all"] = own.total_time_s / everything.predicted_time_s
        row["reuse_peak_vs_store_all"] = reused.peak_bytes / everything.predicted_peak_bytes
        if row["reuse_reused_from"]:
            # Its own prediction, on the source's in-step times scaled to this shape (no
            # step timed), against the same plan on this shape's profile; and its peak there.
            mine = modules[True].schedule
            row["scaled_vs_profiled_prediction"] = mine.predicted_time_s / reused.total_time_s
            row["scaled_vs_profiled_peak"] = mine.predicted_peak_bytes / reused.peak_bytes
        rows.append(row)
        print(f"length {length}: first call {row['reuse_first_call_s']:.1f} s with reuse "
              f"({row['reuse_reused_from'] or 'planned'}), {row['own_first_call_s']:.1f} s planning; "
              f"predicted step x{row['reuse_predicted_vs_store_all']:.4f} vs "
              f"x{row['own_predicted_vs_store_all']:.4f} of store-everything", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    result = dict(commit=commit, torch=torch.__version__, machine=platform.platform(),
                  cpus=torch.get_num_threads(), layers=args.layers, width=args.width,
                  batch=args.batch, budget=args.budget, first_length=lengths[0], rows=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# New input shapes: plan reuse (commit `{commit}`, {platform.platform()}, "
             f"{torch.get_num_threads()} threads)", "",
             f"Llama {args.layers} layers, width {args.width}, batch {args.batch}, budget "
             f"{args.budget}, planned by `remat()` at length {lengths[0]}; each later length's "
             "first call (lower, profile, plan or reuse, forward, backward), the two modules "
             "interleaved.", "",
             "| length | first call, reuse (s) | first call, planned (s) | ratio | predicted step vs "
             "store-everything (planned graph's costs): reused | planned | reused plan's peak "
             "(share of store-everything) | reused plan's prediction on scaled costs / on this "
             "shape's profile (peak) | reused from |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        scaled = (f"{r['scaled_vs_profiled_prediction']:.3f} ({r['scaled_vs_profiled_peak']:.3f})"
                  if "scaled_vs_profiled_prediction" in r else "")
        lines.append(f"| {r['length']} | {r['reuse_first_call_s']:.1f} | {r['own_first_call_s']:.1f} | "
                     f"{r['reuse_first_call_s'] / r['own_first_call_s']:.2f} | "
                     f"x{r['reuse_predicted_vs_store_all']:.4f} | x{r['own_predicted_vs_store_all']:.4f} | "
                     f"{r['reuse_peak_vs_store_all']:.1%} | {scaled} | {r['reuse_reused_from'] or '(planned)'} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
