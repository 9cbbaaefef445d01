"""DDP and FSDP2 with and without remat-ir: step time, peak per rank, reduction overlap.

    python benchmarks/distributed.py            # 2 gloo ranks on CPU, a few minutes
    python benchmarks/distributed.py --quick    # smaller models, for a smoke run
    python benchmarks/distributed.py --table    # only redraw distributed.md

Two processes (gloo, CPU, one thread each) train GPT-2 (4 layers, d=256, seq 256,
4 sequences per rank) and a CNN with BatchNorm (benchmarks/zoo_models.py, "small",
16 images per rank). Per rank, methods run side by side on copies of one model,
interleaved step by step (the machine is shared and noisy):

- `ddp eager`: DistributedDataParallel around the model;
- `ddp remat, 1 group`: around remat-ir (`BUDGETS`: 50% of the store-everything peak
  for GPT-2, 65% for the CNN, whose floor is 59.8%), its
  gradients handed to autograd at the end of the backward (as before this existed);
- `ddp remat`: the same plan, gradients handed over in groups as they are final;
- `fsdp eager`: fully_shard on each block, then on the model;
- `fsdp remat`: the same plan, then fully_shard on the blocks and the scheduled module.

DDP's buckets are an eighth of the model's parameter bytes each (its default 25 MiB
would put these models' gradients in one bucket). Figures: median step time (forward
and backward, gradients reduced) as a ratio to `ddp eager` in the same run; the peak
bytes a step allocates above what was allocated before it (the profiler's allocator
events, `runtimes.memory`; under FSDP this can drift upward, as FSDP frees during a step
buffers it allocated in the previous one) as a ratio to `ddp eager`'s; for DDP, the
share of the all-reduce time (per bucket, launch to completion, through a comm hook)
that elapses before the backward's compute ends (remat-ir: when its last gradient node
returns, `runtimes.torch.gradient_nodes`; eager: when the last bucket is launched).
Rank 0 writes benchmarks/results/distributed.json and distributed.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

OUT = HERE / "results" / "distributed.json"
QUICK_OUT = HERE.parent / "build" / "distributed-quick.json"
WORLD = 2
#: Budgets as shares of the store-everything peak, per model (full, quick): 50% where
#: the model's floor allows it, else just above the floor (the CNN's is 59.8%).
BUDGETS = {"GPT-2 4 layers": (0.5, 0.7), "CNN with BatchNorm": (0.65, 0.7)}
ROUNDS, WARMUP = 8, 2
BUCKETS = 8


def gpt2(quick: bool):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    layers, width, seq = (2, 64, 64) if quick else (4, 256, 256)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=4, n_embd=width, vocab_size=2048, n_positions=seq,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 2048, (4 * WORLD, seq))
    return (model, lambda shard: ((), dict(input_ids=shard, labels=shard, use_cache=False)), ids,
            lambda out: out.loss, lambda m: list(m.transformer.h))


def cnn(quick: bool):
    from zoo_models import cnn_batchnorm

    model, (x, labels), _, loss_of = cnn_batchnorm("tiny" if quick else "small")
    x = torch.randn(x.shape[0] * WORLD, *x.shape[1:])
    labels = torch.arange(x.shape[0]) % 10
    packed = torch.cat([x, labels.float()[:, None, None, None].expand(-1, 1, *x.shape[2:])], 1)

    def split(shard):
        return (shard[:, :3].contiguous(), shard[:, 3, 0, 0].long()), {}
    return model, split, packed, loss_of, lambda m: [m.body[i] for i in (0, 3, 7)] + [m.body[-1]]


MODELS = {"GPT-2 4 layers": gpt2, "CNN with BatchNorm": cnn}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Reductions:
    """A DDP comm hook that all-reduces as DDP does and records each bucket's launch and
    completion times."""

    def __init__(self):
        self.spans: list[tuple[float, float]] = []

    def hook(self, _state, bucket):
        launched = time.perf_counter()
        future = dist.all_reduce(bucket.buffer().div_(WORLD), async_op=True).get_future()

        def done(f):
            self.spans.append((launched, time.perf_counter()))
            return f.value()[0]
        return future.then(done)

    def overlap(self, computed: float | None) -> float:
        """Share of in-flight reduction time before the backward's compute ended:
        `computed` (when remat-ir's last gradient node returned), else when the last
        bucket was launched (eager: its last gradient is the backward's last result)."""
        if not self.spans:
            return 0.0
        end_of_compute = computed if computed is not None else max(start for start, _ in self.spans)
        total = sum(end - start for start, end in self.spans)
        early = sum(max(0.0, min(end, end_of_compute) - start) for start, end in self.spans)
        return early / total if total > 0 else 0.0


def build(name: str, quick: bool, rank: int) -> dict:
    import remat_ir
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    model, split, batch, loss_of, units_of = MODELS[name](quick)
    args, kwargs = split(batch.chunk(WORLD)[rank])
    methods = {}

    # DDP's 25 MiB buckets would hold these models' gradients in one or two: buckets of
    # an eighth of the parameters give the overlap something to show, as a large model's do.
    cap_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / BUCKETS / 2**20

    def ddp(module):
        wrapped, reductions = DistributedDataParallel(module, bucket_cap_mb=cap_mb), Reductions()
        wrapped.register_comm_hook(None, reductions.hook)
        return wrapped, reductions

    methods["ddp eager"] = ddp(copy.deepcopy(model))
    base = copy.deepcopy(model)
    planned = remat_ir.remat(base, args, budget=BUDGETS[name][quick], example_kwargs=kwargs, cost_model="flops")
    from remat_ir.runtimes.torch import ScheduledModule
    methods["ddp remat, 1 group"] = ddp(ScheduledModule(base, planned.graph, planned.schedule,
                                                        gradient_groups=1))
    other = copy.deepcopy(model)
    methods["ddp remat"] = ddp(ScheduledModule(other, planned.graph, planned.schedule))
    eager = copy.deepcopy(model)
    for unit in units_of(eager):
        fully_shard(unit)
    methods["fsdp eager"] = (fully_shard(eager), None)
    sharded = copy.deepcopy(model)
    scheduled = ScheduledModule(sharded, planned.graph, planned.schedule)
    for unit in units_of(sharded):
        fully_shard(unit)
    methods["fsdp remat"] = (fully_shard(scheduled), None)
    groups = len(planned.runner(args[0].device if args else kwargs["input_ids"].device)
                 .plan.gradient_groups)
    return {"methods": methods, "args": args, "kwargs": kwargs, "loss_of": loss_of,
            "nodes": len(planned.graph.nodes), "groups": groups,
            "planned_peak": planned.schedule.predicted_peak_bytes}


def step_of(module, built: dict, rank: int, k: int, computed: list | None = None):
    """One training step; appends to `computed` when remat-ir's backward segment ended."""
    from remat_ir.runtimes.torch import gradient_nodes

    def step():
        torch.manual_seed(1000 * k + rank)
        loss = built["loss_of"](module(*built["args"], **built["kwargs"]))
        nodes = gradient_nodes(loss)
        if nodes and computed is not None:
            nodes[-1].register_hook(lambda *_: computed.append(time.perf_counter()))
        loss.backward()
        for p in module.parameters():
            p.grad = None
    return step


def run_model(name: str, quick: bool, rank: int) -> list[dict]:
    from remat_ir.runtimes.memory import measure_peak

    built = build(name, quick, rank)
    methods = built["methods"]
    times = {m: [] for m in methods}
    overlaps = {m: [] for m in methods}
    peaks = {}
    for m, (module, _) in methods.items():
        for k in range(WARMUP):
            step_of(module, built, rank, k)()
        peaks[m] = measure_peak(step_of(module, built, rank, WARMUP), "cpu").peak_bytes
    for k in range(ROUNDS):
        for m, (module, reductions) in methods.items():
            if reductions is not None:
                reductions.spans.clear()
            dist.barrier()
            computed: list[float] = []
            started = time.perf_counter()
            step_of(module, built, rank, k, computed)()
            times[m].append(time.perf_counter() - started)
            if reductions is not None:
                overlaps[m].append(reductions.overlap(computed[-1] if computed else None))
    reference_time, reference_peak = statistics.median(times["ddp eager"]), peaks["ddp eager"]
    rows = []
    for m in methods:
        rows.append({"model": name, "method": m, "rank": rank, "nodes": built["nodes"],
                     "gradient_groups": {"ddp remat": built["groups"], "fsdp remat": built["groups"],
                                         "ddp remat, 1 group": 1}.get(m),
                     "step_s": statistics.median(times[m]),
                     "time_ratio": round(statistics.median(times[m]) / reference_time, 4),
                     "peak_bytes": peaks[m], "peak_ratio": round(peaks[m] / reference_peak, 4),
                     "overlap_share": round(statistics.median(overlaps[m]), 3) if overlaps[m] else None})
    return rows


def worker(rank: int, port: int, quick: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KINETO_LOG_LEVEL="6")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        rows = []
        for name in MODELS:
            if rank == 0:
                print(f"{name}: planning, then {WARMUP} warm-up steps and {ROUNDS} rounds", flush=True)
            rows += run_model(name, quick, rank)
        gathered: list = [None] * WORLD
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            record = {"rows": [r for rs in gathered for r in rs], "run": run_record(quick)}
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(record, indent=1) + "\n")
    finally:
        gc.collect()  # DDP/FSDP cycles collected after the group is gone abort the process
        dist.barrier()
        dist.destroy_process_group()


def run_record(quick: bool) -> dict:
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "commit": commit, "quick": quick,
            "torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
            "world": WORLD, "backend": "gloo",
            "budgets": {name: budgets[quick] for name, budgets in BUDGETS.items()}, "rounds": ROUNDS}


def table(record: dict) -> str:
    """Markdown: one line per model and method, rank 0's and rank 1's figures side by side."""
    lines = ["| model | method | step time (x ddp eager) | peak per rank (x ddp eager) | "
             "all-reduce overlapped |", "|---|---|---:|---:|---:|"]
    rows = record["rows"]
    keys = list(dict.fromkeys((r["model"], r["method"]) for r in rows))
    for model, method in keys:
        mine = sorted((r for r in rows if (r["model"], r["method"]) == (model, method)),
                      key=lambda r: r["rank"])
        time_cell = " / ".join(f"{r['time_ratio']:.2f}" for r in mine)
        peak_cell = " / ".join(f"{r['peak_ratio']:.2f}" for r in mine)
        overlap = [r["overlap_share"] for r in mine if r["overlap_share"] is not None]
        overlap_cell = " / ".join(f"{o:.0%}" for o in overlap) if overlap else "-"
        lines.append(f"| {model} | {method} | {time_cell} | {peak_cell} | {overlap_cell} |")
    run = record["run"]
    lines.append("")
    budgets = ", ".join(f"{name} {share:.0%}" for name, share in run["budgets"].items())
    lines.append(f"Ranks 0 / 1. {run['world']} {run['backend']} ranks on CPU, one thread each; "
                 f"remat-ir budgets (of the store-everything peak): {budgets}; median of "
                 f"{run['rounds']} interleaved steps; commit {run['commit']}, {run['date']}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--table", action="store_true", help="only redraw the table")
    options = parser.parse_args(argv)
    out = QUICK_OUT if options.quick else OUT
    if not options.table:
        import torch.multiprocessing as mp

        mp.spawn(worker, args=(free_port(), options.quick, str(out)), nprocs=WORLD)
    record = json.loads(out.read_text())
    text = table(record)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
