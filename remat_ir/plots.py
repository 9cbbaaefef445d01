"""Plots people would rather see than read: memory over a schedule's steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .ir import Graph, RematIRError, pb, simulate


def plot_memory(graph: Graph, schedules: Sequence[pb.Schedule], path) -> Path:
    """Activation memory during each step of each schedule, with its budget; one PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RematIRError("plotting needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(9, 4))
    for schedule in schedules:
        result = simulate(graph, schedule)
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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
