"""PyTorch runtime: train a module through a scheduled IR graph.

`ScheduledModule(model, graph, schedule)` is an `nn.Module` whose parameters,
buffers and submodules *are* the original model's (the same dictionaries), so
optimizers, `state_dict` keys, `.grad` accumulation, `.to()` and
`train()`/`eval()` behave as on the model itself. In training mode with
gradients enabled, a call runs the schedule's forward segment inside one
`torch.autograd.Function`, and `backward()` runs its backward segment; in
eval mode or under `no_grad` it calls the original model (the graph is a
training step, traced with dropout and batch statistics on).

Buffer updates (BatchNorm running statistics) are copied into the buffers
once, at the end of the forward segment, never on recomputation; a buffer that
backward still reads is snapshotted first so a recomputation sees the value
the forward saw. Device follows the inputs: the graph runs where the user
inputs are, whatever device it was lowered on.
"""

from __future__ import annotations

import json

import torch
from torch.utils import _pytree as pytree

from remat_ir.ir import Graph, RematIRError, pb
from remat_ir.ir.simulator import check

from remat_ir.frontends.torch_types import torch_dtype

from .codegen import UnsupportedOp, generate, resident_order


class RuntimeInputError(RematIRError):
    """Inputs that do not match the graph (count, shape, dtype, device)."""


class _ScheduledStep(torch.autograd.Function):
    """One training step: forward segment in `forward`, backward segment in `backward`."""

    @staticmethod
    def forward(ctx, runner: "_Runner", *resident):
        outputs, updates, saved = runner.forward_fn(resident)
        backward_resident = runner.apply_buffer_updates(resident, updates)
        ctx.runner, ctx.resident, ctx.stash = runner, backward_resident, saved
        read = runner.outputs_read_positions
        ctx.save_for_backward(*(outputs[i] for i in read))
        ctx.mark_non_differentiable(*(o for o, t in zip(outputs, runner.plan.tangents) if t is None))
        # Outputs that get no gradient (logits beside a loss) would otherwise receive a
        # full-size zeros tensor; backward uses a broadcast zero scalar instead.
        ctx.set_materialize_grads(False)
        ctx.output_meta = [(o.shape, o.dtype, o.device) for o in outputs]
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        runner = ctx.runner
        if ctx.resident is None:
            raise RematIRError("backward ran a second time through a remat-ir step: the schedule "
                               "frees what it saved as its backward segment runs, so the graph "
                               "cannot be kept (retain_graph=True); call the module again for "
                               "another backward")
        grad_outputs = [g if g is not None else torch.zeros((), dtype=dtype, device=device).expand(shape)
                        for g, (shape, dtype, device) in zip(grad_outputs, ctx.output_meta)]
        stash, ctx.stash = ctx.stash, []  # the segment empties the list as it takes the tensors
        grads = runner.backward_fn(ctx.resident, stash, ctx.saved_tensors, grad_outputs)
        ctx.resident = None
        return (None, *grads)


class _Runner:
    """The compiled segments for one (graph, schedule, device), and how to feed them."""

    def __init__(self, graph: Graph, schedule: pb.Schedule, device: torch.device):
        self.graph, self.device = graph, device
        self.forward_fn, self.backward_fn, self.plan = generate(graph, schedule, device)
        position = {v: i for i, v in enumerate(self.plan.user_outputs)}
        self.outputs_read_positions = [position[v] for v in self.plan.forward_outputs_read_in_backward]
        slot_of = {e.name: self.plan.resident.index(e.value_id) for e in graph.proto.inputs
                   if e.value_id in self.plan.resident}
        self.buffer_slots = [slot_of[name] for name, _ in self.plan.buffer_updates]
        self.snapshot_slots = {slot_of[name] for name in self.plan.buffers_read_in_backward}

    def apply_buffer_updates(self, resident: tuple, updates: tuple) -> tuple:
        """Copy buffer updates in, once; return the resident tuple backward should see."""
        if not updates:
            return resident
        backward_resident = list(resident)
        for slot in self.snapshot_slots:
            backward_resident[slot] = resident[slot].clone()
        with torch.no_grad():
            for slot, update in zip(self.buffer_slots, updates):
                resident[slot].copy_(update)
        return tuple(backward_resident)


def _traced_attributes(graph: pb.Graph) -> list[tuple[str, str, object]]:
    """(module path, attribute, value) of the plain attributes tracing read (frontend
    metadata "torch.module_attributes")."""
    text = graph.metadata.get("torch.module_attributes")
    return [tuple(entry) for entry in json.loads(text)] if text else []


def _load_spec(graph: pb.Graph, key: str):
    """A pytree spec the frontend stored, or None (then inputs/outputs are taken flat)."""
    text = graph.metadata.get(key)
    if not text:
        return None
    try:
        return pytree.treespec_loads(text)
    except Exception:  # its class is not importable here: fall back to flat outputs
        return None


class ScheduledModule(torch.nn.Module):
    """`model`, trained through `schedule` of its lowered `graph` (see module docstring)."""

    def __init__(self, model: torch.nn.Module, graph: Graph, schedule: pb.Schedule):
        super().__init__()
        check(graph, schedule)  # never run a schedule the simulator rejects
        for shared in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            self.__dict__[shared] = model.__dict__[shared]
        self.__dict__["_model"] = model
        self.__dict__["_graph"] = graph
        self.__dict__["_schedule"] = schedule
        self.__dict__["_runners"] = {}
        self.training = model.training
        g = graph.proto
        self._user_inputs = []  # (flat index, value id) in graph order
        self._bindings = []     # per resident slot: ("param"|"buffer", name), ("input", index) or ("const", value id)
        kinds = {pb.PARAMETER: "param", pb.BUFFER: "buffer"}
        names = {e.value_id: e.name for e in g.inputs}
        for v in resident_order(graph):
            value = graph.value(v)
            if value.kind in kinds:
                self._bindings.append((kinds[value.kind], names[v]))
                self._check_bound(kinds[value.kind], names[v], value)
            elif value.kind == pb.USER_INPUT:
                index = int(names[v].removeprefix("input"))
                self._bindings.append(("input", index))
                self._user_inputs.append((index, v))
            else:
                self._bindings.append(("const", v))
        self.__dict__["_in_spec"] = _load_spec(g, "torch.in_spec")
        self.__dict__["_out_spec"] = _load_spec(g, "torch.out_spec")
        self._lowered_keywords = (list(self._in_spec.child(1).context)
                                  if self._in_spec is not None else [])
        self.__dict__["_constants"] = {}
        self._traced_attributes = _traced_attributes(g)

    # -------------------------------------------------------------- copying and saving

    def __getstate__(self):
        """Picklable state (torch.save, copy.deepcopy): graph and schedule as protobuf bytes;
        compiled segments, constants and input/output specs are rebuilt on first use."""
        state = self.__dict__.copy()
        state["_graph"] = self._graph.proto.SerializeToString()
        state["_schedule"] = self._schedule.SerializeToString()
        for derived in ("_runners", "_constants", "_in_spec", "_out_spec"):
            state.pop(derived, None)
        return state

    def __setstate__(self, state):
        graph, schedule = pb.Graph(), pb.Schedule()
        graph.ParseFromString(state.pop("_graph"))
        schedule.ParseFromString(state.pop("_schedule"))
        self.__dict__.update(state)
        self.__dict__["_graph"], self.__dict__["_schedule"] = Graph(graph), schedule
        self.__dict__["_runners"], self.__dict__["_constants"] = {}, {}
        self.__dict__["_in_spec"] = _load_spec(graph, "torch.in_spec")
        self.__dict__["_out_spec"] = _load_spec(graph, "torch.out_spec")

    def _check_bound(self, kind: str, name: str, value: pb.Value) -> None:
        try:
            tensor = self._model.get_parameter(name) if kind == "param" else self._model.get_buffer(name)
        except AttributeError:
            what = "parameter" if kind == "param" else "buffer"
            raise RuntimeInputError(f"the graph needs {what} {name!r}, which "
                                    f"{type(self._model).__name__} does not have") from None
        if tuple(tensor.shape) != tuple(value.shape) or tensor.dtype != torch_dtype(value.dtype):
            raise RuntimeInputError(f"{name!r} is {tuple(tensor.shape)} {tensor.dtype} in the model but "
                                    f"{tuple(value.shape)} {torch_dtype(value.dtype)} in the graph")

    # -------------------------------------------------------------- running

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def schedule(self) -> pb.Schedule:
        return self._schedule

    def train(self, mode: bool = True):
        self._model.train(mode)
        self.training = mode
        return self

    def runner(self, device: torch.device) -> _Runner:
        """Compiled segments for `device` (compiled on first use there)."""
        if device not in self._runners:
            try:
                self._runners[device] = _Runner(self._graph, self._schedule, device)
            except UnsupportedOp as exc:
                raise RematIRError(str(exc)) from None
        return self._runners[device]

    def _flat_inputs(self, args, kwargs) -> list:
        if self._in_spec is not None and set(kwargs) == set(self._lowered_keywords):
            kwargs = {k: kwargs[k] for k in self._lowered_keywords}  # the order they were lowered in
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if self._in_spec is not None and spec != self._in_spec:
            raise RuntimeInputError(f"the inputs are structured as {spec}, but the graph was lowered "
                                    f"for {self._in_spec}; lower again with these inputs")
        for index, value_id in self._user_inputs:
            value = self._graph.value(value_id)
            if index >= len(leaves) or not isinstance(leaves[index], torch.Tensor):
                raise RuntimeInputError(f"input {index} should be a tensor of shape "
                                        f"{list(value.shape)}; lower again with these inputs")
            t = leaves[index]
            if list(t.shape) != list(value.shape) or t.dtype != torch_dtype(value.dtype):
                raise RuntimeInputError(
                    f"input {index} is {list(t.shape)} {t.dtype}, but the graph was lowered for "
                    f"{list(value.shape)} {torch_dtype(value.dtype)}; shapes are fixed at lowering: "
                    "call remat_ir.remat (or lower) again with inputs of this shape")
        return leaves

    def _resident(self, leaves, device) -> tuple:
        resident = []
        for kind, what in self._bindings:
            if kind == "param":
                t = self._model.get_parameter(what)
            elif kind == "buffer":
                t = self._model.get_buffer(what)
            elif kind == "input":
                t = leaves[what]
            else:
                t = self._constant(what, device)
            if t.device != device:
                raise RuntimeInputError(f"{what if kind != 'const' else self._graph.value(what).name!r} is on {t.device} "
                                        f"but the inputs are on {device}; move the model with .to()")
            resident.append(t)
        return tuple(resident)

    def _constant(self, value_id: int, device) -> torch.Tensor:
        key = (value_id, device)
        if key not in self._constants:
            value = self._graph.value(value_id)
            dtype = torch_dtype(value.dtype)
            if value.constant.raw:
                flat = torch.frombuffer(bytearray(value.constant.raw), dtype=dtype)
            else:  # zero elements: frombuffer refuses an empty buffer
                flat = torch.empty(0, dtype=dtype)
            self._constants[key] = flat.reshape(list(value.shape)).to(device)
        return self._constants[key]

    def _check_attributes(self) -> None:
        """Module attributes the trace read (a flag in `forward`) decide which code was
        lowered: a change since lowering would silently run the old branch."""
        for path, name, lowered in self._traced_attributes:
            try:
                now = getattr(self._model.get_submodule(path), name)
            except AttributeError:
                now = "<missing>"
            if now != lowered or type(now) is not type(lowered):
                where = f"{path}.{name}" if path else name
                raise RuntimeInputError(
                    f"module attribute {where!r} of {type(self._model).__name__} was {lowered!r} "
                    f"when the model was lowered and is {now!r} now; forward read it while "
                    "tracing, so the lowered graph may take another branch: call remat_ir.remat "
                    "(or lower) again after changing it")

    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self._model(*args, **kwargs)
        self._check_attributes()
        leaves = self._flat_inputs(args, kwargs)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else next(self._model.parameters()).device
        runner = self.runner(device)
        outputs = _ScheduledStep.apply(runner, *self._resident(leaves, device))
        if self._out_spec is not None:
            return pytree.tree_unflatten(list(outputs), self._out_spec)
        return outputs[0] if len(outputs) == 1 else outputs
