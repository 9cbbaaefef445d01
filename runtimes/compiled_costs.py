"""Node costs for the inductor backend: each compiled region's time shared among its nodes.

Why: a plan run with `backend="inductor"` executes compiled regions (`compiled.py`),
where pointwise chains fuse into one kernel and their intermediates are never
written to memory, while matrix products and convolutions still call the library
kernels eager calls. Priced on op-by-op (eager) times, the planner sees a
recomputed elementwise chain at what it costs unfused and a recomputed matrix
product at its eager time, so it trades them at eager's rates, not at what runs.

How: the store-everything schedule runs on the inductor backend (`timing`, after a
warm-up round that compiles every region), with a tick after each region and after
each step outside regions. A step outside regions keeps the time it measured. A
region's time T is shared among its nodes from their eager times in the same
process: the nodes Inductor leaves to library kernels (`LIBRARY_OPS`: matrix
products, convolutions, attention kernels) keep their eager time, and the rest of T
is shared among the other (fused) nodes in proportion to their eager times. Where T
is less than the library nodes' eager sum (the region's library calls ran faster
than eagerly), every node gets the same share of its eager time. So the
store-everything step is predicted as it ran compiled, and a recomputation costs
what its node cost inside a compiled region: a fused elementwise op its fused share,
a matrix product its full time.

On CUDA a region's host seconds and device seconds (two timelines, `timing.py`) are
shared among its nodes the same way, from their op-by-op host and device seconds.

What this does not see: a recomputed node fuses with its new neighbours, not its
old ones, so its share is the one its region gave it in store-everything; and the
footprint term (`calibration.py`) is not calibrated on compiled steps (0).
"""

from __future__ import annotations

from collections.abc import Mapping

from remat_ir.ir import Graph

#: aten ops (name without namespace and overload) that Inductor runs as library calls
#: (extern kernels), not as generated fused code: their time in a region is taken to be
#: their eager time.
LIBRARY_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
    "_efficient_attention_backward", "_int_mm", "_weight_int8pack_mm",
})


def is_library_op(op: str) -> bool:
    """Whether a node's op ("aten.mm.default") is one Inductor calls a library kernel for."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[0] == "aten" and parts[1] in LIBRARY_OPS


def share_region_times(graph: Graph, regions: list[list[int]], region_seconds: Mapping[int, float],
                       eager_seconds: Mapping[int, float]) -> dict[int, float]:
    """Seconds per node of the timed regions (module docstring): `regions[i]` holds region
    i's node ids, `region_seconds[i]` its measured time, `eager_seconds` every node's
    time run op by op."""
    costs: dict[int, float] = {}
    for index, nodes in enumerate(regions):
        total = region_seconds.get(index)
        if total is None:
            continue
        library = [n for n in nodes if is_library_op(graph.node(n).op)]
        fused = [n for n in nodes if not is_library_op(graph.node(n).op)]
        library_s = sum(eager_seconds.get(n, 0.0) for n in library)
        fused_s = sum(eager_seconds.get(n, 0.0) for n in fused)
        if fused_s > 0 and total >= library_s:
            library_scale, fused_scale = 1.0, (total - library_s) / fused_s
        else:
            library_scale = fused_scale = total / (library_s + fused_s) if library_s + fused_s > 0 else 0.0
        for n in library:
            costs[n] = eager_seconds.get(n, 0.0) * library_scale
        for n in fused:
            costs[n] = eager_seconds.get(n, 0.0) * fused_scale
    return costs
