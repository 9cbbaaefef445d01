"""Plans cached on disk, so that another process with the same model and shapes skips
profiling and planning.

Layout under the cache directory (`remat(..., cache_dir=...)` or the environment
variable REMAT_IR_CACHE_DIR):

    <graph key>/graph.rir          the lowered graph with its costs, no schedules
    <graph key>/<plan key>.plan    a schedule of it (pb.Schedule)
    <graph key>/floor-<solver key>.plan   the lowest-peak plan a refusal named

The graph key hashes the trace's structure (`ir.fingerprint`, without anything
profiling measures), the cost model, the device, and the versions of remat-ir,
torch and the IR format: lowering a model traces it (seconds), and the trace
finds its profiled graph here. Because every process then plans on the same
profiled graph, times and memory are the same, and so are plans and the
smallest feasible budget. The plan key adds the budget in bytes, the solver
and its options (the time limit among them).

Nothing read is trusted: a graph whose trace fingerprint is not its key's, or
that does not validate, and a schedule the simulator refuses at its budget, that
moves a running gradient sum (`ir.gradient_sums.moved_sums`: the runtime refuses it),
or planned for another budget than its key's, are reported in one line and planned
again (the entry is overwritten). Files are written to a temporary name and
renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import __version__
from .ir import FORMAT_VERSION, Graph, RematIRError, check, dumps, loads, pb
from .ir.fingerprint import structure_fingerprint
from .ir.gradient_sums import moved_sums

#: The environment variable naming a cache directory when `cache_dir` is not given.
ENVIRONMENT_VARIABLE = "REMAT_IR_CACHE_DIR"
_TRACE_KEY = "remat_ir.trace_fingerprint"


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class PlanCache:
    """One cache directory; `warn(message)` hears about entries that were not trusted."""

    def __init__(self, directory: str | os.PathLike, warn=None):
        self.directory = Path(directory).expanduser()
        self.warn = warn or (lambda message: None)

    @classmethod
    def from_setting(cls, cache_dir, warn=None) -> "PlanCache | None":
        """The cache `cache_dir` names, else REMAT_IR_CACHE_DIR's, else None (no cache);
        `cache_dir=False` turns the environment's off."""
        if cache_dir is False:
            return None
        chosen = cache_dir or os.environ.get(ENVIRONMENT_VARIABLE)
        where = Path(chosen).expanduser() if chosen else None
        if where is not None and where.exists() and not where.is_dir():
            raise ValueError(f"the plan cache {chosen} is a file, not a directory: name a "
                             f"directory (created if missing), or pass cache_dir=False")
        return cls(chosen, warn) if chosen else None

    # -------------------------------------------------------------- keys

    def graph_key(self, trace: Graph, cost_model: str, torch_version: str, backend: str = "eager") -> str:
        """The key of a trace (a graph lowered without costs) profiled with `cost_model` for
        the runtime `backend` (compiled costs differ from op-by-op ones)."""
        return _digest(structure_fingerprint(trace, measured_memory=False), cost_model,
                       trace.proto.provenance.cost_device, torch_version, __version__, FORMAT_VERSION,
                       *(() if backend == "eager" else (backend,)))

    @staticmethod
    def plan_key(budget_bytes: int | None, solver: str, options: dict) -> str:
        return _digest(budget_bytes, solver, sorted((k, repr(v)) for k, v in options.items()))

    @staticmethod
    def floor_key(solver: str, options: dict) -> str:
        return "floor-" + PlanCache.plan_key(None, solver, options)

    # -------------------------------------------------------------- graphs

    def load_graph(self, key: str, trace: Graph) -> Graph | None:
        """The profiled graph stored for `trace` under `key`, or None (absent or untrusted)."""
        path = self.directory / key / "graph.rir"
        if not path.exists():
            return None
        try:
            graph = loads(path.read_bytes())  # parses and validates
        except (RematIRError, OSError, ValueError) as exc:
            self.warn(f"remat-ir: ignoring cache entry {path}: {str(exc).splitlines()[0]}")
            return None
        expected = structure_fingerprint(trace, measured_memory=False)
        stored = graph.proto.metadata.pop(_TRACE_KEY, None)
        if stored != expected or structure_fingerprint(graph, measured_memory=False) != expected:
            self.warn(f"remat-ir: ignoring cache entry {path}: it holds another graph")
            return None
        return graph

    def store_graph(self, key: str, graph: Graph) -> None:
        copy = pb.Graph()
        copy.CopyFrom(graph.proto)
        del copy.schedules[:]
        copy.metadata[_TRACE_KEY] = structure_fingerprint(graph, measured_memory=False)
        self._write(self.directory / key / "graph.rir", dumps(Graph(copy)))

    # -------------------------------------------------------------- schedules

    def load_schedule(self, key: str, name: str, graph: Graph,
                      budget_bytes: int | None = None) -> pb.Schedule | None:
        """Schedule `name` of the graph under `key`, if the simulator accepts it on `graph`
        within its own budget, and that budget is `budget_bytes` where given (the one
        `plan_key` was made of: a plan file copied under another budget's name was taken
        at 1.27x the budget asked, found by a review), else None."""
        path = self.directory / key / f"{name}.plan"
        if not path.exists():
            return None
        schedule = pb.Schedule()
        try:
            schedule.ParseFromString(path.read_bytes())
            check(graph, schedule)
        except Exception as exc:  # a protobuf DecodeError, or a schedule the simulator refuses
            self.warn(f"remat-ir: ignoring cache entry {path}: {str(exc).splitlines()[0] or type(exc).__name__}")
            return None
        if moved_sums(graph, schedule):
            self.warn(f"remat-ir: ignoring cache entry {path}: it moves a running gradient sum "
                      f"(planned by a remat-ir from before 2026-12-02, whose offloading could), "
                      f"which the runtime refuses")
            return None
        if budget_bytes is not None and schedule.budget_bytes != budget_bytes:
            self.warn(f"remat-ir: ignoring cache entry {path}: it was planned for a budget of "
                      f"{schedule.budget_bytes:,} bytes, not this entry's {budget_bytes:,}")
            return None
        return schedule

    def store_schedule(self, key: str, name: str, schedule: pb.Schedule) -> None:
        self._write(self.directory / key / f"{name}.plan", schedule.SerializeToString())

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
