"""What a step's backward checks of the settings it runs under, against its forward's.

remat-ir's backward segment runs the backward ops the trace recorded and the forward ops
the plan computes again, under the settings of the moment `backward()` is called. Eager's
backward runs its ops under those settings too, but computes nothing again. Two settings
change what the segment computes, and a training loop may change them between a forward
and its backward:

- **autocast**: eager's backward run inside an autocast block has autocast cast its ops
  (a matmul of a region the forward ran with autocast off, `autocast(enabled=False)`
  around a router or a loss head, runs in bfloat16); remat-ir's segments run without
  autocast (the trace holds the forward's casts). Gradients 1.2e-4 off eager's, silently
  (found by a review). Where autocast would cast none of the segment's backward ops (each
  already runs in the dtype autocast picks: a model wholly under autocast), both compute
  the same and the step runs; otherwise it is refused before anything is computed.
- **the CPU kernels' setting** (`torch.backends.mkldnn.flags` around the forward only):
  a convolution computed again in the backward ran under the backward's setting, not the
  forward's (4.7e-9 off, and 1.22x the plan's budget, found by a review). Refused.
- **the float32 precision of the CPU kernels** (`torch.set_float32_matmul_precision`,
  `torch.backends.mkldnn.matmul.fp32_precision` and the other `CPU_PRECISION_SETTINGS`):
  an attention's `q @ k^T` computed again under "highest" where the forward's ran under
  "medium" (bfloat16 inside oneDNN) gave gradients 9.5e-7 off eager's, silently (found by
  a review). Refused, on CPU where the backward computes forward values again. (Off CPU
  the forward's settings are not kept yet: TF32 there is not checked.)
- **flushing denormals** (`torch.set_flush_denormal`): a value computed again in the
  backward with denormals flushed, where eager's forward kept them, gave gradients 1.5e-8
  off eager's, silently (found by a review). Refused, on CPU likewise.
- **the default dtype** (`torch.set_default_dtype`): factory ops (`torch.ones(16)`) and
  ops promoting an integer tensor with a Python float (`torch.arange(16) / 16.0`) give
  the default dtype, so one computed again in the backward gave float32 where the
  forward's gave float16 (gradients 1.1e-2 off eager's, silently) or float64 where it
  gave float32 (a dtype error deep in the backward), found by a review. The forward ran
  under the graph's (a call under another is lowered again: `signatures.py`). Where no
  node the backward may compute gives another dtype under the backward's (found by
  running them on fake tensors, as for autocast), it runs; otherwise it is refused.
"""

from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from remat_ir.ir import Graph, pb
from remat_ir.ir.errors import RematIRError
from remat_ir.torchlib.types import (CPU_PRECISION_SETTINGS, cpu_kernels_flags, cpu_kernels_state, empty_tensor,
                                     resolve_op, torch_dtype)

from .profiling import call_args, output_tensors


def check(graph: Graph, device: torch.device, forward_kernels: tuple | None, casts: dict) -> None:
    """Refuse a backward whose settings make it compute otherwise than eager's would:
    `forward_kernels`, the `cpu_kernels_flags()` the forward ran under (None off CPU, and
    where the backward computes no forward node); `casts`, a memo of `first_cast` per
    autocast dtype and of `first_following_default` per default dtype, kept by the plan."""
    now = cpu_kernels_flags() if forward_kernels is not None else None
    if now is not None and now[:3] != forward_kernels[:3]:
        raise RematIRError(
            f"the CPU kernels' setting changed between this step's forward and its backward "
            f"(now {cpu_kernels_state()}): the plan computes forward values again in the "
            f"backward, which would run under the backward's setting where eager's forward "
            f"ran under the forward's, and it was profiled for one setting: call backward() "
            f"inside the same torch.backends.mkldnn.flags(...) block as the forward, or "
            f"outside both")
    if now is not None and now[3] != forward_kernels[3]:
        raise RematIRError(
            f"torch.set_flush_denormal({now[3]}) was called between this step's forward and its "
            f"backward: the plan computes forward values again in the backward, where "
            f"denormal numbers would be {'flushed to zero' if now[3] else 'kept'} while eager's "
            f"forward {'kept' if now[3] else 'flushed'} them, so the gradients would differ: "
            f"set it before the forward, or after backward()")
    if now is not None and now[-1] != forward_kernels[-1]:
        setting, before, after = next((name, old, new) for name, old, new in
                                      zip(CPU_PRECISION_SETTINGS, forward_kernels[-1], now[-1]) if old != new)
        matmul = "; torch.set_float32_matmul_precision sets it too" if ".matmul." in setting else ""
        raise RematIRError(
            f"{setting} changed between this step's forward and its backward (from "
            f"{before!r} to {after!r}{matmul}): the "
            f"plan computes forward values again in the backward, which would run in the "
            f"backward's precision where eager's forward ran in the forward's, so the "
            f"gradients would differ: change it after backward(), or before the forward")
    _check_default_dtype(graph, device, forward_kernels is not None or device.type != "cpu", casts)
    if not torch.is_autocast_enabled(device.type):
        return
    dtype = torch.get_autocast_dtype(device.type)
    if dtype not in casts:
        casts[dtype] = first_cast(graph, device, dtype)
    node = casts[dtype]
    if node is not None:
        within = ""
        if node.HasField("forward_node_id"):
            forward = graph.node(node.forward_node_id)
            within = f" (in the backward of {forward.op}{f' in {forward.source}' if forward.source else ''})"
        raise RematIRError(
            f"backward() runs inside torch.autocast({device.type!r}, dtype={dtype}): eager's "
            f"backward would then run {node.op}{within} cast by autocast, where remat-ir's runs "
            f"it in the dtypes the forward traced, so the gradients would differ: call "
            f"backward() after the autocast block, as PyTorch recommends (scaler.scale(loss)"
            f".backward() too)")


def first_cast(graph: Graph, device: torch.device, dtype: torch.dtype) -> pb.Node | None:
    """The first backward node whose result autocast (enabled for `device` with `dtype`)
    would give in another dtype than the graph's; None if there is none."""
    return _first_retyped(graph, device, {pb.BACKWARD}, torch.autocast(device.type, dtype=dtype))


def _check_default_dtype(graph: Graph, device: torch.device, forward_too: bool, casts: dict) -> None:
    """Refuse a backward run under another default dtype than the graph was lowered (and
    the forward run) under where a node it may compute gives its result in another dtype
    under it. `forward_too`: whether forward nodes may be computed in it (computed again)."""
    lowered = graph.proto.metadata.get("torch.default_dtype", "torch.float32")
    dtype = torch.get_default_dtype()
    if str(dtype) == lowered:
        return
    key = ("default dtype", dtype, forward_too)
    if key not in casts:
        casts[key] = first_following_default(graph, device, forward_too)
    node = casts[key]
    if node is not None:
        raise RematIRError(
            f"the default dtype is {dtype} in this backward, where this step's forward ran under "
            f"{lowered}: the backward computes {node.op}{f' ({node.source})' if node.source else ''}"
            f"{' again' if node.phase == pb.FORWARD else ''}, whose result takes the default dtype, "
            f"so it would give {dtype} where the forward's gave {lowered} and the gradients would "
            f"differ from eager's: call torch.set_default_dtype after backward(), or before the forward")


def first_following_default(graph: Graph, device: torch.device, forward_too: bool) -> pb.Node | None:
    """The first node (a backward one, or with `forward_too` a forward one) whose result
    has another dtype than the graph's under the default dtype now; None if there is none."""
    phases = {pb.BACKWARD, pb.FORWARD} if forward_too else {pb.BACKWARD}
    return _first_retyped(graph, device, phases, contextlib.nullcontext())


def _first_retyped(graph: Graph, device: torch.device, phases: set, context) -> pb.Node | None:
    """The first node of `phases` whose result has another dtype than the graph's, run on
    fake tensors within `context` (an autocast, or the settings now); an op fake tensors
    cannot run is passed over (its dtype there is unknown). None if there is none."""
    with FakeTensorMode(allow_non_fake_inputs=False), context:
        for node in graph.proto.nodes:
            if node.phase not in phases or not node.outputs:
                continue
            try:
                op = resolve_op(node.op)
                tensors = {v: empty_tensor(graph.value(v), device) for v in node.inputs}
                args, kwargs = call_args(graph, node, tensors, device)
                results = output_tensors(node, op(*args, **kwargs))
            except Exception:   # noqa: BLE001 - an op fake tensors cannot run
                continue
            for value_id, result in zip(node.outputs, results):
                if isinstance(result, torch.Tensor) and result.dtype != torch_dtype(graph.value(value_id).dtype):
                    return node
    return None
