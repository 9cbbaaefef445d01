"""Plots people would rather see than read: memory over a schedule's steps, and the
partition tree (HiRemate's clusters) over the forward pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from .ir import Graph, RematIRError, check, pb


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RematIRError("plotting needs matplotlib: pip install matplotlib") from None
    return plt


def require_matplotlib() -> None:
    """Say that matplotlib is missing now, before work whose plot could not be drawn."""
    _pyplot()


def _save(fig, path) -> Path:
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise RematIRError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        fig.clf()
        _pyplot().close(fig)
    return path


def plot_memory(graph: Graph, schedules: Sequence[pb.Schedule], path) -> Path:
    """Activation memory during each step of each schedule, with its budget; one PNG.
    A schedule the simulator refuses raises `InvalidSchedule` before anything is drawn:
    its memory up to the broken step would look like a plan that works."""
    results = [check(graph, schedule) for schedule in schedules]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for schedule, result in zip(schedules, results):
        steps = range(len(result.memory_during))
        label = f"{schedule.solver or schedule.name} (peak {result.peak_bytes / 2**20:.2f} MiB)"
        line, = ax.plot(steps, [b / 2**20 for b in result.memory_during], label=label, linewidth=1)
        ax.axvline(schedule.backward_start, color=line.get_color(), linestyle=":", linewidth=0.8)
        if schedule.HasField("budget_bytes"):
            ax.axhline(schedule.budget_bytes / 2**20, color=line.get_color(), linestyle="--",
                       linewidth=0.8)
    ax.set_xlabel("schedule step (dotted: backward starts; dashed: budget)")
    ax.set_ylabel("activation memory (MiB)")
    ax.set_title(f"{graph.name}: memory over one training step")
    ax.legend()
    return _save(fig, path)


def plot_partition(graph: Graph, path) -> Path:
    """The partition tree as an icicle chart: each cluster a bar over the forward
    positions of its nodes, one row per level (root on top); clusters with the same
    signature (solved once) share a colour."""
    hierarchy = graph.proto.hierarchy
    if not hierarchy.clusters:
        raise RematIRError(f"graph {graph.name!r} has no partition tree; run `remat-ir partition` first")
    plt = _pyplot()
    position = {n: i for i, n in enumerate(graph.phase_order(pb.FORWARD))}
    clusters = {c.id: c for c in hierarchy.clusters}

    def forward_positions(c) -> list[int]:
        own = [position[n] for n in c.node_ids if n in position]
        return own + [p for k in c.children for p in forward_positions(clusters[k])]

    colours = plt.get_cmap("tab20")
    counts = Counter(c.signature for c in clusters.values())
    repeated = sorted(sig for sig, k in counts.items() if k > 1)
    top = max(c.level for c in clusters.values())
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.5 * (top + 1)))
    for c in clusters.values():
        spots = forward_positions(c)
        if not spots:
            continue
        lo, hi = min(spots), max(spots) + 1
        ax.barh(c.level, hi - lo, left=lo, height=0.8, alpha=0.8, edgecolor="black", linewidth=0.3,
                color=colours(repeated.index(c.signature) % 20) if c.signature in repeated
                else "lightgrey")
    ax.set_yticks(range(top + 1))
    ax.set_xlabel("forward node position")
    ax.set_ylabel("level")
    ax.set_title(f"{graph.name}: partition tree, {len(clusters)} clusters, {len(counts)} distinct "
                 "(coloured: identical clusters, solved once; grey: unique)")
    return _save(fig, path)
