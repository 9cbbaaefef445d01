"""The `remat-ir` command.

    remat-ir convert --torch MODULE:FACTORY -o FILE   lower a PyTorch model
    remat-ir convert MODEL.onnx [--shape NAME=2x16] -o FILE   lower an ONNX model
    remat-ir inspect FILE    what is in an IR file: nodes, ops, tensors, schedules
    remat-ir validate FILE   structure, then every schedule through the simulator
    remat-ir solve FILE --budget 50% [--solver hiremate] [--offload] -o OUT   plan within a budget
    remat-ir solvers         every solver that can be named, and where it comes from
    remat-ir partition FILE -o OUT   HiRemate's partition tree, stored in the IR
    remat-ir plot FILE -o PREFIX     memory over a schedule's steps; the partition tree

User mistakes (a bad file, an invalid graph or schedule) print one clear
message and exit with status 2; there is no traceback for them.

This module parses arguments and runs the commands; the text they print is
built in `remat_ir.reports`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .ir import RematIRError, load
from .ir.errors import InvalidGraph, InvalidSchedule
from .ir.graph import Graph
from .ir.units import human_bytes
from .reports import inspect_lines, partition_lines, solve_summary, solvers_lines, validate_lines
from .solvers import DEFAULT_SOLVER
from .solvers.partition import MAX_CLUSTER, MAX_TOP

EXIT_USER_ERROR = 2


def check_writable(option: str, path) -> None:
    """Refuse an output path that cannot be written before the work starts: a solve or a
    lowering may take an hour, and its result would be lost at the end. Nothing that
    exists is touched; a file that does not exist is created and removed again, which
    also catches read-only and special file systems (/proc) that permissions do not."""
    path = Path(path)
    where = f"{option} {path}: cannot write there"
    if path.is_dir():
        raise RematIRError(f"{where}: it is a directory; name a file (in it, e.g. {path / 'out'})")
    parent = path.parent
    if not parent.exists():
        raise RematIRError(f"{where}: no such directory {parent}; create it first")
    if not parent.is_dir():
        raise RematIRError(f"{where}: {parent} is not a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise RematIRError(f"{where}: the file is not writable")
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise RematIRError(f"{where}: {exc.strerror or exc}") from None
    os.unlink(path)


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (`--time-limit`), refused in
    the flag's words rather than the Python parameter's (found by a review)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def cmd_inspect(args) -> int:
    print("\n".join(inspect_lines(load(args.file), args.file, top=args.top)))
    return 0


def cmd_validate(args) -> int:
    lines, ok = validate_lines(load(args.file), args.file)
    print("\n".join(lines))
    return 0 if ok else EXIT_USER_ERROR


def _load_factory(spec: str):
    """The callable named by 'package.module:factory' (the current folder is importable)."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RematIRError(f"--torch {spec!r}: expected package.module:factory")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RematIRError(f"--torch {spec!r}: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:   # its own code failed as it was imported (hunt68: a traceback, exit 1)
        raise RematIRError(f"--torch {spec!r}: importing {module_name!r} raised {type(exc).__name__}: "
                           f"{exc}; fix that module, then convert again") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise RematIRError(f"--torch {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def cmd_convert(args) -> int:
    if (args.model is None) == (args.torch is None):
        raise RematIRError("convert takes either an ONNX file (remat-ir convert model.onnx -o F) "
                           "or --torch MODULE:FACTORY, not both and not neither")
    check_writable("-o", args.output)
    graph = _convert_onnx(args) if args.model is not None else _convert_torch(args)
    from .ir import save
    from .solvers import solve

    for reference in REFERENCE_SOLVERS:
        solve(graph, None, reference)
    path = save(graph, args.output)
    print(f"wrote {path}: {len(graph.nodes)} nodes, {len(graph.values)} values, schedules "
          + ", ".join(f"{s.name} (peak {human_bytes(s.predicted_peak_bytes)})" for s in graph.schedules))
    return 0


def _convert_torch(args) -> Graph:
    import torch

    from .lowering import lower_torch

    if args.shape or args.trainable != "initializers":
        raise RematIRError("--shape and --trainable apply to ONNX files, not to --torch factories")
    outputs = None if args.outputs is None else [int(o) if o.lstrip("-").isdigit() else o
                                                 for o in args.outputs.split(",")]
    factory = _load_factory(args.torch)
    try:
        made = factory()
    except Exception as exc:  # the user's code: where it failed, in one line
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise RematIRError(f"--torch {args.torch!r}: the factory raised {type(exc).__name__} at "
                           f"{frame.filename}:{frame.lineno} in {frame.name}: {exc}") from exc
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise RematIRError(f"--torch {args.torch!r}: the factory must return (model, example_inputs), "
                           f"got {type(made).__name__}")
    model, example = made
    if isinstance(example, dict):
        example_args, example_kwargs = (), example
    else:
        example_args, example_kwargs = example, None
    model.train()
    print(f"lowering {type(model).__name__} (torch.export, joint graph, {args.cost_model} costs)...",
          file=sys.stderr)
    return lower_torch(model, example_args, example_kwargs=example_kwargs, cost_model=args.cost_model,
                       outputs=outputs)


def _shape_arg(text: str) -> tuple[str, list[int]]:
    """--shape NAME=2x16 (a scalar input: NAME=)."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = [int(d) for d in dims.lower().split("x")] if dims else []
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise RematIRError(f"--shape {text!r}: expected INPUT_NAME=D0xD1x..., e.g. input_ids=2x16")
    return name, shape


def _convert_onnx(args) -> Graph:
    from .frontends.onnx import load_model
    from .frontends.onnx_ops import torch_dtype
    from .lowering import lower_onnx

    if args.outputs is not None:
        raise RematIRError("--outputs applies to --torch factories: an ONNX graph's outputs are "
                           "its own (export the model returning the loss alone)")
    shapes = dict(_shape_arg(text) for text in args.shape)
    example = None
    if shapes:
        model, source = load_model(args.model)
        inits = {i.name for i in model.graph.initializer}
        inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
        unknown = sorted(set(shapes) - set(inputs))
        missing = sorted(set(inputs) - set(shapes))
        if unknown or missing:
            raise RematIRError(f"--shape: give one for each input of {source} ({sorted(inputs)})"
                               + (f"; unknown {unknown}" if unknown else "")
                               + (f"; missing {missing}" if missing else ""))
        example = {name: _example_input(name, shape, torch_dtype(inputs[name].type.tensor_type.elem_type))
                   for name, shape in shapes.items()}
    print(f"lowering {args.model} (ONNX import, torch.export, joint graph, {args.cost_model} costs)...",
          file=sys.stderr)
    return lower_onnx(args.model, example, cost_model=args.cost_model, trainable=args.trainable)


def _example_input(name: str, shape: list[int], dtype):
    """Random data for one --shape; refused by name when it cannot be held in memory
    (the lowering runs the model on it, and needs more besides)."""
    import math

    import torch

    size = math.prod(shape) * dtype.itemsize
    memory = _physical_memory()
    what = f"--shape {name}={'x'.join(map(str, shape))}: the input takes {human_bytes(size)} ({dtype})"
    if memory is not None and size > memory:
        raise RematIRError(f"{what}, more than this machine's {human_bytes(memory)} of memory; "
                           "give smaller dimensions")
    try:
        return (torch.randn(shape, dtype=dtype) if dtype.is_floating_point
                else torch.zeros(shape, dtype=dtype))
    except (RuntimeError, MemoryError) as exc:  # the allocator's refusal
        raise RematIRError(f"{what}, which cannot be allocated ({str(exc).splitlines()[0]}); "
                           "give smaller dimensions") from None


def _physical_memory() -> int | None:
    """Bytes of memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


#: Schedules `convert` stores with every graph: the two ends solvers are measured against.
REFERENCE_SOLVERS = ("autograd", "recompute-all")


class StatusLine:
    """Progress on stderr: one line rewritten in place on a terminal, lines otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = 0

    def __call__(self, message: str) -> None:
        if self.tty:
            self.stream.write("\r" + message.ljust(self.width))
            self.width = len(message)
        else:
            self.stream.write(message + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def drop_invalid_schedules(graph: Graph, path, output) -> list[str]:
    """Remove from `graph` (read from `path`, to be written to `output` by `solve`) the
    schedules the simulator refuses, and say for each, in the words `validate` uses, that
    it is not copied: `solve` writes only schedules it has checked, as it checks the one
    it adds, and a schedule the simulator refuses could not be run or plotted anyway."""
    from .ir import simulate

    notices, kept = [], []
    for schedule in graph.schedules:
        result = simulate(graph, schedule)
        if result.valid:
            kept.append(schedule)
        else:
            notices.append(f"remat-ir: {path}: schedule {schedule.name!r}: INVALID at "
                           f"{result.violation}; not copied into {output} (`remat-ir validate "
                           f"{path}` checks every schedule)")
    if notices:
        _keep_schedules(graph, kept)
    return notices


def replace_same_named(graph: Graph, schedule, path) -> list[str]:
    """Remove from `graph` the schedules (read from `path`) named as `schedule`, which
    `solve` just added last, and say which: a file holds one schedule per name (`plot
    --schedule NAME` picks it by name), so a second solve with the same solver, or a
    solver that names its schedule like one in the file, replaces that one."""
    earlier = [s for s in list(graph.schedules)[:-1] if s.name == schedule.name]
    notices = [f"remat-ir: replaced the schedule {s.name!r} of {path} (solver "
               f"{s.solver or 'not named'}, "
               + (f"budget {human_bytes(s.budget_bytes)}, " if s.HasField("budget_bytes") else "")
               + f"peak {human_bytes(s.predicted_peak_bytes)}) with the new one" for s in earlier]
    if notices:
        _keep_schedules(graph, [s for s in graph.schedules if s.name != schedule.name] + [schedule])
    return notices


def _keep_schedules(graph: Graph, schedules) -> None:
    """Make `schedules` (messages of `graph`, in this order) its only schedules."""
    from .ir import pb

    copies = [pb.Schedule() for _ in schedules]
    for copy, schedule in zip(copies, schedules):
        copy.CopyFrom(schedule)
    del graph.proto.schedules[:]
    graph.proto.schedules.extend(copies)


def cmd_solve(args) -> int:
    from .ir import save, store_all
    from .solvers import InfeasibleBudget, solve
    from .solvers.offload import describe_link

    graph = load(args.file)
    options = dict(_option(text) for text in args.option)
    check_writable("-o", args.output)
    if args.plot:
        from .plots import require_matplotlib
        check_writable("--plot", args.plot)
        require_matplotlib()
    if args.host_bandwidth:
        describe_link(graph, args.host_bandwidth)
    for notice in drop_invalid_schedules(graph, args.file, args.output):
        print(notice, file=sys.stderr)
    status = StatusLine()
    try:
        schedule = solve(graph, parse_budget_arg(args.budget), args.solver,
                         time_limit_s=args.time_limit, progress=status, offload=args.offload,
                         host_budget=args.host_budget, **options)
    except InfeasibleBudget as exc:
        status.done()
        raise RematIRError(f"budget {args.budget} is infeasible for {args.solver}: {exc}") from None
    status.done()
    replaced = replace_same_named(graph, schedule, args.file)
    for notice in replaced:
        print(notice, file=sys.stderr)
    schedule = graph.schedules[-1]
    print("\n".join(solve_summary(graph, schedule, store_all(graph))))
    path = save(graph, args.output)
    print(f"wrote {path} (schedule {schedule.name!r} {'replaced' if replaced else 'added'}, "
          f"{len(graph.schedules)} in the file)")
    if args.plot:
        from .plots import plot_memory
        print(f"wrote {plot_memory(graph, [store_all(graph), schedule], args.plot)}")
    return 0


def parse_budget_arg(text: str):
    """--budget as the library takes it: a size, a percentage, or 'none'."""
    return None if text.lower() == "none" else text


def _option(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE as a boolean (true/false, any case), int, float or string: a
    solver's switch such as hiremate's `anneal=false` must not arrive as the string
    "false", which Python takes for true."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise RematIRError(f"--option {text!r}: expected KEY=VALUE, e.g. mode=lp")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, value


def cmd_solvers(args) -> int:
    from .solvers import available

    print("\n".join(solvers_lines(available())))
    return 0


def cmd_partition(args) -> int:
    from .ir import save
    from .solvers.partition import partition, store_hierarchy

    graph = load(args.file)
    check_writable("-o", args.output)
    status = StatusLine()
    tree = partition(graph, max_cluster=args.max_cluster, max_top=args.max_top, progress=status)
    status.done()
    store_hierarchy(graph, tree)
    print("\n".join(partition_lines(tree)))
    print(f"wrote {save(graph, args.output)}")
    return 0


def cmd_plot(args) -> int:
    from .ir import store_all
    from .plots import plot_memory, plot_partition

    graph = load(args.file)
    names = [s.name for s in graph.schedules]
    if args.schedule is not None and args.schedule not in names:
        raise RematIRError(f"{args.file} has no schedule {args.schedule!r}; its schedules: "
                           + (", ".join(names) or "none"))
    chosen = [s for s in graph.schedules if s.name == args.schedule] if args.schedule else \
        list(graph.schedules)[-1:]
    reference = store_all(graph)
    schedules = chosen if chosen and chosen[0].name == reference.name else [reference] + chosen
    memory, tree = f"{args.output}-memory.png", f"{args.output}-partition.png"
    check_writable("-o", memory)
    if graph.proto.hierarchy.clusters:
        check_writable("-o", tree)
    try:
        print(f"wrote {plot_memory(graph, schedules, memory)}")
    except InvalidSchedule as exc:
        raise RematIRError(f"{args.file}: {exc}; not plotted (`remat-ir validate {args.file}` "
                           "checks every schedule)") from None
    if graph.proto.hierarchy.clusters:
        print(f"wrote {plot_partition(graph, tree)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remat-ir", description="Rematerialization IR toolkit: plan training in less memory.")
    parser.add_argument("--version", action="version", version=f"remat-ir {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("inspect", help="summarize an IR file (nodes, ops, tensors, schedules)")
    p.add_argument("file", help="IR file (.rir binary or .json)")
    p.add_argument("--top", type=positive_int, default=10, help="how many of the biggest tensors to list")
    p.set_defaults(run=cmd_inspect)
    p = sub.add_parser("validate", help="check structure and replay every schedule in the simulator")
    p.add_argument("file", help="IR file (.rir binary or .json)")
    p.set_defaults(run=cmd_validate)
    p = sub.add_parser("convert", help="lower a model (ONNX file, or PyTorch factory) into an IR "
                                       "file (with the reference schedules)")
    p.add_argument("model", nargs="?", metavar="MODEL.onnx", help="an ONNX model to lower")
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="a function returning (model, example_inputs): a tuple of positional "
                        "inputs, or a dict of keyword inputs")
    p.add_argument("--outputs", metavar="NAME,...",
                   help="PyTorch: the outputs the training step returns, by name or position "
                        "(loss: a Hugging Face model trained on its loss alone); the others are "
                        "planned as intermediates (default: all)")
    p.add_argument("--shape", action="append", default=[], metavar="INPUT=D0xD1",
                   help="ONNX: the shape of each graph input, fixing dynamic dimensions such as "
                        "batch and sequence (repeat for each input); random data of the input's dtype")
    p.add_argument("--trainable", choices=("initializers", "constants"), default="initializers",
                   help="ONNX: which float tensors become parameters: initializers (default), or also "
                        "Constant/ConstantOfShape outputs (weight-stripped graphs)")
    p.add_argument("-o", "--output", required=True, help="IR file to write (.rir, or .json)")
    p.add_argument("--cost-model", choices=("profile", "isolated", "flops"), default="profile",
                   help="profile: time each op inside whole store-everything steps on the inputs' "
                        "device (default); isolated: time each op alone; flops: estimate from "
                        "FLOPs and bytes (coarse, nothing runs)")
    p.set_defaults(run=cmd_convert)
    p = sub.add_parser("solve", help="plan a graph within a memory budget and store the schedule")
    p.add_argument("file", help="IR file (.rir binary or .json)")
    p.add_argument("--budget", default="none",
                   help="activation-memory budget: a size with its unit like 600000B or 2GiB, "
                        "a share of the store-everything peak like 50%%, or none (default)")
    p.add_argument("--solver", default=DEFAULT_SOLVER, help="solver name (see `remat-ir solvers`), "
                                                          "or exec:COMMAND (default: %(default)s)")
    p.add_argument("--time-limit", type=_seconds, default=None, metavar="S",
                   help="planning time limit in seconds (the solver's own default otherwise)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a solver option, e.g. --option mode=lp for checkmate (repeatable)")
    p.add_argument("--offload", action="store_true",
                   help="also move idle activations to host memory and back over the graph's host "
                        "link, where that is cheaper than recomputing them")
    p.add_argument("--host-bandwidth", metavar="RATE",
                   help="the host link to plan offloading with, e.g. 25GB/s (default: the one "
                        "measured when the graph was profiled)")
    p.add_argument("--host-budget", metavar="SIZE", help="host memory the offloaded copies may "
                                                        "take, e.g. 64GiB (default: no limit)")
    p.add_argument("-o", "--output", required=True,
                   help="IR file to write, with the schedule added (replacing one of the same "
                        "name) and without schedules the simulator refuses")
    p.add_argument("--plot", metavar="PNG", help="also plot memory over the steps, against "
                                                 "store-everything (needs matplotlib)")
    p.set_defaults(run=cmd_solve)
    p = sub.add_parser("solvers", help="list the solvers: built-in, plugins, external programs")
    p.set_defaults(run=cmd_solvers)
    p = sub.add_parser("partition", help="group the forward graph into HiRemate's partition tree "
                                         "and store it in the IR")
    p.add_argument("file", help="IR file (.rir binary or .json)")
    p.add_argument("--max-cluster", type=int, default=MAX_CLUSTER, metavar="N",
                   help="most parts (nodes or clusters) in one cluster, M_l (default %(default)s)")
    p.add_argument("--max-top", type=int, default=MAX_TOP, metavar="N",
                   help="most parts at the top, M_t (default %(default)s)")
    p.add_argument("-o", "--output", required=True, help="IR file to write, with the tree")
    p.set_defaults(run=cmd_partition)
    p = sub.add_parser("plot", help="plot memory over a schedule's steps (against store-everything) "
                                    "and the partition tree, as PNG files (needs matplotlib)")
    p.add_argument("file", help="IR file (.rir binary or .json)")
    p.add_argument("--schedule", metavar="NAME", help="schedule to plot (default: the last one)")
    p.add_argument("-o", "--output", required=True, metavar="PREFIX",
                   help="writes PREFIX-memory.png, and PREFIX-partition.png when the file has a tree")
    p.set_defaults(run=cmd_plot)
    return parser


def _negative_values_joined(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`--budget -50%` as `--budget=-50%`: argparse reads a value starting with '-' as an
    option and answered "expected one argument", naming nothing wrong with the value;
    joined, the value's own check says what is (a budget must be positive)."""
    parsers = [parser, *(choice for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                         for choice in action.choices.values())]
    valued = {option for each in parsers for action in each._actions if action.nargs is None
              for option in action.option_strings if option.startswith("--")}
    joined: list[str] = []
    for text in argv:
        if joined and joined[-1] in valued and re.match(r"-[0-9.]", text):
            joined[-1] = f"{joined[-1]}={text}"
        else:
            joined.append(text)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_negative_values_joined(parser, sys.argv[1:] if argv is None else list(argv)))
    try:
        return args.run(args)
    except InvalidGraph as exc:
        print(f"remat-ir: error: {getattr(args, 'file', '')}: invalid graph, "
              f"{len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems[:20]:
            print(f"  - {problem}", file=sys.stderr)
        if len(exc.problems) > 20:
            print(f"  ... and {len(exc.problems) - 20} more", file=sys.stderr)
        return EXIT_USER_ERROR
    except RematIRError as exc:
        print(f"remat-ir: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        # The reader went away (`remat-ir inspect big.rir | head`): stop quietly, as Unix
        # tools do, rather than print a traceback; stdout goes to /dev/null so that the
        # interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
