"""Runs of a segment compiled by Inductor (`backend="inductor"`).

The eager backend calls every aten op of a segment one by one. With
`backend="inductor"`, codegen cuts each segment into *regions*: runs of compute and
free steps with nothing else between them (no random node, gather, transfer,
gradient yield or timing tick, which stay Python lines around the regions), cut
where Inductor could move a step further from its place than the plan has room for
(`codegen._Runs`). Each region becomes one FX graph,
compiled by Inductor on its first call, so pointwise chains fuse into one kernel and
their intermediates are never materialized. The schedule's decisions survive
compilation because of how a region is cut and called:

- a recomputation is a node of a *later* region than the forward's value (or of
  the backward segment), so no common-subexpression pass can merge the two;
- a value the schedule frees inside a region is dropped from the generated code
  before the call, and the region takes its inputs as one list that the compiled
  function empties (the boxed calling convention, `steal_arg`), so Inductor frees
  each input after its last read; intermediates die at their last use, which is
  no later than the schedule's free;
- every value produced in the region and not freed in it is returned, so it is
  live afterwards exactly as the schedule says, in the strides the graph records for it
  (eager's kernel's, where Inductor's may differ: `in_recorded_layouts`);
- random nodes never enter a region: they run eagerly with the RNG replay of
  `ir.rng`, so every draw is eager's;
- Inductor orders a region's kernels by their dependencies alone, and a fused kernel
  allocates its outputs at its start and frees its inputs at its end: a region may
  hold the plan's memory before it plus everything it allocates, so a step joins a
  region only while that stays within the plan's peak (`codegen._Runs`).

- a step that writes into a value from before its region (buffer reuse's `out=`
  into a dying gradient) is an eager line between regions (`codegen._Runs`): in a
  region Inductor would hold that input to the region's end, to copy the result into
  it, and compute the result into a fresh buffer; so is an op whose Inductor lowering
  holds more than the op eagerly (`EAGER_OPS`).

Plans for this backend are made on a graph in which each pointwise chain Inductor
fuses is one node (`fuse_for_inductor`, `ir.fusion`): it allocates only its result, so
the planner does not pay for intermediates no kernel writes, and it is never split
between regions (a fused node is one step). Its members become ops of the region's FX
graph, where Inductor fuses them.

"""

from __future__ import annotations

import functools
import operator
import sys

import torch
import torch.fx

from remat_ir.ir import Graph
from remat_ir.ir.arguments import TensorRef, decode
from remat_ir.ir.fusion import body_nodes, fuse
from remat_ir.ir.memory import gradient_inputs
from remat_ir.ir.rng import contiguous_strides

from remat_ir.torchlib.types import resolve_op, same_layout, to_torch_argument

from .grad_mode_kernels import GRAD_MODE_OPS

BACKENDS = ("eager", "inductor")

#: Inductor settings for regions, all about memory the plan never priced:
#: - layout optimization would turn convolutions channels-last and copy their inputs
#:   and outputs between layouts (a ResNet step peaked 35% above its plan with it, 2%
#:   below without);
#: - reordering for peak memory moves kernels away from the schedule's order, and
#:   cannot see that most inputs die inside the region (tiny Qwen2 at its smallest
#:   budget: 15% above the plan with it, 3% without);
#: - locality reordering moves producers next to their consumers: with regions spanning
#:   several chains (`codegen._Runs`) the quick GPT-2's 50% plan peaked 17% above the
#:   plan with it, at the plan without;
#: - horizontal fusion (kernels that only share reads, such as the two products of one
#:   gradient with two saved activations) computes both outputs at once while holding
#:   both inputs, where the plan frees the first input before the second product (tiny
#:   GPT-2 plans: up to 5% above the plan with it). Only producers fuse into consumers.
#: And one about exactness: a fused kernel keeps its low-precision intermediates in float32
#: unless told to round each as eager's kernels do (`emulate_precision_casts`): under
#: bfloat16 autocast a plan's gradients were 1.2e-3 (of the largest) off eager's, 0.1
#: under float16 after three steps, and a bfloat16 dropout's output 1.4e-3 off; rounded,
#: the same plans are eager's bits or within 2e-7 (hunt81 F1/F2).
INDUCTOR_OPTIONS = {"layout_optimization": False, "reorder_for_peak_memory": False,
                    "reorder_for_locality": False, "score_fusion_memory_threshold": 2**62,
                    "emulate_precision_casts": True}


#: Ops that run as eager lines between regions, never compiled: Inductor's lowering of
#: them holds more memory than the op does eagerly, which the plan (sizes and workspaces
#: measured eagerly) does not count. Found by compiling each op of the benchmark and zoo
#: graphs alone (CPU, torch 2.13) and measuring both:
#: - max_pool2d_with_indices_backward, channels_last (the quick CNN's stem: grad_input
#:   16x64x64x64): 33,554,432 bytes compiled against 16,777,216 eagerly; Inductor
#:   decomposes it into a contiguous zeroed buffer, int64 indices and values it
#:   scatter-adds, then a copy into the output's layout (the CNN's 50% plan measured 7.4%
#:   above its peak in that region). Contiguous and small inputs measured equal.
#: - the CPU flash-attention backward (tiny U-Net: 10,112 bytes compiled against 8,064
#:   eagerly; why was not looked into).
#: Also those whose kernel must run with grad mode on (`grad_mode_kernels.GRAD_MODE_OPS`:
#: oneDNN's LSTM layer), which a compiled region runs under no_grad: the layer returned
#: no workspace there, and Inductor's wrapper failed on it.
EAGER_OPS = frozenset({
    "aten.max_pool2d_with_indices_backward.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
}) | GRAD_MODE_OPS


def fusable_nodes(graph: Graph) -> set[int]:
    """The nodes Inductor fuses into one kernel with their neighbours (`ir.fusion`): aten
    ops tagged pointwise, with one output, that neither draw random numbers (a fused node
    replays no generator state), write into an input, nor must run exactly once."""
    found = set()
    for node in graph.proto.nodes:
        if node.random or node.mutating or node.non_recomputable or len(node.outputs) != 1:
            continue
        if not node.op.startswith("aten."):
            continue
        try:
            op = resolve_op(node.op)
        except LookupError:
            continue
        if torch.Tag.pointwise in getattr(op, "tags", ()):
            found.add(node.id)
    return found


def fuse_for_inductor(graph: Graph) -> Graph:
    """`graph` with each pointwise chain Inductor fuses as one node (`ir.fusion`), so that
    plans for the inductor backend count the memory its kernels use."""
    return fuse(graph, fusable_nodes(graph))


def check_backend(backend: str) -> str:
    """`backend` if it is one the runtime has, else a ValueError naming the choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
    return backend


class Region:
    """One run of compute steps as an FX graph, compiled by Inductor on first call.

    `inputs`: value ids the run reads that it does not produce, in call order;
    `outputs`: value ids it produces and does not free, in return order; `steps`: the
    schedule's steps it runs, computes and frees, in order: a contiguous run of the
    schedule less the views that run eagerly before it (`codegen._Runs._escaping_views`)."""

    def __init__(self, graph: Graph, node_ids: list[int], inputs: list[int], outputs: list[int],
                 device: torch.device, name: str, steps: list[int]):
        self.node_ids, self.inputs, self.outputs, self.name = node_ids, inputs, outputs, name
        self.steps = steps
        self.module = _graph_module(graph, node_ids, inputs, outputs, device)
        self.ops = sorted({m.op for n in node_ids for m in body_nodes(graph.node(n))})
        #: Positions among its inputs of the outputs' gradients and their views: the inputs
        #: whose layout differs between calls (a loss that reads the output: the traced
        #: strides; one that does not: a broadcast zero). Inductor's code is specialized to
        #: the layouts of its first call: a step that left an output out of its loss after
        #: one that read it failed in the compiled code's stride assertions (a review).
        tangents = {graph.value(v).storage_id for v in gradient_inputs(graph)}
        self._tangents = [i for i, v in enumerate(inputs) if graph.value(v).storage_id in tangents]
        #: Per layout of those gradients (their strides), the compiled function.
        self._compiled: dict[tuple, object] = {}
        #: Per output, its shape and the strides the graph records for it: the eager
        #: kernel's (`frontends/kernel_layouts.py`), which the region must return too
        #: (`in_recorded_layouts`).
        self._recorded = [(list(graph.value(v).shape),
                           list(graph.value(v).stride) or contiguous_strides(list(graph.value(v).shape)))
                          for v in outputs]

    def __call__(self, tensors: list) -> tuple:
        key = tuple(tensors[i].stride() for i in self._tangents)
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled(tensors)
        compiled = self._compile(tensors)
        outputs = compiled(tensors)
        positions = relaid_outputs(outputs, self._recorded)
        self._compiled[key] = (functools.partial(_relaid, compiled, positions, self._recorded) if positions
                               else compiled)
        return in_recorded_layouts(outputs, positions, self._recorded) if positions else outputs

    def _compile(self, tensors: list):
        try:
            return compile_boxed(self.module, tensors)
        except Exception as exc:  # an op Inductor cannot lower: this region runs eagerly
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"remat-ir: Inductor could not compile {self.name} ({len(self.ops)} ops: "
                  f"{', '.join(self.ops[:6])}{', ...' if len(self.ops) > 6 else ''}); it runs "
                  f"eagerly: {type(exc).__name__}: {first_line[:300]}", file=sys.stderr, flush=True)
            return self.eager

    def eager(self, tensors: list) -> tuple:
        """The region op by op (each value freed after its last use, inputs included)."""
        boxed = [list(tensors)]
        tensors.clear()
        return torch.fx.Interpreter(self.module).boxed_run(boxed)


def compile_boxed(module: torch.fx.GraphModule, tensors: list):
    """Inductor's function for `module` (whose one placeholder is the list of its
    inputs), called with that list, which it empties.

    `torch._inductor.compile` accepts such a module too, but then flattens the list with
    pytree at every call (it cannot know the inputs' structure): on the quick CNN the time
    a region call spent outside Inductor's compiled graph fell from 99 to 49 us
    (store-everything, 12 regions) and from 91 to 61 us (a plan, 28 regions) without
    it, 0.6-0.8 ms of a ~30 ms step. Wrapped in the module
    Inductor uses for flattened inputs (`GmWrapper`, here with the identity on the flat
    list), the compiled function takes the list as it is, boxed, as under compiled
    autograd."""
    from torch._dynamo.utils import GmWrapper
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(GmWrapper(module, _as_one_list), list(tensors), config_patches=INDUCTOR_OPTIONS)


def in_recorded_layouts(outputs, positions: list[int], recorded: list):
    """`outputs` of a compiled region with those at `positions` in the strides the graph
    records for them (`recorded`: per output, its shape and strides).

    Why: Inductor lays a region's outputs out as its trace of them does (meta kernels,
    its decompositions), which may differ from the CPU kernel's layout the graph records
    (`frontends/kernel_layouts.py`) and the eager backend gives: `channel_shuffle` of a
    channels-last tensor (channels-last kernel, contiguous compiled), `index_select` and
    `stack` of one (contiguous kernel, channels-last compiled), training BatchNorm without
    running statistics over a transposed input. A dropout after the region (an eager
    line: `ir.rng`) then drew eager's numbers into other positions, as did a loss drawing
    `rand_like` of a model output: outputs 1.41 off and gradients off by 0.47 of the
    largest (channel shuffle then dropout), gradients 0.57 relative (a `rand_like` loss of
    an `index_select`), where the eager backend is bitwise (found by a review).

    How: an output whose strides differ only in dimensions of size 1 is re-viewed in the
    recorded ones (no element moves; a later convolution picks its memory format from
    them); one laid out otherwise is copied into a fresh tensor of the recorded strides,
    and Inductor's dies at once. Overlapping or gapped recorded layouts (views, which run
    before the region where they view its inputs: `codegen._Runs._escaping_views`) are
    left as they are. Which outputs need it is found at the first call of each compiled
    function (`Region.__call__`): Inductor's layouts are fixed for its compiled code, and
    a region without any (every region of the zoo's cnn_batchnorm and straight_through
    plans at half memory) is called as before, with nothing added.

    Memory: a copy holds one output twice, for one copy, at the region's end, which the
    plan does not count; only ops whose compiled layout differs from the kernel's get
    one (those above: a few outputs of a model, where eager's kernel had made its result
    in the layout). Asking Inductor for the recorded strides instead (each output through
    `prims.inductor_force_stride_order`) was tried and left: a region output that later
    steps of the region also read was then computed twice, into its own buffer and the
    forced one (the zoo's straight_through at half memory: 3,212 bytes measured against
    a plan of 2,792, 15% over; 2,764 without)."""
    outputs = outputs if isinstance(outputs, list) else list(outputs)  # Inductor's: a list
    for i in positions:
        shape, strides = recorded[i]
        tensor, outputs[i] = outputs[i], None
        if same_layout(tensor, shape, strides):
            outputs[i] = tensor.as_strided(shape, strides, tensor.storage_offset())
        else:
            outputs[i] = torch.empty_strided(shape, strides, dtype=tensor.dtype,
                                             device=tensor.device).copy_(tensor)
        del tensor
    return tuple(outputs)


def relaid_outputs(outputs, recorded: list) -> list[int]:
    """Positions of the `outputs` of a region that are not in the strides the graph records
    for them (`recorded`), where those are dense (`in_recorded_layouts`)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense

    return [i for i, (tensor, (shape, strides)) in enumerate(zip(outputs, recorded, strict=True))
            if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided
            and list(tensor.shape) == shape and list(tensor.stride()) != strides
            and dense(torch.empty_strided(shape, strides, device="meta"))]


def _relaid(compiled, positions: list[int], recorded: list, tensors: list) -> tuple:
    """A call of the `compiled` region function, with the outputs at `positions` in their
    recorded strides (`in_recorded_layouts`)."""
    return in_recorded_layouts(compiled(tensors), positions, recorded)


def _as_one_list(flat: list) -> tuple:
    """The region module's arguments from the flat inputs: the list itself (`GmWrapper`)."""
    return (flat,)


def output_positions(node, op) -> list[int] | None:
    """Where the node's outputs are in what the op returns: None when the op returns one
    tensor and that is the node's only output, else a position per output."""
    returns = op._schema.returns
    indices = list(node.output_indices)
    if len(returns) == 1 and str(returns[0].type) == "Tensor" and not indices and len(node.outputs) == 1:
        return None
    return indices or list(range(len(node.outputs)))


#: Ops a region's FX graph takes in another form, for Inductor's trace of it. `view`:
#: `reshape`, the same view wherever the strides allow one. Inductor lays a result out as
#: its meta kernel does, which may differ from the kernel's layout the graph records
#: (`frontends/kernel_layouts.py`: `_log_softmax_backward_data` of a transposed gradient,
#: contiguous where its meta kernel keeps the gradient's strides), and the `view` after it
#: failed to compile ("Cannot view a tensor with shape [3, 10, 6] and strides (6, 18, 1)"):
#: the region ran eagerly, on every CTC model (a log-softmax, then `.transpose(0, 1)`).
_AS_COMPILED = {"aten.view.default": torch.ops.aten.reshape.default}


def _graph_module(graph: Graph, node_ids: list[int], inputs: list[int], outputs: list[int],
                  device: torch.device) -> torch.fx.GraphModule:
    """The FX graph of a run: one list placeholder (stolen by the compiled function),
    the ops in schedule order, a tuple of `outputs`."""
    fx = torch.fx.Graph()
    boxed = fx.placeholder("inputs")
    boxed.meta["steal_arg"] = True  # the compiled function empties the list it is given
    env = {v: fx.call_function(operator.getitem, (boxed, i)) for i, v in enumerate(inputs)}

    def tensor(ref: TensorRef):
        return env[ref.value_id]

    for node in (member for n in node_ids for member in body_nodes(graph.node(n))):
        op = _AS_COMPILED.get(node.op) or resolve_op(node.op)
        args = [to_torch_argument(decode(a), tensor, device) for a in node.args]
        kwargs = {kw.name: to_torch_argument(decode(kw.value), tensor, device) for kw in node.kwargs}
        result = fx.call_function(op, tuple(args), kwargs)
        positions = output_positions(node, op)
        if positions is None:
            env[node.outputs[0]] = result
        else:
            for v, index in zip(node.outputs, positions, strict=True):
                env[v] = fx.call_function(operator.getitem, (result, index))
    fx.output(tuple(env[v] for v in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), fx)
