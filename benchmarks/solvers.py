"""Every solver on every benchmark graph at every budget: planning time and predicted overhead.

    python benchmarks/solvers.py                      # everything (hours on 2 CPU cores)
    python benchmarks/solvers.py --graphs gpt2,llama32 --solvers hiremate,rotor,sqrt
    python benchmarks/solvers.py --quick              # GPT-2 4 layers and two chains, a minute
    python benchmarks/solvers.py --table              # only redraw solvers.md from solvers.json

Graphs, lowered with FLOP costs (`lower_torch(..., cost_model="flops")`), random
weights, no downloads; nodes and lowering seconds (2 shared CPU cores) as measured
(results/solvers.md has them per graph):

| graph | model | nodes | lowering |
|---|---|---:|---:|
| gpt2 | GPT-2 12 layers, d=768, 12 heads, vocab 50257, seq 512, batch 8 (benchmarks/hiremate.py's) | 1,828 | 3 s |
| llama32 | Llama 32 layers, hidden 256, 4 heads, 2 key/value heads (GQA), MLP 688, vocab 8192, seq 256, batch 4, no KV cache | 7,136 | 13 s |
| gpt2-48 | GPT-2 48 layers, d=256, 4 heads, vocab 8192, seq 256, batch 4 | 7,084 | 12 s |
| unet | diffusers UNet2DModel, 4 levels, 32-128 channels, attention at 8x8, 64x64, batch 8 (benchmarks/hiremate.py's) | 1,801 | 4 s |
| resnet50 | transformers ResNet-50 (bottleneck 3-4-6-3, 256-2048 channels), 128x128, batch 16 | 516 | 2 s |
| bert | BERT-base: 12 layers, d=768, 12 heads, vocab 30522, seq 512, batch 8, masked-LM loss | 2,082 | 8 s |
| t5 | T5-small: 6+6 layers, d=512, d_ff 2048, 8 heads, vocab 32128, input 256, labels 64, batch 16 | 3,543 | 5 s |
| gpt2-4 | GPT-2 4 layers, d=128, 4 heads, vocab 2048, seq 128, batch 4 (--quick only) | 660 | 2 s |

The 32- and 48-layer graphs have a vocabulary of 8,192: with 32,000 the Llama's loss alone
(logits, their log-softmax and its gradient, 3 x 131 MB) holds 35% of the store-everything
peak, and no solver could go below it. BERT and T5 run batches (8, 16) at which 30% and
25% can be reached: at batch 2 and 4 no solver went below 37% and 56%.

Each lowered graph is cached as `GRAPH-KEY.rir` (KEY: a digest of the model's config,
shapes and cost model) with a `.json` beside it (config, nodes, lowering seconds) under
`--cache` (default `build/bench-graphs/`) and reused by later runs; delete a file to lower
it again.

Solvers: specs `NAME` or `NAME:KEY=VALUE,KEY=VALUE` (options passed to `solvers.solve`;
values as `remat-ir solve --option` reads them), by default hiremate, rotor, sqrt,
checkmate (graphs of at most --checkmate-max-nodes only), twremat, fastsa and
fastsa:start=hiremate. A solver not in `solvers.available()` is skipped with a note.

Budgets: 50%, 30% and 25% of the store-everything peak, and the smallest budget hiremate
names for the graph (`solve(graph, 1, "hiremate")`'s InfeasibleBudget.smallest_feasible),
found once per graph and recorded so that every solver is asked that same byte budget.

Per (graph, solver, budget): planning seconds (the wall time of `solvers.solve`, time
limit --time-limit, default 30 s, hiremate's own default), whether a plan fits (else the smallest budget the
solver names), the plan's predicted peak as a share of the store-everything peak and its
predicted overhead: predicted time / store-everything's predicted time - 1. Each solve
gets a fresh copy of the graph (no partition tree or schedule of an earlier solve in it)
and `solve`'s memory of earlier refusals' floors is cleared first: every figure is a
solver planning from scratch. Each solve runs in a forked child process killed after
--kill-after seconds (default 5 x the time limit: rotor's dynamic program has no deadline);
its row then says so.

Lower bound: the spec `bound` (options `time_limit_s`, default 300, and `moments`) is not a
solver. Its row is what `solvers.bounds.lower_bound` proves within its time: no schedule
within the budget (without offloading) is faster than that overhead, or none fits at all.
It tells a solver's gap to what is possible, and an overhead target from an impossible one.

Reference: checkmate's proven optimum (status OPTIMAL) on graphs it solves exactly:
chains (tests/builders.py) of 10, 16, 24 and 36 nodes and examples/mlp.rir (37 nodes;
the models of examples/models.py have hundreds of nodes) at 90% to 40%: every other
solver's predicted time / checkmate's.

Writes benchmarks/results/solvers.json (merged: a run replaces the rows it measures and
keeps the others; each row names its run, whose machine, versions and commit are
recorded) and benchmarks/results/solvers.md, the table drawn from it (`--table` redraws
it alone). --quick writes to build/solvers-quick.json (.md) unless --out says otherwise.
MILPs run in the backend `solvers.solve` picks ($REMAT_IR_MILP, else HiGHS where it
loads, else CBC); `--milp cbc` forces one; the results record which.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import provenance  # noqa: E402
from remat_ir import ir, solvers  # noqa: E402
from remat_ir.solvers import InfeasibleBudget  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "solvers.json"
QUICK_OUT = ROOT / "build" / "solvers-quick.json"
CACHE = ROOT / "build" / "bench-graphs"
TIME_LIMIT_S = 30.0
#: A solve still running after this many time limits is killed (not every solver has a
#: deadline: rotor's dynamic program runs to its end).
KILL_AFTER_LIMITS = 5
SHARES = (0.5, 0.3, 0.25)
#: The pseudo-solver whose rows are the proven lower bound (`solvers.bounds`), not a plan:
#: `bound` or `bound:time_limit_s=300,moments=24`.
BOUND = "bound"
BOUND_TIME_LIMIT_S = 300.0
QUICK_SHARES = (0.5, 0.3)
QUICK_REFERENCE_SHARES = (0.7, 0.5)
SMALLEST = "smallest"
DEFAULT_SOLVERS = ("hiremate", "rotor", "sqrt", "checkmate", "twremat", "fastsa", "fastsa:start=hiremate")
#: The solvers that only run on graphs of at most --checkmate-max-nodes nodes.
SMALL_ONLY = ("checkmate",)
CHECKMATE_MAX_NODES = 100
REFERENCE_SHARES = (0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4)
#: chain(n) has 2n nodes: 10, 16, 24 and 36.
REFERENCE_CHAINS = (5, 8, 12, 18)
REFERENCE_MAX_NODES = 40


def say(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------- solver specs


@dataclass(frozen=True)
class Spec:
    """A solver and its options, as written: `fastsa:start=hiremate,steps=1000`."""
    text: str
    name: str
    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Spec:
        from remat_ir.cli import _option
        text = text.strip()
        name, _, rest = text.partition(":")
        if name == "exec":  # exec:COMMAND takes no options: the rest is the command
            return cls(text, text)
        options = tuple(_option(part) for part in rest.split(",") if part.strip()) if rest else ()
        return cls(text, name.strip(), options)

    def exists(self) -> bool:
        return (self.name == BOUND or self.name.startswith(solvers.EXEC_PREFIX)
                or self.name in {i.name for i in solvers.available()})

    def kill_after(self, kill_after: float | None) -> float | None:
        """A bound searches for its own time limit, not the solvers': kill it later."""
        if self.name != BOUND or kill_after is None:
            return kill_after
        return max(kill_after, 2 * dict(self.options).get("time_limit_s", BOUND_TIME_LIMIT_S) + 120)


def parse_specs(text: str | list[str]) -> list[Spec]:
    """Comma-separated specs; a comma before a `key=` continues the spec before it."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    specs: list[str] = []
    for part in parts:
        if specs and "=" in part and ":" not in part.split("=")[0]:
            specs[-1] += "," + part
        elif part.strip():
            specs.append(part.strip())
    return [Spec.parse(s) for s in specs]


def present(specs: list[Spec]) -> list[Spec]:
    """The specs whose solver exists, after a printed note for each that does not."""
    kept = []
    for spec in specs:
        if spec.exists():
            kept.append(spec)
        else:
            say(f"note: solver {spec.name!r} is not available here ({spec.text} skipped)")
    return kept


# ---------------------------------------------------------------- graphs


@dataclass
class GraphSpec:
    name: str
    description: str
    config: dict  # everything the graph depends on: the cache key is its digest
    build: object  # config -> (module, example inputs)
    quick: bool = False

    @property
    def key(self) -> str:
        from remat_ir.frontends.buffer_reuse import REUSING_OPS
        from remat_ir.frontends.dropout_masks import REVISION as DROPOUT_REVISION
        from remat_ir.frontends.view_compaction import REVISION as VIEW_COPY_REVISION
        from remat_ir.runtimes.profiling import ANALYTIC_REVISION
        # The lowering's buffer reuse, dropout split and view copies change the graph
        # (storages, out= ops, nodes): graphs cached before them, or with other versions,
        # are lowered again.
        text = json.dumps({"name": self.name, **self.config, "cost_model": "flops",
                           "flops_revision": ANALYTIC_REVISION,
                           "buffer_reuse": sorted(REUSING_OPS),
                           "dropout_split": DROPOUT_REVISION, "view_copies": VIEW_COPY_REVISION},
                          sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:10]


def _quiet_transformers():
    from transformers.utils import logging
    logging.set_verbosity_error()


def _language_model(config_class, model_class, config: dict):
    """A causal or seq2seq language model returning its loss, random ids of the config's shape."""
    import torch
    from models import LanguageModelLoss

    _quiet_transformers()
    torch.manual_seed(0)
    model = model_class(config_class(**config["config"]))
    vocab = config["config"]["vocab_size"]
    ids = torch.randint(1, vocab, (config["batch"], config["seq"]))
    labels = torch.randint(1, vocab, (config["batch"], config.get("label_seq", config["seq"])))
    labels = ids if "label_seq" not in config else labels
    return LanguageModelLoss(model.train()), (ids, labels)


def _gpt2(config):
    from transformers import GPT2Config, GPT2LMHeadModel
    return _language_model(GPT2Config, GPT2LMHeadModel, config)


def _llama(config):
    from transformers import LlamaConfig, LlamaForCausalLM
    return _language_model(LlamaConfig, LlamaForCausalLM, config)


def _t5(config):
    from transformers import T5Config, T5ForConditionalGeneration
    return _language_model(T5Config, T5ForConditionalGeneration, config)


def _bert(config):
    import torch
    from bench_models import MaskedLMLoss
    from transformers import BertConfig, BertForMaskedLM

    _quiet_transformers()
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**config["config"])).train()
    ids = torch.randint(0, config["config"]["vocab_size"], (config["batch"], config["seq"]))
    return MaskedLMLoss(model), (ids, ids)


def _resnet(config):
    import torch
    from bench_models import ClassifierLoss
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(**config["config"])).train()
    side = config["image"]
    pixels = torch.randn(config["batch"], 3, side, side)
    labels = torch.randint(0, config["config"]["num_labels"], (config["batch"],))
    return ClassifierLoss(model), (pixels, labels)


def _unet(config):
    import models
    return models.unet()


def _gpt2_config(layers, width, heads, seq, batch, vocab=50257):
    return dict(config=dict(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                            n_positions=seq, use_cache=False, bos_token_id=0, eos_token_id=0),
                seq=seq, batch=batch)


GRAPHS = {g.name: g for g in (
    GraphSpec("gpt2", "GPT-2 12 layers, d=768, 12 heads, seq 512, batch 8",
              _gpt2_config(12, 768, 12, 512, 8), _gpt2),
    GraphSpec("llama32", "Llama 32 layers, hidden 256, 4 heads (2 KV), MLP 688, vocab 8192, seq 256, batch 4",
              dict(config=dict(vocab_size=8192, hidden_size=256, intermediate_size=688,
                               num_hidden_layers=32, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=256, use_cache=False),
                   seq=256, batch=4), _llama),
    GraphSpec("gpt2-48", "GPT-2 48 layers, d=256, 4 heads, vocab 8192, seq 256, batch 4",
              _gpt2_config(48, 256, 4, 256, 4, vocab=8192), _gpt2),
    GraphSpec("unet", "diffusers U-Net, 4 levels, 32-128 channels, 64x64, batch 8",
              dict(factory="examples/models.py:unet"), _unet),
    GraphSpec("resnet50", "ResNet-50, 128x128, batch 16",
              dict(config=dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                               depths=[3, 4, 6, 3], layer_type="bottleneck", num_labels=1000),
                   image=128, batch=16), _resnet),
    GraphSpec("bert", "BERT-base, 12 layers, d=768, seq 512, batch 8",
              dict(config=dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                               intermediate_size=3072, vocab_size=30522, max_position_embeddings=512),
                   seq=512, batch=8), _bert),
    GraphSpec("t5", "T5-small, 6+6 layers, d=512, input 256, labels 64, batch 16",
              dict(config=dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                               num_heads=8, decoder_start_token_id=0, pad_token_id=0,
                               use_cache=False),
                   seq=256, label_seq=64, batch=16), _t5),
    GraphSpec("gpt2-4", "GPT-2 4 layers, d=128, 4 heads, seq 128, batch 4",
              _gpt2_config(4, 128, 4, 128, 4, vocab=2048), _gpt2, quick=True),
)}
FULL_GRAPHS = [name for name, g in GRAPHS.items() if not g.quick]


def lowered(spec: GraphSpec, cache: Path, *, split_dropouts: bool = True) -> tuple[ir.Graph, dict]:
    """The graph of `spec` from the cache, or lowered now and cached; (graph, its record).
    `split_dropouts=False` keeps each dropout one op, as a CUDA lowering does
    (`frontends/dropout_masks.py` splits CPU dropouts only), for graphs priced for a GPU."""
    path = cache / f"{spec.name}-{spec.key}{'' if split_dropouts else '-whole-dropout'}.rir"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        try:
            started = time.monotonic()
            graph = ir.load(path)
            meta = json.loads(meta_path.read_text())
            say(f"{spec.name}: {len(graph.nodes):,} nodes from {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
                f"({time.monotonic() - started:.1f} s; lowered in {meta['lowering_seconds']} s)")
            return graph, meta
        except (ir.RematIRError, OSError, ValueError, KeyError) as error:
            say(f"{spec.name}: cached graph unreadable ({error}); lowering again")
    import torch
    from remat_ir.frontends.torch import lower
    from remat_ir.lowering import add_costs

    say(f"{spec.name}: lowering {spec.description}...")
    model, inputs = spec.build(spec.config)
    started = time.monotonic()
    graph = add_costs(lower(model, inputs, split_dropouts=split_dropouts), "flops")
    seconds = time.monotonic() - started
    meta = dict(name=spec.name, description=spec.description, key=spec.key, config=spec.config,
                nodes=len(graph.nodes), lowering_seconds=round(seconds, 1), torch=torch.__version__,
                lowered_at=datetime.datetime.now().isoformat(timespec="seconds"))
    cache.mkdir(parents=True, exist_ok=True)
    ir.save(graph, path)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    say(f"{spec.name}: {len(graph.nodes):,} nodes, lowered in {seconds:.1f} s; cached in {path}")
    return graph, meta


# ---------------------------------------------------------------- measuring


def share_label(share: float) -> str:
    return f"{share * 100:g}%"


def fresh(data: bytes) -> ir.Graph:
    return ir.loads(data, check=False)


def run_limited(function, kill_after: float | None):
    """`function()` in a forked child killed after `kill_after` seconds (None: here, in
    this process); its result, or None when it was killed."""
    if kill_after is None:
        return function()
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)

    def child():
        try:
            result = function()
        except BaseException as error:  # noqa: BLE001 - reported by the parent as a row
            result = dict(feasible=False, error=f"{type(error).__name__}: {str(error)[:300]}")
        writer.send(result)

    process = context.Process(target=child, daemon=True)
    process.start()
    writer.close()
    try:
        if reader.poll(kill_after):
            return reader.recv()
        return None
    except EOFError:  # the child died without an answer
        return dict(feasible=False, error=f"the solving process died (exit code {process.exitcode})")
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        reader.close()


def measure(data: bytes, spec: Spec, budget: int, reference: ir.pb.Schedule, time_limit_s: float,
            progress=None, kill_after: float | None = None) -> dict:
    """One solve of a fresh copy of the graph: seconds, feasible, peak share, overhead.
    With `kill_after`, in a child process killed after that many seconds (a solver that
    overruns its time limit): then `timed_out`."""
    started = time.monotonic()
    row = run_limited(lambda: _measure(data, spec, budget, reference, time_limit_s, progress),
                      kill_after)
    if row is None:
        return dict(seconds=round(time.monotonic() - started, 2), feasible=False, timed_out=True)
    if "seconds" not in row:
        row["seconds"] = round(time.monotonic() - started, 2)
    return row


def _measure(data: bytes, spec: Spec, budget: int, reference: ir.pb.Schedule, time_limit_s: float,
             progress=None) -> dict:
    graph = fresh(data)
    if spec.name == BOUND:
        return _bound(graph, spec, budget, reference)
    solvers._FLOORS.clear()  # no floor remembered from an earlier solve: plan from scratch
    peak, base_time = reference.predicted_peak_bytes, reference.predicted_time_s
    started = time.monotonic()
    try:
        s = solvers.solve(graph, budget, spec.name, time_limit_s=time_limit_s,
                          progress=progress, **dict(spec.options))
    except InfeasibleBudget as refused:
        smallest = refused.smallest_feasible
        return dict(seconds=round(time.monotonic() - started, 2), feasible=False,
                    smallest_feasible_bytes=smallest,
                    smallest_feasible_share=None if smallest is None else round(smallest / peak, 4))
    except Exception as error:  # noqa: BLE001 - a failing solver is a row, not the end of the run
        return dict(seconds=round(time.monotonic() - started, 2), feasible=False,
                    error=f"{type(error).__name__}: {str(error)[:300]}")
    seconds = time.monotonic() - started
    return dict(seconds=round(seconds, 2), feasible=True, peak_bytes=s.predicted_peak_bytes,
                peak_share=round(s.predicted_peak_bytes / peak, 4),
                predicted_time_s=s.predicted_time_s,
                overhead=round(s.predicted_time_s / base_time - 1, 4),
                status=ir.pb.SolveStatus.Name(s.status))


def _bound(graph: ir.Graph, spec: Spec, budget: int, reference: ir.pb.Schedule) -> dict:
    """The least overhead any schedule within `budget` can have, as proven in the time given."""
    from remat_ir.solvers import bounds
    options = {"time_limit_s": BOUND_TIME_LIMIT_S, **dict(spec.options)}
    found = bounds.lower_bound(graph, budget, **options)
    row = dict(seconds=round(found.seconds, 2), feasible=found.feasible, bound=True, moments=found.moments)
    if found.feasible:
        row.update(predicted_time_s=found.time_s,
                   overhead=round(found.time_s / reference.predicted_time_s - 1, 4))
    return row


def describe_row(row: dict) -> str:
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    if row.get("error"):
        return f"error after {row['seconds']} s: {row['error']}"
    if row.get("timed_out"):
        return f"killed after {row['seconds']} s (time limit ignored)"
    if row.get("bound"):
        return (f"no schedule is faster than overhead {row['overhead']:.1%} (proven in {row['seconds']} s)"
                if row["feasible"] else f"no schedule fits (proven in {row['seconds']} s)")
    if not row["feasible"]:
        floor = row.get("smallest_feasible_share")
        return (f"infeasible (smallest it names: {'none' if floor is None else f'{floor:.1%}'}) "
                f"in {row['seconds']} s")
    return (f"overhead {row['overhead']:.1%}, peak {row['peak_share']:.1%} in {row['seconds']} s")


def smallest_feasible(data: bytes, time_limit_s: float, kill_after: float | None = None) -> dict:
    """The smallest budget hiremate names for the graph (asked for 1 byte)."""
    def probe():
        solvers._FLOORS.clear()
        try:
            return solvers.solve(fresh(data), 1, "hiremate", time_limit_s=time_limit_s).predicted_peak_bytes
        except InfeasibleBudget as refused:
            return refused.smallest_feasible

    started = time.monotonic()
    found = run_limited(probe, kill_after)
    return dict(bytes=found if isinstance(found, int) else None,
                seconds=round(time.monotonic() - started, 2))


def graph_rows(name: str, graph: ir.Graph, specs: list[Spec], budgets: list, *,
               time_limit_s: float = TIME_LIMIT_S, checkmate_max_nodes: int = CHECKMATE_MAX_NODES,
               smallest: dict | None = None, verbose: bool = False, on_row=None,
               kill_after: float | None = None) -> dict:
    """Every spec at every budget on `graph`: its record with `rows`.

    `budgets`: shares (floats) and/or SMALLEST. `smallest`: an earlier probe's
    {bytes, seconds} to reuse (else probed now when SMALLEST is asked for).
    `on_row(record)` is called after each row (to write results as they come).
    `kill_after`: seconds after which a solve (in a child process) is killed."""
    data = ir.dumps(graph)
    reference = ir.store_all(fresh(data))
    peak = reference.predicted_peak_bytes
    record = dict(nodes=len(graph.nodes), forward_nodes=len(graph.phase_order(ir.pb.FORWARD)),
                  store_all_peak_bytes=peak, store_all_time_s=reference.predicted_time_s, rows=[])
    asked = []
    for budget in budgets:
        if budget == SMALLEST:
            if smallest is None or smallest.get("bytes") is None:
                say(f"{name}: the smallest budget hiremate names...")
                smallest = smallest_feasible(data, time_limit_s, kill_after)
            record["smallest_feasible"] = dict(smallest, share=None if smallest["bytes"] is None
                                               else round(smallest["bytes"] / peak, 4))
            say(f"{name}: smallest feasible {record['smallest_feasible']}")
            if smallest["bytes"] is None:
                continue
            asked.append((SMALLEST, smallest["bytes"]))
        else:
            asked.append((share_label(budget), int(peak * budget)))
    for spec in specs:
        for label, budget in asked:
            row = dict(solver=spec.text, budget=label, budget_bytes=budget,
                       budget_share=round(budget / peak, 4))
            if spec.name in SMALL_ONLY and len(graph.nodes) > checkmate_max_nodes:
                row["skipped"] = f"{len(graph.nodes)} nodes > {checkmate_max_nodes}"
            else:
                progress = (lambda m: say("    " + m)) if verbose else None
                row.update(measure(data, spec, budget, reference, time_limit_s, progress,
                                   spec.kill_after(kill_after)))
            say(f"{name} {spec.text} {label}: {describe_row(row)}")
            record["rows"].append(row)
            if on_row is not None:
                on_row(record)
    return record


def reference_graphs(quick: bool = False):
    """(name, graph) of the small graphs checkmate solves exactly."""
    from builders import chain
    for n in REFERENCE_CHAINS[:2] if quick else REFERENCE_CHAINS:
        yield f"chain{2 * n}", chain(n)[0]
    if not quick:
        mlp = ir.load(ROOT / "examples" / "mlp.rir")
        if len(mlp.nodes) <= REFERENCE_MAX_NODES:
            yield "mlp", mlp


def reference_rows(name: str, graph: ir.Graph, specs: list[Spec], shares, *,
                   time_limit_s: float = TIME_LIMIT_S, kill_after: float | None = None) -> list[dict]:
    """At each share where checkmate proves its optimum: every spec's predicted time / it."""
    data = ir.dumps(graph)
    reference = ir.store_all(fresh(data))
    peak = reference.predicted_peak_bytes
    exact_spec = Spec.parse("checkmate")
    rows = []
    for share in shares:
        budget = int(peak * share)
        exact = measure(data, exact_spec, budget, reference, time_limit_s, kill_after=kill_after)
        head = dict(graph=name, nodes=len(graph.nodes), budget=share_label(share), budget_bytes=budget,
                    checkmate_seconds=exact["seconds"], checkmate_status=exact.get("status"))
        if not exact["feasible"] or exact.get("status") != "OPTIMAL":
            say(f"{name} {share_label(share)}: checkmate {describe_row(exact)}"
                f"{', status ' + exact['status'] if exact.get('status') else ''}: no reference")
            rows.append(dict(head, solver=None))
            continue
        head["checkmate_time_s"] = exact["predicted_time_s"]
        for spec in specs:
            if spec.name == "checkmate":
                continue
            row = dict(head, solver=spec.text, **measure(data, spec, budget, reference, time_limit_s,
                                                        kill_after=spec.kill_after(kill_after)))
            if row["feasible"]:
                row["ratio"] = round(row["predicted_time_s"] / exact["predicted_time_s"], 4)
            say(f"{name} {share_label(share)} {spec.text}: "
                + (f"x{row['ratio']:.4f} checkmate's optimum in {row['seconds']} s" if "ratio" in row
                   else describe_row(row)))
            rows.append(row)
    return rows


# ---------------------------------------------------------------- results file


def run_context(time_limit_s: float) -> dict:
    import mip

    from remat_ir.solvers import milp

    versions = {"python": platform.python_version(), "mip": mip.__version__}
    for module in ("torch", "transformers", "diffusers", "numba"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            pass
    return dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
                **provenance.commit(ROOT),
                machine=dict(platform=platform.platform(),
                             processor=platform.processor() or platform.machine(),
                             cpus=os.cpu_count()),
                versions=versions, milp_backend=milp.solver_name(), time_limit_s=time_limit_s,
                argv=sys.argv[1:])


def load_results(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return dict(about="benchmarks/solvers.py: planning seconds and predicted overhead of every "
                      "solver per graph and budget; rows name the run (runs[RUN]) they come from",
                runs={}, graphs={}, reference=dict(rows=[]))


def merge_graph(results: dict, name: str, meta: dict, record: dict, run_id: str) -> None:
    """Rows of `record` replace the rows of the same solver and budget; others are kept
    (unless the graph changed: another config key)."""
    old = results["graphs"].get(name, {})
    kept = old.get("rows", []) if old.get("key") == meta.get("key") else []
    for row in record["rows"]:
        row["run"] = run_id
    rows = {(r["solver"], r["budget"]): r for r in kept}
    rows.update({(r["solver"], r["budget"]): r for r in record["rows"]})  # in place, new ones last
    rows = list(rows.values())
    entry = {k: v for k, v in old.items() if k != "rows"} if kept else {}
    entry.update(description=meta.get("description"), key=meta.get("key"),
                 lowering_seconds=meta.get("lowering_seconds"))
    entry.update({k: v for k, v in record.items() if k != "rows"})
    entry["rows"] = rows
    results["graphs"][name] = entry


def merge_reference(results: dict, rows: list[dict], run_id: str) -> None:
    """Rows of a run replace those of the same graph, budget and solver (a run of some
    solvers keeps the others' rows)."""
    for row in rows:
        row["run"] = run_id
    replaced = {(r["graph"], r["budget"], r["solver"]) for r in rows}
    kept = [r for r in results["reference"]["rows"]
            if (r["graph"], r["budget"], r["solver"]) not in replaced]
    results["reference"]["rows"] = sorted(kept + rows, key=lambda r: (r["nodes"], r["graph"],
                                                                      -float(r["budget"][:-1]),
                                                                      r["solver"] or ""))


def write(results: dict, path: Path) -> Path:
    """The JSON and the markdown table drawn from it; returns the markdown's path."""
    used = ({row["run"] for entry in results["graphs"].values() for row in entry["rows"]}
            | {row["run"] for row in results["reference"]["rows"]})
    results["runs"] = {k: v for k, v in results["runs"].items() if k in used}  # none left of a replaced run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    md = path.with_suffix(".md")
    md.write_text(table(results) + "\n")
    return md


def _cell(row: dict) -> str:
    if row.get("skipped"):
        return "—"
    if row.get("error"):
        return f"error ({row['seconds']:.1f} s)"
    if row.get("timed_out"):
        return f"killed after {row['seconds']:.0f} s"
    if row.get("bound"):
        return (f">= {row['overhead']:.1%} ({row['seconds']:.0f} s)" if row["feasible"]
                else f"none fits, proven ({row['seconds']:.0f} s)")
    if not row["feasible"]:
        floor = row.get("smallest_feasible_share")
        return f"infeasible, names {floor:.1%} ({row['seconds']:.1f} s)" if floor is not None \
            else f"infeasible ({row['seconds']:.1f} s)"
    return f"{row['overhead']:.1%} ({row['seconds']:.1f} s)"


def _budget_order(label: str) -> float:
    return -1.0 if label == SMALLEST else -float(label[:-1])


def table(results: dict) -> str:
    graphs = results["graphs"]
    measured = [row["solver"] for entry in graphs.values() for row in entry["rows"] if not row.get("skipped")]
    specs = [s for s in dict.fromkeys([*DEFAULT_SOLVERS, *measured]) if s in measured]
    lines = ["# Solvers: predicted overhead and planning time", "",
             "Written by `python benchmarks/solvers.py` from `solvers.json` (`--table` redraws it). "
             "Cells: predicted overhead over store-everything (predicted time / store-everything's "
             "- 1) and planning seconds; *infeasible, names X* when the solver refuses the budget "
             "and names X (share of the store-everything peak) as its smallest; — not run. "
             "Budgets are shares of the store-everything peak; *smallest* is the smallest budget "
             "hiremate names for the graph (its share in brackets), asked of every solver. "
             "Column *bound* (`--solvers ...,bound`): the least overhead any schedule within the "
             "budget can have, proven by `solvers/bounds.py` in the seconds shown (*>= X*), or "
             "*none fits* when it proves that no schedule fits the budget.", ""]
    runs = results.get("runs", {})
    used = sorted({row["run"] for entry in graphs.values() for row in entry["rows"]}
                  | {row["run"] for row in results.get("reference", {}).get("rows", [])})
    for run_id in used:
        run = runs.get(run_id, {})
        machine, versions = run.get("machine", {}), run.get("versions", {})
        lines.append(f"- run `{run_id}`: commit `{run.get('commit')}`"
                     f"{' with local changes' if run.get('commit_dirty') else ''}, "
                     f"{machine.get('cpus')} CPUs ({machine.get('platform')}), MILP {run.get('milp_backend')}, "
                     f"time limit {run.get('time_limit_s')} s; "
                     + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    lines += ["", "| graph | nodes | lowering s | store-everything peak MiB | smallest hiremate names |",
              "|---|---:|---:|---:|---|"]
    for name, entry in graphs.items():
        floor = entry.get("smallest_feasible") or {}
        floor_text = (f"{floor['share']:.1%} (found in {floor['seconds']:.1f} s)"
                      if floor.get("share") is not None else "")
        lines.append(f"| {name}: {entry.get('description')} | {entry['nodes']:,} | "
                     f"{entry.get('lowering_seconds') or ''} | {entry['store_all_peak_bytes'] / 2**20:,.1f} | "
                     f"{floor_text} |")
    lines += ["", "| graph | budget | " + " | ".join(specs) + " |",
              "|---|---|" + "---:|" * len(specs)]
    for name, entry in graphs.items():
        by = {(r["solver"], r["budget"]): r for r in entry["rows"]}
        for label in sorted({r["budget"] for r in entry["rows"]}, key=_budget_order):
            shown = label
            if label == SMALLEST and (entry.get("smallest_feasible") or {}).get("share") is not None:
                shown = f"smallest ({entry['smallest_feasible']['share']:.1%})"
            cells = [_cell(by[(s, label)]) if (s, label) in by else "" for s in specs]
            lines.append(f"| {name} | {shown} | " + " | ".join(cells) + " |")
    reference = results.get("reference", {}).get("rows", [])
    compared = [r for r in reference if r["solver"]]
    if compared:
        exact = {(r["graph"], r["budget"]) for r in compared}
        small = ", ".join(f"{g} ({n} nodes)" for g, n in dict.fromkeys((r["graph"], r["nodes"])
                                                                       for r in compared))
        lines += ["", f"Against checkmate's proven optimum on small graphs ({small}), at the "
                      f"{len(exact)} graph x budget pairs (of 90% to 40%) where checkmate proves "
                      "it: predicted time / checkmate's.", "",
                  "| solver | budgets | best | worst | mean | infeasible where checkmate is not |",
                  "|---|---:|---:|---:|---:|---:|"]
        for s in dict.fromkeys(r["solver"] for r in compared):
            mine = [r for r in compared if r["solver"] == s]
            ratios = [r["ratio"] for r in mine if "ratio" in r]
            best, worst = (f"x{min(ratios):.4f}", f"x{max(ratios):.4f}") if ratios else ("", "")
            mean = f"x{sum(ratios) / len(ratios):.4f}" if ratios else ""
            lines.append(f"| {s} | {len(mine)} | {best} | {worst} | {mean} | {len(mine) - len(ratios)} |")
        lines += ["", "Checkmate's optimum is its MILP's: a ratio below 1 is a plan within the budget "
                      "(by the simulator) that the MILP's model leaves out or prices higher."]
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_budgets(text: str) -> list:
    budgets = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("smallest", "smallest-feasible", "min"):
            budgets.append(SMALLEST)
        elif part:
            budgets.append(float(part.rstrip("%")) / 100 if part.endswith("%") or float(part) > 1
                           else float(part))
    return budgets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="GPT-2 4 layers at 50%% and 30%%, chains of 10 and 16 nodes at 70%% and 50%%")
    parser.add_argument("--graphs", help=f"comma-separated, of {', '.join(GRAPHS)} (default: all "
                                         "but gpt2-4), or 'none'")
    parser.add_argument("--solvers", help=f"solver specs, default {','.join(DEFAULT_SOLVERS)}")
    parser.add_argument("--budgets", help="shares and/or 'smallest', default 50%%,30%%,25%%,smallest")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help="seconds per solve")
    parser.add_argument("--kill-after", type=float, default=None,
                        help="seconds after which a solve is killed (it runs in a child process); "
                             "default 5 x --time-limit; 0: never, in this process")
    parser.add_argument("--checkmate-max-nodes", type=int, default=CHECKMATE_MAX_NODES)
    parser.add_argument("--no-reference", action="store_true", help="skip the small graphs vs checkmate")
    parser.add_argument("--reference-only", action="store_true", help="only the small graphs vs checkmate")
    parser.add_argument("--reprobe", action="store_true",
                        help="find hiremate's smallest budget again instead of reusing the recorded one")
    parser.add_argument("--milp", choices=("cbc", "highs"), help="force the MILP backend")
    parser.add_argument("--cache", type=Path, default=CACHE, help="lowered graphs (default build/bench-graphs)")
    parser.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/solvers.json; "
                                                 "--quick: build/solvers-quick.json)")
    parser.add_argument("--table", action="store_true", help="only redraw the markdown from the JSON")
    parser.add_argument("--verbose", action="store_true", help="print the solvers' progress messages")
    args = parser.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else OUT)
    if args.table:
        md = write(load_results(out), out)
        say(f"wrote {md}")
        return 0
    if args.milp:
        os.environ["REMAT_IR_MILP"] = args.milp
    kill_after = (KILL_AFTER_LIMITS * args.time_limit if args.kill_after is None
                  else args.kill_after or None)
    graph_names = (args.graphs.split(",") if args.graphs else ["gpt2-4"] if args.quick else FULL_GRAPHS)
    graph_names = [] if graph_names == ["none"] or args.reference_only else graph_names
    unknown = [g for g in graph_names if g not in GRAPHS]
    if unknown:
        parser.error(f"unknown graphs {unknown}; known: {', '.join(GRAPHS)}")
    specs = present(parse_specs(args.solvers or ",".join(DEFAULT_SOLVERS)))
    budgets = (parse_budgets(args.budgets) if args.budgets
               else list(QUICK_SHARES) if args.quick else [*SHARES, SMALLEST])
    results = load_results(out)
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    results["runs"][run_id] = dict(run_context(args.time_limit), kill_after_s=kill_after)
    say(f"run {run_id}: graphs {graph_names}, solvers {[s.text for s in specs]}, budgets {budgets}, "
        f"MILP {results['runs'][run_id]['milp_backend']}, time limit {args.time_limit} s")
    for name in graph_names:
        spec = GRAPHS[name]
        graph, meta = lowered(spec, args.cache)
        known = results["graphs"].get(name, {})
        smallest = None
        if not args.reprobe and known.get("key") == spec.key and known.get("smallest_feasible"):
            smallest = {k: known["smallest_feasible"][k] for k in ("bytes", "seconds")}
        graph_rows(name, graph, specs, budgets, time_limit_s=args.time_limit,
                   checkmate_max_nodes=args.checkmate_max_nodes, smallest=smallest,
                   verbose=args.verbose, kill_after=kill_after,
                   on_row=lambda record, name=name, meta=meta: (
                       merge_graph(results, name, meta, json.loads(json.dumps(record)), run_id),
                       write(results, out)))
        del graph
    if not args.no_reference:
        shares = QUICK_REFERENCE_SHARES if args.quick else REFERENCE_SHARES
        for name, graph in reference_graphs(args.quick):
            rows = reference_rows(name, graph, specs, shares, time_limit_s=args.time_limit,
                                  kill_after=kill_after)
            merge_reference(results, rows, run_id)
            write(results, out)
    md = write(results, out)
    say(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
