"""The text reports the `remat-ir` command prints: what they say, not how they are asked for.

`remat_ir.cli` parses arguments and runs commands; everything here builds
lines from a graph, a schedule or a solver's result and prints nothing, so
the wording lives in one place and can be read or reused without argparse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from .ir import pb, simulate
from .ir.dtypes import dtype_name
from .ir.graph import Graph
from .ir.gradient_sums import moved_sum_problem
from .ir.units import human_bytes, human_time


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _kind(value: pb.Value) -> str:
    return pb.ValueKind.Name(value.kind).lower()


def _cost_model_text(model: pb.CostModel) -> str:
    """How the costs were obtained, as `provenance.cost_model` records it."""
    if not model.name:
        return ""
    text = f", cost model {model.name!r}"
    if model.timed_schedule:
        text += (f" (ops timed inside {model.timed_steps} {model.timed_schedule} steps; "
                 f"{human_time(model.step_overhead_s)} per step outside ops)")
    if model.call_overhead_s:
        text += f"; {human_time(model.call_overhead_s)} per call in the runtime outside its segments"
    if model.two_timelines:
        text += "; two timelines: each op's host time (issuing it) and device time (running it)"
    return text + (f"; {model.note}" if model.note else "")


def _host_link_text(link: pb.HostLink) -> str:
    """The host link offloading plans with."""
    return (f"host link ({link.source or 'given'}): {human_bytes(link.bandwidth_bytes_per_s)}/s, "
            f"latency {human_time(link.latency_s)}, "
            + (f"{human_time(link.issue_s)} of host time per transfer, " if link.issue_s else "")
            + ("overlapping compute" if link.overlapped else "on the compute timeline"))


def inspect_lines(graph: Graph, path: str, top: int = 10) -> list[str]:
    """The report `remat-ir inspect` prints."""
    g = graph.proto
    prov = g.provenance
    lines = [f"{path}: graph {g.name!r}, IR format {g.version.major}.{g.version.minor}"
             + (f", from {prov.frontend}" if prov.frontend else "")
             + (f" ({prov.source_model})" if prov.source_model else "")]
    if prov.cost_device:
        lines.append(f"costs measured on {prov.cost_device}" + _cost_model_text(prov.cost_model))
    if prov.host_link.bandwidth_bytes_per_s > 0:
        lines.append(_host_link_text(prov.host_link))
    n_fwd, n_bwd = graph.count_nodes(pb.FORWARD), graph.count_nodes(pb.BACKWARD)
    lines.append(f"nodes: {len(g.nodes)} ({n_fwd} forward, {n_bwd} backward); "
                 f"{sum(1 for n in g.nodes if n.random)} random")
    kinds = Counter(_kind(v) for v in g.values)
    lines.append(f"values: {len(g.values)} (" + ", ".join(f"{c} {k}" for k, c in sorted(kinds.items()))
                 + f") in {len(g.storages)} storages")
    computed = {s for s in (graph.value(v).storage_id for n in g.nodes for v in n.outputs)
                if s not in graph.resident_storage_ids}
    lines.append(f"resident (inputs, parameters, buffers, constants): "
                 f"{human_bytes(graph.resident_bytes())}; computed storages: "
                 f"{human_bytes(sum(graph.storage_bytes(s) for s in computed))} in {len(computed)}")
    time_fwd = sum(n.cost.time_s for n in g.nodes if n.phase == pb.FORWARD)
    time_bwd = sum(n.cost.time_s for n in g.nodes if n.phase == pb.BACKWARD)
    sources = sorted({pb.CostSource.Name(n.cost.source).lower() for n in g.nodes})
    lines.append(f"cost of one pass: forward {human_time(time_fwd)}, backward {human_time(time_bwd)} "
                 f"({', '.join(sources) or 'no costs'})")

    ops = Counter((n.op, n.phase) for n in g.nodes)
    rows = [("op", "forward", "backward")]
    for op in sorted({op for op, _ in ops}, key=lambda o: (-(ops[o, pb.FORWARD] + ops[o, pb.BACKWARD]), o)):
        rows.append((op, str(ops[op, pb.FORWARD]), str(ops[op, pb.BACKWARD])))
    lines += ["ops:"] + _table(rows)

    biggest = sorted(g.values, key=lambda v: (-v.size_bytes, v.id))[:top]
    rows = [("tensor", "kind", "dtype", "shape", "bytes")]
    rows += [(v.name, _kind(v), dtype_name(v.dtype), "x".join(map(str, v.shape)) or "scalar",
              human_bytes(v.size_bytes)) for v in biggest]
    lines += [f"biggest tensors (top {len(biggest)}):"] + _table(rows)

    clusters = g.hierarchy.clusters
    if clusters:
        levels = Counter(c.level for c in clusters)
        lines.append(f"hierarchy: {len(clusters)} clusters, " + ", ".join(
            f"{levels[lv]} at level {lv}" for lv in sorted(levels)))
    if g.schedules:
        rows = [("schedule", "solver", "budget", "steps", "fwd steps", "predicted peak", "predicted time")]
        for s in g.schedules:
            rows.append((s.name, s.solver or "-",
                         human_bytes(s.budget_bytes) if s.HasField("budget_bytes") else "none",
                         str(len(s.steps)), str(s.backward_start),
                         human_bytes(s.predicted_peak_bytes) if s.HasField("predicted_peak_bytes") else "-",
                         human_time(s.predicted_time_s) if s.HasField("predicted_time_s") else "-"))
        lines += ["schedules:"] + _table(rows)
    else:
        lines.append("schedules: none")
    return lines


def prediction_mismatches(schedule: pb.Schedule, result) -> list[str]:
    """Where a schedule's stored predictions disagree with the simulator."""
    problems = []
    if schedule.HasField("predicted_peak_bytes") and schedule.predicted_peak_bytes != result.peak_bytes:
        problems.append(f"predicted peak {schedule.predicted_peak_bytes} bytes but the simulator "
                        f"gives {result.peak_bytes}")
    if schedule.HasField("predicted_time_s") and abs(schedule.predicted_time_s - result.total_time_s) \
            > 1e-9 * max(1.0, abs(result.total_time_s)) + 1e-12:
        problems.append(f"predicted time {schedule.predicted_time_s} s but the simulator gives "
                        f"{result.total_time_s} s")
    return problems


#: Op problems `validate` lists before saying how many more there are.
MAX_SHOWN_PROBLEMS = 10


def _pytorch_op_problems(graph: Graph) -> list[str]:
    """For a graph of PyTorch ops (one of them `aten`'s), what the PyTorch runtime would
    refuse of its ops at the first call (`runtimes/op_checks.py`): an op it does not know,
    one drawing random numbers or writing into an argument on a node not flagged so.
    `validate` said such a file was valid, and the runtime then refused it (or, for the
    flags, before they were checked there, trained silently otherwise than eager)."""
    if not any(node.op.startswith("aten.") for node in graph.proto.nodes):
        return []
    from remat_ir.runtimes.op_checks import op_problems

    return op_problems(graph)


def validate_lines(graph: Graph, path: str) -> tuple[list[str], bool]:
    """The report `remat-ir validate` prints, and whether everything passed."""
    g = graph.proto
    lines = [f"{path}: structure ok ({len(g.nodes)} nodes, {len(g.values)} values, "
             f"{len(g.schedules)} schedules)"]
    ok = True
    problems = _pytorch_op_problems(graph)
    if problems:
        ok = False
        shown = problems[:MAX_SHOWN_PROBLEMS]
        more = len(problems) - len(shown)
        lines += [f"  ops INVALID for the PyTorch runtime: {p}" for p in shown]
        lines += [f"  ... and {more} more op problems"] if more else []
    for s in g.schedules:
        result = simulate(graph, s)
        if not result.valid:
            ok = False
            lines.append(f"  schedule {s.name!r}: INVALID at {result.violation}")
            continue
        if (moved := moved_sum_problem(graph, s)) is not None:
            ok = False
            lines.append(f"  schedule {s.name!r}: INVALID: {moved}")
            continue
        mismatches = prediction_mismatches(s, result)
        ok &= not mismatches
        budget = f" within budget {human_bytes(s.budget_bytes)}" if s.HasField("budget_bytes") else ""
        lines.append(f"  schedule {s.name!r}: {'valid' if not mismatches else 'INCONSISTENT'}{budget}, "
                     f"peak {human_bytes(result.peak_bytes)} at step {result.peak_step}, "
                     f"saved for backward {human_bytes(result.saved_bytes)}, "
                     f"time {human_time(result.total_time_s)}, "
                     f"{result.recomputations} recomputations")
        lines += [f"    {m}" for m in mismatches]
    return lines, ok


def solve_summary(graph: Graph, schedule: pb.Schedule, reference: pb.Schedule) -> list[str]:
    """Peak, time and overhead of a schedule against store-everything."""
    result = simulate(graph, schedule)
    status = pb.SolveStatus.Name(schedule.status).lower()
    peak_share = result.peak_bytes / reference.predicted_peak_bytes if reference.predicted_peak_bytes else 1
    overhead = (result.total_time_s / reference.predicted_time_s - 1) if reference.predicted_time_s else 0
    budget = human_bytes(schedule.budget_bytes) if schedule.HasField("budget_bytes") else "none"
    return [
        f"{schedule.solver}: {status} in {schedule.solve_time_s:.2f} s (budget {budget})",
        f"  peak  {human_bytes(result.peak_bytes)} = {peak_share:.1%} of store-everything "
        f"({human_bytes(reference.predicted_peak_bytes)})",
        f"  time  {human_time(result.total_time_s)} = {overhead:+.1%} versus store-everything "
        f"({human_time(reference.predicted_time_s)}), {result.recomputations} recomputations",
        f"  saved for backward {human_bytes(result.saved_bytes)}",
    ] + ([f"  offloaded {human_bytes(result.transferred_bytes)} over the host link "
          f"({human_time(result.transfer_s)} of transfers, compute waits "
          f"{human_time(result.stall_s)}); host memory {human_bytes(result.host_peak_bytes)}"]
         if result.transferred_bytes else [])


def partition_lines(tree) -> list[str]:
    """What `remat-ir partition` says about the tree it stored (a `solvers.partition` tree)."""
    clusters = tree.clusters()
    levels = Counter(c.level for c in clusters)
    return [f"{len(clusters)} clusters in {tree.rounds} rounds (" + ", ".join(
        f"{levels[lv]} at level {lv}" for lv in sorted(levels)) + f"); "
        f"{len(tree.root.children) + len(tree.root.nodes)} parts at the top; "
        f"{len({c.signature for c in clusters})} distinct"]


def solvers_lines(infos: Iterable) -> list[str]:
    """The table `remat-ir solvers` prints: each solver's name, origin and description
    (`solvers.SolverInfo`s), then how to name an external program."""
    rows = [("solver", "origin", "description")]
    rows += [(info.name, info.origin, info.description) for info in infos]
    rows.append(("exec:COMMAND", "exec", "an external program reading the IR on stdin "
                                         "and writing a schedule (see solvers/README.md)"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return [f"  {r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}".rstrip() for r in rows]
