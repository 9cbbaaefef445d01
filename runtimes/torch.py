"""PyTorch runtime: train a module through a scheduled IR graph.

`ScheduledModule(model, graph, schedule)` is an `nn.Module` whose parameters,
buffers and submodules *are* the original model's (the same dictionaries), so
optimizers, `state_dict` keys, `.grad` accumulation, `.to()` and
`train()`/`eval()` behave as on the model itself. In training mode with
gradients enabled, a call runs the schedule's forward segment, and `backward()`
runs its backward segment from a chain of autograd nodes that hand the
gradients over in groups as they become final (`_Step`; FSDP2 units are driven
around the segments: `fsdp.py`); in eval mode or under `no_grad` it calls the
original model (the graph is a training step, traced with dropout and batch
statistics on).

Buffer updates (BatchNorm running statistics) are copied into the buffers
once, at the end of the forward segment, never on recomputation; a buffer that
backward still reads is snapshotted first so a recomputation sees the value
the forward saw. Device follows the inputs: the graph runs where the user
inputs are, whatever device it was lowered on.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import operator
import random
import sys
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat

import torch
import torch.distributed
from torch.utils import _pytree as pytree
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils.hooks import BackwardHook

from remat_ir.ir import Graph, InvalidGraph, RematIRError, pb
from remat_ir.ir.dtypes import numel
from remat_ir.ir.gradient_edges import passes_gradient
from remat_ir.ir.rng import contiguous_strides
from remat_ir.ir.schedules import store_all
from remat_ir.ir.simulator import check
from remat_ir.ir.validation import validate_once
from remat_ir.ir.units import human_bytes

from remat_ir.torchlib.function_modes import user_function_modes
from remat_ir.torchlib.function_state import underlying
from remat_ir.torchlib.generators import generators_kept, restore_step_generators, step_generators
from remat_ir.torchlib.hooks import HookWatch, root_backward_hooks
from remat_ir.torchlib.tensor_classes import changes_torch_functions
from remat_ir.torchlib.member_arguments import view_of_member
from remat_ir.torchlib.output_names import output_names, top_level_selectors
from remat_ir.torchlib import model_structure
from remat_ir.torchlib.parameter_slots import parameter_slot
from remat_ir.torchlib.parametrize_cache import cached_parametrizations
from remat_ir.torchlib.saved_hooks import (INSTEAD, active_pack_hook, allows_mutation_on_saved, hook_name,
                                          is_checkpoint, is_save_on_cpu)
from remat_ir.torchlib.types import (constant_tensor, cpu_kernels_flags, describe_layout, overlaps, overlaps_itself,
                                     same_layout, torch_dtype)
from remat_ir.torchlib.value_guards import ValueGuards, shown
from remat_ir.torchlib.hook_reparametrizations import assign_weights, hook_reparametrizations

from . import autocast_anchors, backward_settings, gradient_routes, output_views, parameter_hooks
from .call_guard import CallGuard
from .compiled import check_backend
from .codegen import GRADIENT_GROUPS, generate, resident_order, segments_without_autocast
from .dtype_errors import mixed_dtypes_message
from .fsdp import FSDPUsageError, StepUnits, Units, check_gathered, fsdp_module_class, is_sharded_class
from .op_checks import UnsupportedOp
from .signatures import (DEFAULT_SDPA, Signature, argument_names, autocast_from_json, containers, flat_leaf,
                         free_keywords, memoised_signature)
from .traced_reads import TracedReads
from .transfers import Transfers

#: How a call that does not match a plan, with no planner to make another, is told to go on.
_LOWER_AGAIN = ("call remat_ir.remat with inputs like these (it lowers and plans each new "
                "signature by itself)")


def _check_call(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Raise eager's TypeError for a call its forward does not take (an unexpected keyword,
    a missing argument): it was met as a new input signature, said "lowering and planning
    again" and then failed inside torch.export (review AH). A model whose pre-hooks may
    change the arguments is left to lowering."""
    if model._forward_pre_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{type(model).__name__}.forward() {exc}") from None
    except ValueError:   # no signature to read (a builtin): left to lowering
        return


def _lower_again(scheduled) -> str:
    """What to do for a call the lowered graph does not match: the module's own advice
    (`lower_again`: an imported ONNX graph is imported again), else `_LOWER_AGAIN`."""
    return getattr(scheduled, "lower_again", None) or _LOWER_AGAIN


class RuntimeInputError(RematIRError):
    """Inputs that do not match the graph (count, shape, dtype, device)."""


class _Step:
    """One call's training step: the forward segment runs when it is made; its backward
    segment (a generator, `codegen`) runs group by group from the autograd nodes
    `_Outputs` and `_Gradients`, each handing a part of a group of gradients to autograd.

    The nodes form a chain that autograd must run in order: `_Outputs` (the user
    outputs' node, so the first the loss's gradient reaches) takes the first group,
    and each `_Gradients` node the next, reached through an empty "token" tensor each
    node returns and the next takes. A group's gradients thus reach the parameters'
    `AccumulateGrad` (and DDP's or FSDP's hooks on it) as soon as the segment has
    them, while the rest of the segment still runs; `torch.autograd.grad` gets them as
    from any node. Tensors that only some outputs reach (a second head) are handed over
    by "anchor" `_Gradients` nodes that only those outputs reach, through `_Output`
    nodes of their own (`gradient_routes`), so that autograd reaches what eager's does.

    Each node claims its part (`claim`); the node that claims last runs the segment to
    its end. Nodes a backward does not run (the anchor of a head the loss leaves out,
    nodes `torch.autograd.grad` does not need) claim nothing."""

    def __init__(self, runner: "_Runner", resident: tuple, sharding: "_Sharding | None" = None):
        self.runner, self.device, self.sharding = runner, runner.device, sharding
        step_units = sharding.step_units if sharding is not None else None
        with torch.no_grad(), segments_without_autocast(runner.device):
            try:
                outputs, updates, saved = runner.forward_fn(resident, step_units)
            except RuntimeError as exc:
                refused = mixed_dtypes_message(runner.graph, runner.plan.forward_source, exc,
                                               runner.plan.regions)
                if refused is None:
                    raise
                raise RuntimeInputError(refused) from None
        if step_units is not None:
            step_units.after_forward()
            # Backward reads, and autograd accumulates into, the parameters as gathered.
            resident = tuple(step_units.objects.get(i, t) for i, t in enumerate(resident))
        self.resident = runner.apply_buffer_updates(resident, updates)
        #: Running statistics the backward recomputes a BatchNorm from, which this step does
        #: not update (an eval-mode BatchNorm): their copy, compared with the live tensor when
        #: the backward starts (`_statistics_written`).
        self.statistics = [(slot, resident[slot]) for slot in runner.compared_slots]
        self.stash, self.outputs = saved, outputs
        # The version of each tensor the backward reads from the caller (an input, a
        # parameter): one written in place before the backward runs is refused there.
        owned = sharding.owned if sharding is not None else set()
        # Its data pointer too: `p.data = new` swaps the storage under the same tensor
        # without a version bump (`set_` bumps it), and eager's backward keeps what it saved of the
        # old values where a recomputation would read the new ones (found by a review:
        # 45% off, silently).
        # An inference tensor (an input computed under `torch.inference_mode()`, features
        # of a frozen encoder) has no version counter: reading it raised from inside this
        # step (review AH); it can be written in place only inside inference mode.
        self.versions = [(slot, self.resident[slot]._version, _data_pointer(self.resident[slot]))
                         for slot in runner.read_in_backward
                         if slot not in owned and self.resident[slot] is resident[slot]
                         and not self.resident[slot].is_inference()]
        #: The CPU kernels' setting the forward ran under, where the backward computes
        #: forward nodes (`backward_settings`).
        self.kernels = cpu_kernels_flags() if self.device.type == "cpu" and runner.forward_in_backward else None
        self.segment = None     # the backward generator, once started
        self.unused: set[int] = set()   # user outputs the loss gave no gradient
        self.yielded = 0        # groups the generator has yielded
        self.finished = False
        self.routes = runner.routes if sharding is None else runner.chain_routes
        #: Node keys (`gradient_routes.Key`) whose part no node has claimed yet; the
        #: parts the segment has yielded and their nodes not yet claimed.
        self.outstanding: set = set()
        self.pending: dict = {}
        #: Weak references to the step's nodes (no cycle through autograd's graph):
        #: per key, per user output returned by a node of its own, and `_Outputs`'.
        self.nodes: dict = {}
        self.output_nodes: dict[int, Callable] = {}
        self.outputs_node: Callable | None = None
        #: User outputs for `_Output` nodes to return, and the gradients those nodes got.
        self.own_outputs: dict[int, torch.Tensor] = {}
        self.tangents: dict[int, torch.Tensor | None] = {}

    def begin(self, outputs, given: dict, claimant) -> None:
        """Start the backward segment; `outputs`: `_Outputs`' ctx (it holds the outputs the
        segment reads), `given`: the gradients its backward got, by output position (none
        where an anchor starts the segment because `_Outputs` does not run); `claimant`:
        the key of the node starting it (None: `_Outputs` hands nothing over). An output
        whose node has not run gets zeros (`unused`): one the loss does not reach."""
        if torch.is_grad_enabled():   # backward(create_graph=True), torch.autograd.grad too
            raise RematIRError(
                "backward with create_graph=True (gradients of gradients: a gradient penalty, "
                "MAML; torch.autograd.functional.jvp and hvp ask for it too) through a remat-ir "
                "step: its backward runs as planned ops outside "
                "autograd, which records no graph of them. Compute such a loss with the original "
                "model (the one passed to remat_ir.remat), whose autograd graph supports it")
        if self.finished or self.segment is not None:
            raise _second_backward()
        parameter_hooks.handing_over(self.hooked_parameters(), self.runner.graph)
        if any(_batched(g) for g in given.values() if g is not None):
            raise RematIRError(
                "a batched backward (torch.autograd.grad(..., is_grads_batched=True), a Jacobian "
                "with vectorize=True) through a remat-ir step: its backward runs planned ops "
                "writing into buffers that vmap does not batch (it failed inside the step "
                "before). Compute it with the original model (the one passed to "
                "remat_ir.remat), or with torch.func.jacrev, which runs it")
        watched, outputs.watched = outputs.watched, None
        for i, alias, version in watched or ():
            if alias._version != version:
                raise self.runner.output_modified(i)
        grads = []
        for i in range(outputs.output_count):
            if i in given or i in self.tangents:
                grads.append(given[i] if i in given else self.tangents[i])
                continue
            if _will_run(self.output_nodes.get(i, self.outputs_node)):
                raise _out_of_order()
            grads.append(None)
        unused = {i for i, g in enumerate(grads) if g is None}
        # None where the loss gave none, for a backward generated so (`absent_gradients`)
        grads = [None if g is None else _as_traced(g, strides)
                 for g, strides in zip(grads, outputs.tangent_strides)]
        for slot, version, pointer in self.versions:
            if self.resident[slot]._version != version:
                raise self._written_since(slot)
            if _data_pointer(self.resident[slot]) != pointer:
                raise self._written_since(slot, replaced=True)
        for slot, live in self.statistics:   # bit for bit, NaN equal to NaN (a diverged run)
            if not torch.allclose(live, self.resident[slot], rtol=0, atol=0, equal_nan=True):
                raise self._statistics_written(slot)
        backward_settings.check(self.runner.graph, self.device, self.kernels, self.runner.backward_casts)
        self.unused = unused
        # A node this backward does not run would never claim its part. (Autograd does not
        # count the root among the nodes it runs where it is the loss's own node.)
        self.outstanding = {key for key in self.outstanding if key == claimant or _will_run(self.nodes[key])}
        stash, self.stash = self.stash, []  # the segment empties the list as it takes the tensors
        step_units = self.sharding.step_units if self.sharding is not None else None
        self.segment = self.runner.backward_for(unused)(self.resident, stash, outputs.saved_tensors,
                                                        grads, step_units)

    def claim(self, key) -> tuple:
        """The gradients node `key` hands to autograd, running the segment up to where it
        yields their group (parts of it other nodes claim are kept for them; parts no node
        claims are dropped: nothing there needs a gradient). The node that claims last
        runs the segment to its end. An anchor whose outputs' node has not run (autograd
        does not need it: `torch.autograd.grad` of a head's parameters) starts it."""
        if self.segment is None and not self.finished and self.outputs_node is not None:
            self.begin(self.outputs_node(), {}, key)
        if key not in self.outstanding or self.segment is None:
            raise _second_backward()
        group = key[1] if key[0] == "chain" else self.routes.anchors[key[1]].group
        if self.sharding is not None:
            self.sharding.reduce_before(group)
        with segments_without_autocast(self.device):
            while key not in self.pending:
                handed = next(self.segment)
                index, self.yielded = self.yielded, self.yielded + 1
                grads = tuple(handed)
                handed.clear()  # only autograd holds them now
                if self.unused:
                    grads = self._unreached_as_none(index, grads)
                for k, entries in self.routes.handers[index]:
                    if k in self.outstanding:
                        self.pending[k] = tuple(grads[e] for e in entries)
                del grads
            grads = self.pending.pop(key)
            self.outstanding.discard(key)
            if not self.outstanding:
                for _ in self.segment:
                    pass
                self.finished, self.segment, self.resident = True, None, None
        return grads

    def hooked_parameters(self) -> list:
        """(label, tensor) of the step's parameters and leaf inputs with gradient hooks
        (`parameter_hooks`)."""
        return [(label, tensor) for slot, label in self.runner.hooked_slots
                if (tensor := self.resident[slot]).is_leaf and (
                    tensor._backward_hooks or getattr(tensor, "_post_accumulate_grad_hooks", None))]

    def _written_since(self, slot: int, replaced: bool = False) -> RematIRError:
        """The error for a tensor of the caller's written in place between this step's
        forward and its backward, which reads it again (to compute a value again, where eager
        may have saved nothing from it): it would compute from the new values. `replaced`:
        its storage was swapped (`.data = `), which moves no version counter."""
        value = self.runner.plan.resident[slot]
        name = next((e.argument_name or e.name for e in self.runner.graph.proto.inputs
                     if e.value_id == value), f"value {value}")
        if replaced:
            return RematIRError(
                f"{name} was given other storage (`.data = ...`) after the forward and "
                f"before the backward, which reads it again (the plan computes values from it "
                f"there), so the backward would compute from the new values where eager's may "
                f"read the old ones or the new ones, by op (a Linear keeps its own copy, an "
                f"elementwise product reads the tensor): assign it after backward(), or pass the "
                f"model a copy")
        if self.runner.graph.value(value).kind == pb.BUFFER:
            # Found by a review: a BatchNorm's (InstanceNorm's, spectral norm's) own
            # training-mode call between an eval-mode call's forward and the backward of both
            # was said as a write of the user's, or of an optimizer in a hook.
            return RematIRError(
                f"buffer {name} was written in place after the forward and before the backward, "
                f"which reads it again (the plan computes values from it there), so the backward "
                f"would compute from the new values: another call of the model in training mode "
                f"writes it (a norm's running statistics, a spectral norm's vectors), or your code "
                f"did. Call backward() before the model's next training-mode call, or write it "
                f"after backward()")
        return RematIRError(f"{name} was written in place after the forward and before the "
                            f"backward, which reads it again (the plan computes values from it "
                            f"there), so the backward would compute from the new values: write "
                            f"it after backward(), or pass the model a copy. A hook of this "
                            f"backward may have written it (an optimizer stepped in a "
                            f"post-accumulate hook) where the loss also reads another call of the "
                            f"model, or uses it outside the model, and gave it its whole gradient "
                            f"before this call's backward ran (this call's loss leaves out what "
                            f"it feeds): step the optimizer after backward() there")

    def _statistics_written(self, slot: int) -> RematIRError:
        """The error for BatchNorm running statistics written between this step's forward
        and its backward, which recomputes an eval-mode BatchNorm from them: a training-mode
        call of the same BatchNorm (eager's or a step's) writes them in place without a
        version bump. Read live, the recomputation took the new statistics, 0.2-0.3 off
        eager's gradients, silently (found by a review)."""
        value = self.runner.plan.resident[slot]
        name = next((e.name for e in self.runner.graph.proto.inputs if e.value_id == value), f"value {value}")
        return RematIRError(f"{name} was written after the forward and before the backward (a call of "
                            f"its BatchNorm in training mode, which writes its statistics in place "
                            f"without a version bump), and this plan's backward computes the "
                            f"BatchNorm again from them, in eval mode: call backward() before the "
                            f"next training-mode call")

    def _unreached_as_none(self, index: int, grads: tuple) -> tuple:
        """None for each gradient of group `index` computed from tangents of unused outputs
        alone: eager's autograd never reaches those parameters (a head whose output the loss
        left out) and leaves their `.grad` None, which optimizers skip; the graph computes
        zeros, which weight decay and momentum would not skip."""
        plan = self.runner.plan
        return tuple(None if g is not None and sources and sources <= self.unused else g
                     for sources, g in zip(plan.gradient_sources[index], grads))


def _will_run(node: Callable | None) -> bool:
    """Whether the running backward will run the node `node` (a weak reference) refers to."""
    ctx = node() if node is not None else None
    return ctx is not None and torch._C._will_engine_execute_node(ctx)


def _out_of_order() -> RematIRError:
    return RematIRError(
        "the backward reached a part of a remat-ir step before the gradient of every output of "
        "the step that the loss uses: the step's backward segment needs them all at once, and "
        "autograd runs the nodes of one device and thread in the order they were made, and "
        "this happens where the loss moves outputs to another device (`out.cpu()`), is built "
        "in another thread than the model's call, or a backward runs inside another: compute "
        "the loss on the outputs' device, in the thread that called the model")


def _batched(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is batched by vmap: torch.func's (FuncTorchBatched) or the one
    `torch.autograd.grad(is_grads_batched=True)` uses (Batched, which `DispatchKey` does
    not name)."""
    return "Batched" in str(torch._C._dispatch_keys(tensor))


def _data_pointer(tensor: torch.Tensor) -> int | None:
    """Where `tensor`'s elements start, or None for a tensor without storage of its own
    (a wrapper subclass) or one whose storage its library swaps with the same values
    (DeepSpeed ZeRO-3 gathers a parameter, `ds_id`, again for the backward):
    `_Step.versions`' check of a swapped storage."""
    if hasattr(tensor, "ds_id"):
        return None
    try:
        return tensor.data_ptr()
    except RuntimeError:
        return None


def _second_backward() -> RematIRError:
    """Said for any second backward through one call's step: `retain_graph=True`, but also
    two losses over outputs of one call backwarded apart (an actor's and a critic's, which
    eager allows where their graphs share no saved tensor) and
    `torch.autograd.functional.jacobian`, which runs one backward per row (found by a
    review: the user had written no `retain_graph`, and was told to call the module again)."""
    return RematIRError("backward ran a second time through one call of a remat-ir module (retain_graph=True, "
                        "two losses over its outputs backwarded one after the other, or "
                        "torch.autograd.functional.jacobian's backward per row): the schedule frees what "
                        "it saved as its backward segment runs, so each call has one backward. Sum the "
                        "losses and call backward once (`(loss_a + loss_b).backward()` leaves each "
                        "parameter the same .grad), call the module again for another backward, or "
                        "compute a Jacobian with torch.func.jacrev (which runs the original model)")


class _Gradients(torch.autograd.Function):
    """A node of the chain, or an anchor (`_Step`): backward hands the part `key` of a
    group to autograd (`tensors`: what it is the gradient of)."""

    @staticmethod
    def forward(ctx, step: _Step, key, token, *tensors):
        ctx.step, ctx.key, ctx.took_token = step, key, token is not None
        step.nodes[key] = weakref.ref(ctx)
        return torch.empty(0, device=step.device)

    @staticmethod
    def backward(ctx, _token_grad):
        grads = ctx.step.claim(ctx.key)
        token = torch.empty(0, device=ctx.step.device) if ctx.took_token else None
        return (None, None, token, *grads)


class _Output(torch.autograd.Function):
    """A user output returned by a node of its own, which takes the token of `_Outputs`
    and of each anchor (`gradient_routes`) that reaches what this output is computed
    from: the loss reaches those anchors only through the outputs it uses. Its backward
    keeps the output's gradient for the segment (`_Step.begin`)."""

    @staticmethod
    def forward(ctx, step: _Step, position: int, token, *anchors):
        ctx.step, ctx.position, ctx.anchors = step, position, len(anchors)
        ctx.set_materialize_grads(False)
        step.output_nodes[position] = weakref.ref(ctx)
        return step.own_outputs.pop(position)

    @staticmethod
    def backward(ctx, grad):
        ctx.step.tangents[ctx.position] = grad
        # Defined (empty) tokens: a node given only undefined gradients runs on the CPU's
        # queue, out of order with the step's device.
        empty = torch.empty(0, device=ctx.step.device)
        return (None, None, empty, *repeat(empty, ctx.anchors))


def _outputs_read_inside(graph: Graph, user_outputs: list[int], tangents: list) -> list[int]:
    """The positions of the user outputs the forward reads too, such that a part of their
    gradient comes from those reads: through readers passing a gradient back
    (`passes_gradient`: not `argmax`, `detach`, `zeros_like`), forward values lead from the
    output to another output the backward is given a gradient for (a loss computed inside
    from returned logits). A read without one (an accuracy from `argmax`, a norm under
    `no_grad` returned as a metric) adds no part: `retain_grad()` there was refused before
    (found by a review)."""
    with_gradient = {v for v, tangent in zip(user_outputs, tangents) if tangent is not None}
    found = []
    for position, value in enumerate(user_outputs):
        todo, seen = [value], {value}
        while todo and position not in found:
            for n in graph.users(todo.pop()):
                node = graph.node(n)
                if node.phase != pb.FORWARD or not passes_gradient(graph, node):
                    continue
                if with_gradient & set(node.outputs):
                    found.append(position)
                    break
                todo += [v for v in node.outputs if v not in seen]
                seen.update(node.outputs)
    return found


def _refuse_watched_outputs_read_inside(read_inside: list) -> None:
    """RematIRError for an output the forward reads too (`_Runner.outputs_read_inside`) on
    which the caller asked for its gradient (`retain_grad()`, a tensor hook): autograd
    hands such a node only the caller's part of the gradient, the part of the forward's
    own readers being added inside the graph's backward. Found by a review: `logits.
    retain_grad()` beside a loss computed in the forward (a Hugging Face model given
    labels) and a Grad-CAM hook on a feature map later layers read saw 0.10 and 0.2 off
    eager's gradient (None for a hidden state), silently. `torch.autograd.grad` taken with
    respect to such an output is not seen here (README, *Hooks*). torch's own hooks (FSDP2's
    pre-backward hook on every output) are not the caller's asking (found by a review)."""
    for i, ref in read_inside:
        output = ref()
        if output is not None and (output.retains_grad or any(
                not getattr(underlying(hook), "__module__", "").startswith("torch.")
                for hook in (getattr(output, "_backward_hooks", None) or {}).values())):
            how = "retain_grad()" if output.retains_grad else "a hook (register_hook)"
            raise RematIRError(
                f"output {i} of the scheduled module has {how}, and the forward reads that output too "
                f"(a loss computed inside the forward from logits, a hidden state the next layer reads): "
                f"remat-ir's backward adds the forward's own part of its gradient inside the graph, so "
                f"the gradient the hook or .grad would see is only the part from outside. Compute what "
                f"reads it outside the forward (call the model without labels and compute the loss "
                f"from the returned logits), or read the gradient of a tensor the forward does not "
                f"read again")


def _unviewed(outputs: tuple, resident: set[int]) -> tuple:
    """`outputs`, each view of a tensor the step made that no other output returns or views
    as a plain alias of it (`_unsafe_view`, as eager's `F.linear` returns its 3-d result):
    autograd refuses an in-place change of a view a Function returned, so `y.mul_(2)` on a
    Linear's 3-d output (a view of the graph's `addmm`) failed with torch's "Output 0 of
    _Outputs is a view" where eager's runs (found by a review). Where the backward reads
    the base (`tanh(h).view(-1)`), a change is still refused: such outputs are watched
    (`_Runner.outputs_watched_positions`), as eager's version counter refuses it."""
    bases = [o._base for o in outputs]
    counts: dict[int, int] = {}
    for base in bases:
        if base is not None:
            counts[id(base)] = counts.get(id(base), 0) + 1
    returned = {id(o) for o in outputs}
    return tuple(_plain_alias(o) if base is not None and counts[id(base)] == 1
                 and id(base) not in resident and id(base) not in returned else o
                 for o, base in zip(outputs, bases))


def _plain_alias(view: torch.Tensor) -> torch.Tensor:
    """An alias of `view` autograd does not take for a view (`_unsafe_view`), with its
    strides: `_unsafe_view` derives those of dimensions of size 1 anew (a permuted batch of
    one came back with batch stride C where eager's is C*H*W, a channel slice `[:, :1]`
    with channel stride H*W where eager's is 1), and eager code after the model chose
    from them (`conv2d` a contiguous result where eager's is channels-last: a dropout
    after drew other masks, gradients 0.09-2.6 off, found by a review)."""
    alias = torch.ops.aten._unsafe_view(view, view.shape)
    if alias.stride() != view.stride():
        alias.as_strided_(view.shape, view.stride(), view.storage_offset())
    return alias


class _Outputs(torch.autograd.Function):
    """The user outputs' node: backward starts the backward segment and hands the first
    group of gradients to autograd."""

    @staticmethod
    def forward(ctx, step: _Step, key, own: tuple, token, *tensors):
        runner = step.runner
        resident = {id(t) for t in step.resident}
        # An output that is a resident tensor (a parameter returned as is) leaves as a view,
        # as autograd returns an input a Function gives back.
        outputs = _unviewed(tuple(o.view_as(o) if id(o) in resident else o for o in step.outputs),
                            resident)
        step.outputs = None
        ctx.step, ctx.key, ctx.took_token = step, key, token is not None
        step.outputs_node = weakref.ref(ctx)
        if key is not None:
            step.nodes[key] = weakref.ref(ctx)
        # Outputs `_Output` nodes return are saved detached: saved as they are, they would
        # hold those nodes, which hold this one (a cycle autograd's graph never frees).
        ctx.save_for_backward(*(outputs[i].detach() if i in own else outputs[i]
                                for i in runner.outputs_read_positions))
        # Each output the backward reads, with its version now: one the caller modifies in
        # place before the backward is refused by name (`_Runner.output_modified`). A
        # detached alias shares the output's version counter and storage (saved anyway).
        ctx.watched = [(i, outputs[i].detach(), outputs[i]._version)
                       for i in runner.outputs_watched_positions]
        ctx.mark_non_differentiable(*(o for i, (o, t) in enumerate(zip(outputs, runner.plan.tangents))
                                      if t is None and i not in runner.aliased and i not in own))
        ctx.aliased = runner.aliased
        ctx.read_inside = [(i, weakref.ref(outputs[i])) for i in runner.outputs_read_inside]
        # Outputs that get no gradient (logits beside a loss) would otherwise receive a
        # full-size zeros tensor; the backward takes None (`absent_gradients`).
        ctx.set_materialize_grads(False)
        ctx.output_count = len(outputs)
        ctx.tangent_strides = runner.tangent_strides
        ctx.positions = [i for i in range(len(outputs)) if i not in own]
        step.own_outputs = {i: outputs[i] for i in own}
        returned = tuple(outputs[i] for i in ctx.positions)
        # A token for the `_Output` nodes: they reach this node, which must run after them.
        return returned + (torch.empty(0, device=step.device),) if own else returned

    @staticmethod
    def backward(ctx, *grad_outputs):
        given = dict(zip(ctx.positions, grad_outputs))
        for i, message in ctx.aliased.items():
            if given.get(i) is not None:
                raise RematIRError(f"{message} (the loss reads it)")
        for outside, inside in ctx.step.runner.view_chains.unordered.values():
            if any(given.get(i) is not None for i in outside) and any(given.get(i) is not None for i in inside):
                said = next((ctx.aliased[i] for i in sorted(outside) if i in ctx.aliased),
                            "the model returns views of a tensor its forward reads after making them")
                raise RematIRError(f"{said} (the loss reads both)")
        _refuse_watched_outputs_read_inside(ctx.read_inside)
        step = ctx.step
        step.begin(ctx, given, ctx.key)
        grads = step.claim(ctx.key) if ctx.key is not None else (None,)
        token = torch.empty(0, device=step.device) if ctx.took_token else None
        return (None, None, None, token, *grads)


#: View ops that take a tensor of any strides (their result is a view of whatever layout
#: they are given): a gradient viewed only through these is read as it arrives. A
#: backward `view` runs as `codegen.view_or_reshape`, eager's `reshape` (a view where the
#: layout allows one, as eager's Linear backward makes of a 3-d gradient: copied instead,
#: a scaled sum's bias gradient came out 2.4e-7 off, found by a review).
_LAYOUT_FREE_VIEWS = frozenset(f"aten.{name}" for name in (
    "t.default", "transpose.int", "permute.default", "expand.default", "slice.Tensor",
    "select.int", "narrow.default", "squeeze.default", "squeeze.dim", "squeeze.dims",
    "unsqueeze.default", "diagonal.default", "alias.default", "detach.default", "unfold.default",
    "split.Tensor", "split_with_sizes.default", "unbind.int", "movedim.int", "view.default",
    "_conj.default"))


def _views_need_traced_strides(graph: Graph, value_id: int) -> bool:
    """Whether a view of `value_id`'s storage, through any chain of views, is made by an
    op that needs the traced strides (`view` of a shape that only they allow, `as_strided`),
    rather than only by `_LAYOUT_FREE_VIEWS`."""
    storage, todo, seen = graph.value(value_id).storage_id, [value_id], set()
    while todo:
        for n in graph.users(todo.pop()):
            node = graph.node(n)
            views = [o for o in node.outputs if graph.value(o).storage_id == storage]
            if views and node.op not in _LAYOUT_FREE_VIEWS:
                return True
            todo.extend(o for o in views if o not in seen)
            seen.update(views)
    return False


def _strides_to_keep(graph: Graph, tangent: int | None, backend: str) -> tuple[int, ...] | None:
    """The strides an output's gradient must be copied to before the backward reads it, or
    None where it is read as it arrives, as eager's backward reads it. Why: a gradient
    laid out otherwise than traced (a plain `out.sum()` on a channels_last output arrives
    contiguous, expanded) and copied to the traced layout sent the kernels reading it down
    their other layout's path, which sums in another order (weight gradients 1e-7 to 3e-7
    off eager's); a Linear head's output transposed by the loss (`ce(logits.t(), ...)`,
    CLIP's symmetric loss) had its bias gradient summed over the copy (1.9e-6 off). Copied
    still: where a view of the gradient needs the traced strides (a `view`) and for
    compiled regions (Inductor's code is specialized to them)."""
    if tangent is None:
        return None
    value = graph.value(tangent)
    viewed = backend != "eager" or _views_need_traced_strides(graph, tangent)
    return _traced_strides(value) if viewed else None


def _as_traced(grad: torch.Tensor, strides: tuple[int, ...] | None) -> torch.Tensor:
    """An output's gradient laid out as the graph's tangent was traced: the backward's
    views assume those strides (the gradient of a transposed output, `nn.MultiheadAttention`'s
    with batch_first, arrives laid out like it, and the graph's `view` of it failed).
    AOTAutograd's own runtime wrapper makes the same copy. Not into a layout that overlaps
    (an output that is `Tensor.unfold(..., step < size)`): a copy there keeps one of the
    gradients of the elements sharing memory (a bias gradient 1.35x off eager's, silently).
    Its reader then gets the gradient as eager's backward does, as it arrives."""
    if strides is None or same_layout(grad, grad.shape, strides) or overlaps(grad.shape, strides):
        return grad
    return torch.empty_strided(grad.shape, strides, dtype=grad.dtype, device=grad.device).copy_(grad)


class _Sharding:
    """The FSDP2 units a step runs through (`fsdp.Units`), and after which gradient
    group each unit is done with: its gradients handed over and its parameters no
    longer read, so that its reduce-scatter can start."""

    def __init__(self, units: Units, owners: list[int | None], runner: "_Runner",
                 step_units: StepUnits):
        self.units, self.step_units = units, step_units
        plan = runner.plan
        group_of = {s: i for i, slots in enumerate(plan.gradient_groups) for s in slots}
        #: Resident slots FSDP gathers (written by its all-gathers between forward and backward).
        self.owned = {slot for slot, unit in enumerate(owners) if unit is not None}
        self.done = [-1] * len(units.units)
        for slot, unit in enumerate(owners):
            if unit is not None:
                self.done[unit] = max(self.done[unit], group_of[slot], plan.last_read_group[slot])
        self.reduced: set[int] = set()

    def reduce_before(self, index: int) -> None:
        """Start the reduce-scatter of every unit done before group `index` (autograd has
        accumulated those groups' gradients: its `AccumulateGrad` nodes run first)."""
        for unit, done in enumerate(self.done):
            if done < index and unit not in self.reduced:
                self.reduced.add(unit)
                self.units.reduce(unit)


def gradient_nodes(output: torch.Tensor) -> list:
    """The autograd nodes that hand a scheduled step's gradient groups over, in the order
    backward runs them (`_Step`), found from `output` (a loss); empty if it does not come
    from a scheduled step. For measuring when gradients leave (a hook on the last node
    fires when the backward segment has ended)."""
    names = ("_OutputsBackward", "_GradientsBackward")
    seen, queue, first = set(), [output.grad_fn], None
    while queue and first is None:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name().endswith(names[0]):
            first = node
        queue.extend(n for n, _ in node.next_functions)
    chain = []
    while first is not None:
        chain.append(first)
        first = next((n for n, _ in first.next_functions
                      if n is not None and n.name().endswith(names[1])), None)
    return chain


def _run_step_failing_as_eager(runner: "_Runner", resident: tuple, model: torch.nn.Module, call_eager) -> tuple:
    """`_run_step`, where its forward raises an error of its own (an index past an
    embedding's rows in this batch; not a remat-ir refusal): the generators put back as
    the step found them, and the model's forward run as it is (`call_eager()`) in its
    place, so that the call raises eager's exception, with eager's effects. Eager's
    forward had updated a BatchNorm's running statistics and drawn its dropout masks
    before the failing op, where the step's forward applies its buffer updates once it
    has run: a training loop that skips a bad batch went on from another state (found
    by a review: running means 0.03 off, and eval outputs after). Where eager runs
    (the step failed where eager does not: remat-ir's fault), its effects are put back
    and the step's error raised."""
    drawn = step_generators(runner.device, python=runner.python_draws > 0)
    try:
        return _run_step(runner, resident)
    except RematIRError:
        raise
    except Exception as failed:   # noqa: BLE001 - the model's own error, raised as eager's
        restore_step_generators(drawn, runner.device)
        buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
        try:
            call_eager()
        except Exception as eager:   # noqa: BLE001
            eager.add_note(f"remat-ir: raised by {type(model).__name__}'s forward, run as it is where this "
                           f"call's planned step raised {type(failed).__name__}")
            raise eager from None
        restore_step_generators(drawn, runner.device)
        with torch.no_grad():
            for buffer, was in buffers:
                buffer.copy_(was)
        raise failed


def _blocks_context(text: str | None) -> tuple | None:
    """`Signature.autocast_blocks` from the graph's metadata ("torch.autocast_blocks", written
    for a forward with autocast blocks of its own), or None."""
    if text is None:
        return None
    recorded = json.loads(text)
    return bool(recorded["nested"]), tuple(recorded["per_reader"])


#: What to do where a module sharded by FSDP2 would plan again, by what was new. A value
#: the forward read may differ on this rank only: rank 0 lowered the model for every rank
#: (found by a review: rank 1 was told to pad its batches, its attribute named as 1.0
#: "when the model was lowered", a value it never held).
_FSDP_ADVICE = {
    "new input signature": ("give every batch the shapes remat_ir.remat planned (drop_last=True in "
                            "the DataLoader, padding='max_length'), or wrap with DDP, which plans new "
                            "shapes"),
    "new input values": ("the batch's values decide a branch or a number of the forward otherwise "
                         "than the batch rank 0 lowered the model with for every rank; give "
                         "remat_ir.remat a batch that decides as every batch does, or wrap with "
                         "DDP, where each rank plans its own"),
    "new value read by forward": ("under torch.distributed rank 0 lowered the model for every "
                                  "rank, so the value is rank 0's at lowering: keep it equal on "
                                  "every rank and between steps, or wrap with DDP, where each rank "
                                  "plans its own")}


#: The graph inputs whose gradient hooks a backward watches, as its messages name them.
_HOOKED = {pb.PARAMETER: "parameter", pb.USER_INPUT: "input"}


def _run_step(runner: "_Runner", resident: tuple, sharding: _Sharding | None = None) -> tuple:
    """Run a training step's forward segment and wire its backward (`_Step`)."""
    for _ in range(runner.python_draws):   # eager's forward draws these (`frontends/python_draws.py`)
        random.random()
    step = _Step(runner, resident, sharding)
    groups, handers = runner.plan.gradient_groups, step.routes.handers
    taking = {key for i, here in enumerate(handers) for key, entries in here
              if any(resident[groups[i][k]].requires_grad for k in entries)}
    if not taking:  # nothing needs a gradient: no backward
        outputs, step.outputs = step.outputs, None
        return tuple(outputs)
    step.outstanding = set(taking)
    # What each slot's gradient is handed to: the tensor, or the block's autocast cast of it.
    receivers = list(step.resident)
    cast_groups = runner.cast_groups if sharding is None else runner.chain_cast_groups
    if cast_groups:
        dtypes = runner.plan.autocast_casts
        slots = [[s for s in group if receivers[s].requires_grad] for group in cast_groups]
        made = autocast_anchors.casts([[(receivers[s], dtypes[s]) for s in group]
                                       for group in slots])
        for group, casts in zip(slots, made):
            for s, cast in zip(group, casts):
                receivers[s] = cast
    if runner.cast_and_read:
        autocast_anchors.warn_if_read_again({runner.graph.proto.inputs[i].name: step.resident[s]
                                             for i, s in runner.cast_and_read})

    def inputs(group: int, entries: tuple) -> list:
        return [receivers[groups[group][k]] for k in entries]

    chain = [(i, key, entries) for i, here in enumerate(handers) for key, entries in here
             if key in taking and key[0] == "chain"]
    first = chain[0] if chain else None
    token, tokens = None, {o: [] for o in step.routes.own_nodes}
    # Made last-first: of the nodes ready together autograd runs the one made last first,
    # so the chain runs in group order, each group's anchors just before its chain node.
    for i in reversed(range(len(groups))):
        for key, entries in handers[i]:
            if key not in taking:
                continue
            if key[0] == "anchor":
                anchor = _Gradients.apply(step, key, None, *inputs(i, entries))
                for o in step.routes.anchors[key[1]].outputs:
                    tokens[o].append(anchor)
            elif (i, key, entries) != first:
                token = _Gradients.apply(step, key, token, *inputs(i, entries))
    own = tuple(o for o in step.routes.own_nodes if tokens[o])
    # With no part of its own to hand over, the outputs' node takes a leaf of its own, so
    # that autograd makes it a node (it starts the segment, holding what that reads).
    made = _Outputs.apply(step, first[1] if first else None, own, token,
                          *(inputs(first[0], first[2]) if first
                            else (torch.empty(0, device=step.device, requires_grad=True),)))
    if own:
        *returned, outputs_token = made
        returned = iter(returned)
        made = tuple(_Output.apply(step, i, outputs_token, *tokens[i]) if i in own else next(returned)
                     for i in range(len(made) - 1 + len(own)))
    taken = output_views.take_again(made, runner.view_chains, runner.device)
    node = step.outputs_node() if taken is not made and step.outputs_node is not None else None
    if node is not None:   # the views the caller gets are watched (hunt62: `h.retain_grad()` saw None)
        node.read_inside = [(i, weakref.ref(taken[i]) if taken[i] is not made[i] else ref)
                            for i, ref in node.read_inside]
    return taken[:len(taken) - runner.hidden_outputs]


def _cast_groups(plan, routes: gradient_routes.Routes) -> list[list[int]]:
    """The slots autocast casts (`SegmentPlan.autocast_casts`), by the gradient group that
    finishes them and the outputs that reach them (`Routes.reach`)."""
    finished = {s: i for i, group in enumerate(plan.gradient_groups) for s in group}
    by: dict[tuple, list[int]] = {}
    for s in plan.autocast_casts:
        by.setdefault((finished[s], tuple(sorted(routes.reach.get(s, ())))), []).append(s)
    return [by[key] for key in sorted(by)]


class _Runner:
    """The compiled segments for one (graph, schedule, device), and how to feed them."""

    def __init__(self, graph: Graph, schedule: pb.Schedule, device: torch.device,
                 gradient_groups: int = GRADIENT_GROUPS, gathered: dict[int, int] | None = None,
                 backend: str = "eager"):
        self.graph, self.device = graph, device
        #: One copy streams and host buffer pool for every segment generated here (`generate`).
        self.transfers = (Transfers(device) if any(s.HasField("offload") for s in schedule.steps)
                          else None)
        self._generate = functools.partial(generate, graph, schedule, device, gradient_groups=gradient_groups,
                                           gathered=gathered, backend=backend, transfers=self.transfers)
        self.forward_fn, self.backward_fn, self.plan = self._generate()
        #: Backward segments for losses that leave outputs out, by those outputs' positions.
        self._backward_without: dict[frozenset[int], object] = {}
        #: Numbers eager's forward draws from Python's generator, known by their range alone.
        self.python_draws = int(json.loads(graph.proto.metadata.get("torch.python_draws", "0")))
        #: Says a notice once per module (`ScheduledModule._tell_once`), set by the call.
        self.tell: Callable[[str, str], None] | None = None
        #: Whether the backward segment computes forward nodes (again, or first there):
        #: they run under the backward's CPU kernels (`backward_settings`).
        forward_nodes = {n.id for n in graph.proto.nodes if n.phase == pb.FORWARD}
        self.forward_in_backward = any(step.WhichOneof("action") == "compute" and step.compute in forward_nodes
                                       for step in schedule.steps[schedule.backward_start:])
        #: `backward_settings.first_cast` per autocast dtype, found at the first backward
        #: run inside an autocast block.
        self.backward_casts: dict = {}
        position = {v: i for i, v in enumerate(self.plan.user_outputs)}
        self.outputs_read_positions = [position[v] for v in self.plan.forward_outputs_read_in_backward]
        #: The user outputs the forward reads too (logits a loss inside the forward reads, a
        #: hidden state the next layer reads): the graph's backward adds their readers' part
        #: of the gradient inside, where autograd does not see it (`_Outputs.backward`).
        self.outputs_read_inside = _outputs_read_inside(graph, self.plan.user_outputs, self.plan.tangents)
        #: The user outputs whose storage the backward reads (`SegmentPlan`): watched.
        self.outputs_watched_positions = [position[v] for v in self.plan.forward_outputs_sharing_read_storage]
        slot_of = {e.name: self.plan.resident.index(e.value_id) for e in graph.proto.inputs
                   if e.value_id in self.plan.resident}
        self.buffer_slots = [slot_of[name] for name, _ in self.plan.buffer_updates]
        #: (resident slot, label) of each parameter and user input, whose gradient hooks a
        #: backward watches (`parameter_hooks`).
        self.hooked_slots = [(slot_of[e.name], f"{_HOOKED[graph.value(e.value_id).kind]} "
                                               f"{e.argument_name or e.name!r}")
                             for e in graph.proto.inputs
                             if e.name in slot_of and graph.value(e.value_id).kind in _HOOKED]
        #: The most elements of a buffer the forward updates (`_Lowered.argument_sharing_written_buffer`).
        self.largest_written_buffer = max((numel(graph.value(self.plan.resident[slot]).shape)
                                           for slot in self.buffer_slots), default=0)
        #: Resident slots the backward segment reads (`_Step.versions` watches them).
        self.read_in_backward = [slot for slot, group in enumerate(self.plan.last_read_group)
                                 if group >= 0]
        #: (graph input index, resident slot) of each tensor autocast casts that the graph
        #: also reads otherwise: its cast back stays in the graph (a second call in one
        #: block is warned about).
        names = set(json.loads(graph.proto.metadata.get("torch.autocast_cast_and_read", "[]")))
        self.cast_and_read = [(i, self.plan.resident.index(e.value_id))
                              for i, e in enumerate(graph.proto.inputs)
                              if e.name in names and e.value_id in self.plan.resident]
        #: Per user output, the strides its tangent must have (None: no tangent, or it is
        #: taken as it arrives: `_strides_to_keep`).
        self.tangent_strides = [_strides_to_keep(graph, t, backend) for t in self.plan.tangents]
        # Outputs that are views of another output (frontend metadata, by flat position in
        # the output names): the graph gives them no gradient path; those not taken again
        # (`output_views`) are refused if a gradient reaches them.
        said = json.loads(graph.proto.metadata.get("torch.aliased_outputs", "{}"))
        names = [o.name.removeprefix("output") for o in graph.proto.outputs
                 if o.role == pb.USER_OUTPUT]
        self.aliased = {i: said[name] for i, name in enumerate(names) if name in said}
        #: The last user outputs are tensors AOTAutograd returns only for views of them to
        #: be taken (`torch.hidden_outputs`): not handed over.
        self.hidden_outputs = int(graph.proto.metadata.get("torch.hidden_outputs", "0"))
        #: Which node hands each gradient over (`gradient_routes`); under FSDP2, the chain.
        differentiable = frozenset(i for i, t in enumerate(self.plan.tangents)
                                   if t is not None and i not in self.aliased)
        planned = (self.plan.gradient_groups, self.plan.gradient_sources, self.plan.without_gradient,
                   differentiable)
        self.routes = gradient_routes.routes(*planned)
        self.chain_routes = gradient_routes.routes(*planned, chain_only=True)
        #: Of the aliased outputs, the views of another output that the runtime takes again
        #: on it; where not in eager's order, on a condition `_Outputs.backward` checks,
        #: which the outputs `_Output` nodes hand over escape.
        bases = json.loads(graph.proto.metadata.get("torch.output_view_bases", "{}"))
        position = {name: i for i, name in enumerate(names)}
        if unknown := sorted(f"{view} -> {base}" for view, base in bases.items()
                             if view in position and str(base) not in position):
            raise InvalidGraph([f"'torch.output_view_bases' takes views on outputs the graph does not "
                                f"return ({', '.join(unknown)}); the torch frontend writes it: lower the "
                                "model again rather than edit it"])
        self.view_chains = output_views.chains(
            graph, self.plan.user_outputs, {i: position[str(bases[name])] for i, name in enumerate(names)
                                            if name in bases},
            frozenset(self.routes.own_nodes) | frozenset(self.chain_routes.own_nodes),
            int(graph.proto.metadata.get("torch.hidden_outputs", "0")))
        #: The slots whose gradient goes to the block's autocast cast of them
        #: (`autocast_anchors`), grouped by the gradient group that finishes them and by
        #: the outputs that reach them (per routes): one autograd node per group casts them
        #: back, and one reached from a head the loss reads ran the hooks of another's
        #: parameters with no gradient (found by a review).
        self.cast_groups = _cast_groups(self.plan, self.routes)
        self.chain_cast_groups = _cast_groups(self.plan, self.chain_routes)
        self.snapshot_slots = {slot_of[name] for name in self.plan.buffers_read_in_backward}
        self.compared_slots = sorted(self.snapshot_slots - set(self.buffer_slots))

    def backward_for(self, unused: set[int]):
        """The backward segment for a loss that gives no gradient to the user outputs
        (positions) in `unused`: the plan's own where it gives one to each that takes one,
        else one generated for that set at its first use (`absent_gradients`)."""
        absent = frozenset(i for i in unused if self.plan.tangents[i] is not None)
        if not absent:
            return self.backward_fn
        if absent not in self._backward_without:
            self._backward_without[absent] = self._generate(absent_outputs=absent)[1]
            said = _unreached_values(self.graph, absent)
            if self.tell is not None and said:
                self.tell("absent_outputs", _absent_outputs_notice(self.graph, self.plan.tangents, said))
        return self._backward_without[absent]

    def output_modified(self, position: int) -> RematIRError:
        """The error for user output `position`, which the backward reads, modified in place
        by the caller after the forward returned it. Eager's backward may never read it
        (`tanh(p)` saves its result, not `p`), so eager trains, and so does store-everything;
        a plan that recomputes from it would compute from the new values, which autograd
        refused with a bare version-counter error naming "output 1 of _Outputs"."""
        name = _user_output_name(self.graph, position)
        return RematIRError(
            f"{name} of the model was modified in place after the forward returned it and "
            f"before the backward: this schedule keeps that output for its backward, which "
            f"computes gradients from it again (eager's backward may not read it), so the "
            f"gradients would come from the modified values. Modify a copy: clone the output "
            f"before the in-place op (`out = out.clone()`), or modify it after backward()")

    def apply_buffer_updates(self, resident: tuple, updates: tuple) -> tuple:
        """Copy buffer updates in, once; return the resident tuple backward should see
        (`snapshot_slots` copied first: `ir.memory.snapshot_buffers`)."""
        if not updates and not self.snapshot_slots:
            return resident
        backward_resident = list(resident)
        for slot in self.snapshot_slots:
            backward_resident[slot] = _snapshot(resident[slot])
        if updates:
            buffers = [resident[slot] for slot in self.buffer_slots]
            for slot, buffer, update in zip(self.buffer_slots, buffers, updates):
                if buffer.shape != update.shape:
                    raise self._resized_buffer(slot, buffer, update)
            with torch.no_grad():
                # One call for all (a ResNet's 29 BatchNorms update 87 buffers: 87 Python calls
                # were 0.1 ms of a 14 ms CPU step); it copies as `copy_` does, dtypes included.
                try:
                    torch._foreach_copy_(buffers, list(updates))
                except RuntimeError:
                    # A lazily conjugated or negated tensor (`z.conj()`, `_neg_view`), which
                    # `_foreach_copy_` refuses before copying anything and `copy_` writes
                    # through as eager's write does (hunt73: torch's error from inside).
                    for buffer, update in zip(buffers, updates):
                        buffer.copy_(update)
        return tuple(backward_resident)

    def _resized_buffer(self, slot: int, buffer: torch.Tensor, update: torch.Tensor) -> RematIRError:
        """A buffer update of another shape than the buffer: an op the trace sized from its
        fake kernel resized the buffer when it ran (a fused per-channel fake-quant sizes
        its scale and zero point at its first call), so the graph's shapes are not what
        runs; `_foreach_copy_` failed with a broadcast error from inside (review AF)."""
        value = self.plan.resident[slot]
        name = next((e.name for e in self.graph.proto.inputs if e.value_id == value), f"value {value}")
        return RematIRError(f"the step updated buffer {name!r} at shape {list(update.shape)} where it "
                            f"has {list(buffer.shape)}, as lowered: an op of the forward resized it "
                            f"when it ran (a first call that sizes it, as a fused per-channel "
                            f"fake-quant does). Run the model once under torch.no_grad() before "
                            f"remat_ir.remat, so that it is lowered at its size (or before the next "
                            f"step, where the model changed after remat: `prepare_qat` mid-training)")


def _flat_position(graph: Graph, position: int) -> int | str:
    """User output `position` (counting tensor outputs) among the flat outputs of the
    frontend's output spec ('output3': 3), or the name the frontend gave it (an ONNX
    output's)."""
    names = [o.name for o in graph.proto.outputs if o.role == pb.USER_OUTPUT]
    name = names[position] if position < len(names) else f"output{position}"
    flat = name.removeprefix("output")
    return int(flat) if flat.isdigit() else name


def _user_output_name(graph: Graph, position: int) -> str:
    """How the model's code names user output `position` (counting tensor outputs):
    'output[1]', "output['logits']" from the frontend's output spec, else 'output 1'."""
    flat = _flat_position(graph, position)
    if isinstance(flat, str):   # a name the frontend gave (an ONNX output's)
        return f"output {flat!r}"
    spec = _load_spec(graph.proto, "torch.out_spec")
    if spec is not None and flat < spec.num_leaves:
        return output_names(spec, spec.num_leaves)[flat]
    return f"output {flat}"


def _unreached_values(graph: Graph, absent: frozenset[int]) -> frozenset[int]:
    """The user outputs in `absent` whose value no other user output returns: a tensor
    returned twice (`return h, h`) gets its gradient at one position, and the loss reached
    it (the notice named the other as unread, and advised leaving it out: found by a
    review)."""
    values = [o.value_id for o in graph.proto.outputs if o.role == pb.USER_OUTPUT]
    reached = {values[i] for i in range(len(values)) if i not in absent}
    return frozenset(i for i in absent if i >= len(values) or values[i] not in reached)


def _absent_outputs_notice(graph: Graph, tangents: list, absent: frozenset[int]) -> str:
    """The notice, said once per module, that outputs the loss gives no gradient are still
    held to the end of the step, and how to let the plan free them: a Hugging Face model
    trained on `.loss` pins its logits, often the step's largest tensor, which
    `remat(..., outputs=["loss"])` would not (`frontends/selected_outputs.py`). Said at
    the first backward without them: another call's loss in the same step may read them
    (two views through one encoder), so the advice is for none reading them (its words
    were for one call alone, found by a review)."""
    left = sorted(absent)
    names = [_user_output_name(graph, i) for i in left]
    size = sum(graph.storage_bytes(graph.value(tangents[i]).storage_id) for i in left)
    spec = _load_spec(graph.proto, "torch.out_spec")
    selectors = top_level_selectors(spec, spec.num_leaves) if spec is not None else None

    def selector(i):   # of user output i: the top-level output's name or position, or None
        flat = _flat_position(graph, i)
        return selectors[flat] if selectors is not None and isinstance(flat, int) and flat < len(selectors) else None
    trained = list(dict.fromkeys(selector(i) for i in range(len(tangents))
                                 if i not in absent and tangents[i] is not None and selector(i) is not None))
    # A selection is of top-level outputs: it helps where one holds only outputs left out.
    freed = any(selector(i) is not None and selector(i) not in trained for i in left)
    them = "it" if len(left) == 1 else "them"
    how = (f"pass remat(..., outputs={trained!r}) and the plan may free or recompute {them}"
           if trained and freed else "return only what the loss reads and the plan may free or recompute the rest")
    return (f"remat-ir: the loss gives no gradient to {', '.join(names)} ({human_bytes(size)}), which "
            f"the step returns, so the plan keeps {them} to the end of every step (the caller may "
            f"hold {them}); if no call's loss reads {them} (a step calling the model twice may "
            f"read it in the other call), {how}")


def _load_spec(graph: pb.Graph, key: str):
    """A pytree spec the frontend stored, or None (then inputs/outputs are taken flat)."""
    text = graph.metadata.get(key)
    if not text:
        return None
    try:
        return pytree.treespec_loads(text)
    except Exception:  # its class is not importable here: fall back to flat outputs
        return None




class _Lowered:
    """One lowered graph and its schedule, for the calls of one input signature: how to
    bind a call's tensors, the model's parameters and the graph's constants to it, and
    its compiled segments per device."""

    def __init__(self, model: torch.nn.Module, graph: Graph, schedule: pb.Schedule):
        for name, given, kind in (("model", model, torch.nn.Module), ("graph", graph, Graph),
                                  ("schedule", schedule, pb.Schedule)):
            if not isinstance(given, kind):
                raise TypeError(f"ScheduledModule's {name} must be a {kind.__module__}."
                                f"{kind.__qualname__}, not {type(given).__name__} (remat_ir.plan "
                                f"returns a schedule of the graph it is given)")
        # A graph built or edited in memory, not read from a file (which `ir.load`
        # validates): a node's argument naming a value not among its inputs ran into a raw
        # `UnboundLocalError` in the generated code (found by a review).
        validate_once(graph)
        check(graph, schedule)  # never run a schedule the simulator rejects
        self.graph, self.schedule = graph, schedule
        g = graph.proto
        #: How the model differs from the one the graph was traced from (a plan made again
        #: from its graph: a copy, a saved module loaded, a file), or None: the records
        #: below are the model's now, so such a plan never runs (`model_structure`).
        recorded = g.metadata.get(model_structure.KEY)
        self.stale = (model_structure.difference(json.loads(recorded), model_structure.structure(model))
                      if recorded is not None else None)
        self.user_inputs = []  # (flat index, value id, argument name) in graph order
        self.bindings = []     # per resident slot: ("param"|"buffer", name), ("input", index) or ("const", value id)
        kinds = {pb.PARAMETER: "param", pb.BUFFER: "buffer"}
        entries = {e.value_id: e for e in g.inputs}
        #: Per resident slot, the strides the graph was traced with (None for constants,
        #: which the runtime makes itself): `resident` checks every bound tensor against them.
        self.strides: list[tuple[int, ...] | None] = []
        #: Per resident slot, its value id.
        self.slot_values = resident_order(graph)
        #: The resident slots a call brings (its inputs) or the runtime makes (constants).
        self.call_slots: list[int] = []
        #: The flat positions of the user inputs the forward writes into in place.
        self.written_inputs: list[int] = []
        updated = {o.name for o in g.outputs if o.role == pb.BUFFER_UPDATE}
        for v in self.slot_values:
            value = graph.value(v)
            self.strides.append(None if value.kind == pb.CONSTANT else _traced_strides(value))
            if value.kind in kinds:
                self.bindings.append((kinds[value.kind], entries[v].name))
                if self.stale is None:
                    _check_bound(model, kinds[value.kind], entries[v].name, value,
                                 written=entries[v].name in updated)
            elif value.kind == pb.USER_INPUT:
                # Where the caller passes it, as the IR says (validated: present and unique).
                entry = entries[v]
                index = entry.user_input_position
                self.bindings.append(("input", index))
                self.user_inputs.append((index, v, entry.argument_name or f"input {index}"))
                if entry.name in updated:
                    self.written_inputs.append(index)
            else:
                self.bindings.append(("const", v))
            if self.bindings[-1][0] in ("input", "const"):
                self.call_slots.append(len(self.bindings) - 1)
        #: Every submodule's class by path when the plan was made: a module swapped since
        #: (an activation, a layer wrapped by an adapter) would not run (`check_modules`).
        self.module_types = tuple((path, type(module)) for path, module in model.named_modules())
        #: Per module path, the names of the submodules, parameters and buffers its module
        #: held: one added since is at a path the class check never looks at, and a forward
        #: that iterates (a ModuleList grown, a parametrization stacked on a weight, found by
        #: a review: the graph without the new layer trained on, 0.72 where eager gives
        #: 0.97) would silently skip it. (One removed is a path gone, or an unbound name.)
        #: Last, the (table, name) of those that held None: a bias, buffer or submodule set
        #: where there was None keeps the count, and the graph without it trained on (found
        #: by a review: a bias added to a head, 0.035 where eager gives 0.315); one set to
        #: None where there was one failed inside the binding.
        self.module_members = tuple((path, tuple(module._modules), tuple(module._parameters),
                                     tuple(module._buffers), model_structure.none_members(module))
                                    for path, module in model.named_modules())
        #: Paths that were one module when the plan was made (a block or a BatchNorm used at
        #: two places): the graph reads its parameters and buffers under the first path
        #: only, so a module given since to another of the paths would silently not be
        #: read (found by a review: 89.99 where eager gives 971.53).
        paths_of: dict[int, list[str]] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            paths_of.setdefault(id(module), []).append(path)
        self.module_aliases = tuple(tuple(paths) for paths in paths_of.values() if len(paths) > 1)
        #: The model's hooks when the plan was made (its graph runs what they computed).
        self.hooks = HookWatch(model)
        #: Per resident slot, the (shape, dtype) the graph was traced with.
        self.traced_meta = [(torch.Size(graph.value(v).shape), torch_dtype(graph.value(v).dtype))
                         for v in self.slot_values]
        #: Per kind ("param", "buffer"), the groups of names that were one tensor at
        #: lowering, or None in a graph from before they were recorded.
        self.tied = {kind: None if key not in g.metadata else [tuple(group) for group in json.loads(g.metadata[key])]
                     for kind, key in (("param", "torch.tied_parameters"), ("buffer", "torch.tied_buffers"))}
        # The parameters that did not require a gradient when the graph was made for them:
        # the graph computes none (inputs: their signature says whether they require one).
        # As the lowering recorded them; a graph from before it did, as the model holds them
        # now (wrong where one was unfrozen since: its call would not train it).
        recorded = g.metadata.get("torch.frozen_parameters")
        self.frozen = (set(json.loads(recorded)) if recorded is not None else
                       {what for kind, what in self.bindings
                        if kind == "param" and not parameter_slot(model, what).requires_grad})
        self.in_spec = _load_spec(g, "torch.in_spec")
        self.out_spec = _load_spec(g, "torch.out_spec")
        #: [module path, attribute] of each tensor the forward stores on a module, returned
        #: after its outputs (`frontends/stored_tensors.py`).
        self.stored_attributes = json.loads(g.metadata.get("torch.stored_attributes", "[]"))
        #: [module path, attribute, value] the forward assigns at a first call's setup
        #: (`frontends/torch.py` `_first_call_setup`): assigned after each call, as eager's
        #: call leaves them.
        self.assigned_after = json.loads(g.metadata.get("torch.assigned_after", "[]"))
        #: Outputs the trace fixed (None, numbers, strings), by flat output position.
        self.constant_outputs = {int(k): v for k, v in
                                 json.loads(g.metadata.get("torch.constant_outputs", "{}")).items()}
        self.member_outputs = {int(k): v for k, v in
                               json.loads(g.metadata.get("torch.member_outputs", "{}")).items()}
        _check_output_counts(g, self.out_spec, self.constant_outputs, self.member_outputs,
                             len(self.stored_attributes))
        self.keywords = list(self.in_spec.child(1).context) if self.in_spec is not None else []
        #: How many positional arguments the graph was lowered for where every argument
        #: was a leaf (`flat_inputs` then takes a call's as they come), else None.
        self.flat_positional = _flat_positional(self.in_spec)
        #: Per user input: (flat index, argument name, shape, dtype) it was lowered for.
        self.user_input_meta = [(index, name, list(graph.value(v).shape), torch_dtype(graph.value(v).dtype))
                                for index, v, name in self.user_inputs]
        self.traced_reads = TracedReads(g)
        self.traced_reads.pin_classes(_Submodules(model).at)
        #: Whether hooks (`torch.nn.utils.weight_norm`, `spectral_norm`, `prune`) assign weights
        #: the step must leave on their modules as eager's call does
        #: (`torchlib.hook_reparametrizations`).
        self.hook_weights = bool(hook_reparametrizations(model))
        #: Decisions the trace made from input values (transformers' attention masks):
        #: made again for every call (`values_differ`).
        self.value_guards = ValueGuards(g.metadata)
        #: The shape each buffer had at lowering, by name (`values_differ`).
        self.buffer_shapes = {e.name: list(graph.value(e.value_id).shape) for e in g.inputs
                              if graph.value(e.value_id).kind == pb.BUFFER}
        #: (flat index, argument, parameter or buffer name) of the inputs that were one of the
        #: model's parameters or buffers at lowering (`values_differ`).
        names = argument_names(self.in_spec) if self.in_spec is not None else []
        self.argument_names = names
        self.input_members = [(names.index(argument), argument, member) for argument, member
                              in json.loads(g.metadata.get("torch.input_members", "[]")) if argument in names]
        #: The resident slots of the model's parameters and buffers, a picker of them from a
        #: call's tensors, their names, and the arguments that were members at lowering
        #: (`member_arguments_differ`).
        self._member_slots = [slot for slot, (kind, _) in enumerate(self.bindings)
                              if kind in ("param", "buffer")]
        self._pick_members = operator.itemgetter(*self._member_slots) if len(self._member_slots) > 1 else None
        self._member_names = [self.bindings[slot][1] for slot in self._member_slots]
        self._recorded_members = frozenset(index for index, _, _ in self.input_members)
        self.signature = self._signature(model.forward)
        #: (signature, decisions, frozen parameters, plain values read, ties, inputs that were
        #: parameters): plans of one signature differ in what they decided from input values,
        #: in which parameters they compute no gradient for, in the model's values the
        #: forward read, in which parameters were one tensor, and in which inputs were one.
        self.key = (self.signature, self.value_guards.key, frozenset(self.frozen), self.traced_reads.key,
                    tuple((kind, None if groups is None else tuple(groups)) for kind, groups in self.tied.items()),
                    tuple(self.input_members))
        self.runners: dict[tuple, _Runner] = {}
        # (units' ids, unit per resident slot, {slot: unit} for the sharded ones)
        self.fsdp_owners: tuple = (None, [], {})
        self.constants: dict[tuple[int, torch.device], torch.Tensor] = {}
        #: The fast check of what every call checks of the model (`call_guard.py`).
        self.guard = CallGuard(self.hooks, self.module_types, self.module_members,
                               self.module_aliases,
                               [("_parameters" if kind == "param" else "_buffers", group)
                                for kind, groups in self.tied.items() for group in groups or ()],
                               self.bindings, self.traced_reads)

    def _signature(self, forward) -> Signature | None:
        """The signature the graph was lowered for (None without the frontend's input spec
        and descriptions: then calls are checked input by input)."""
        g = self.graph.proto
        if self.in_spec is None or "torch.inputs" not in g.metadata:
            return None
        names, described = argument_names(self.in_spec), json.loads(g.metadata["torch.inputs"])
        arguments = tuple(sorted(zip(names, described)))
        device = torch.device(g.provenance.cost_device or "cpu").type
        args, kwargs = pytree.tree_unflatten([0] * self.in_spec.num_leaves, self.in_spec)
        return Signature(arguments, autocast_from_json(g.metadata.get("torch.autocast", "")), device,
                         containers(args, kwargs),
                         g.metadata.get("torch.default_dtype", "torch.float32"),
                         json.loads(g.metadata.get("torch.autocast_cache", "true")),
                         aliases=tuple(tuple(group) for group in
                                       json.loads(g.metadata.get("torch.input_aliases", "[]"))),
                         sdpa=g.metadata.get("torch.sdpa", DEFAULT_SDPA),
                         deterministic=json.loads(g.metadata.get("torch.deterministic", "false")),
                         cpu_kernels=g.metadata.get("torch.cpu_kernels", "") if device == "cpu" else "",
                         keyword_order=free_keywords(forward, kwargs),
                         autocast_blocks=_blocks_context(g.metadata.get("torch.autocast_blocks")))

    def runner(self, device: torch.device, gradient_groups: int = GRADIENT_GROUPS,
               gathered: dict[int, int] | None = None, backend: str = "eager") -> _Runner:
        """Compiled segments for `device` (compiled on first use there), gathering FSDP2
        units where `gathered` (resident slot -> unit) says."""
        key = (device, gradient_groups, tuple(sorted((gathered or {}).items())), backend)
        if key not in self.runners:
            try:
                self.runners[key] = _Runner(self.graph, self.schedule, device, gradient_groups,
                                            gathered, backend)
            except UnsupportedOp as exc:
                raise RematIRError(str(exc)) from None
        return self.runners[key]

    def flat_inputs(self, args, kwargs) -> list:
        """The call's leaves in the order the graph numbers them (keywords as lowered)."""
        leaves = None
        if (self.flat_positional == len(args) and len(kwargs) == len(self.keywords)
                and type(args) is tuple and type(kwargs) is dict):
            # Leaves passed flat, as lowered: the structure is the lowered one (no pytree).
            try:
                leaves = [*args, *(kwargs[k] for k in self.keywords)]
            except KeyError:
                pass
            if leaves is not None and not all(map(flat_leaf, leaves)):
                leaves = None
        if leaves is None:
            if self.in_spec is not None and set(kwargs) == set(self.keywords):
                kwargs = {k: kwargs[k] for k in self.keywords}
            leaves, spec = pytree.tree_flatten((args, kwargs))
            if self.in_spec is not None and spec != self.in_spec:
                raise RuntimeInputError("the inputs are structured otherwise than at lowering; "
                                        "lower again with these inputs")
        for index, name, shape, dtype in self.user_input_meta:
            if index >= len(leaves) or not isinstance(leaves[index], torch.Tensor):
                raise RuntimeInputError(f"{name} should be a tensor of shape "
                                        f"{shape}; lower again with these inputs")
            t = leaves[index]
            if list(t.shape) != shape or t.dtype != dtype:
                raise RuntimeInputError(
                    f"{name} is {list(t.shape)} {t.dtype}, but the graph was lowered for "
                    f"{shape} {dtype}; lower again with inputs of this shape")
        return leaves

    def values_differ(self, args, kwargs, answers: dict, leaves: list | None = None,
                      modules: "_Submodules | None" = None) -> str | None:
        """What a call's input values decide otherwise than the trace decided, said for
        the user (`torchlib.value_guards`), or an input that was one of the model's
        parameters or buffers at lowering and is another tensor now (with `modules`: the
        trace read that one tensor for both, so the graph would compute the model's uses
        of it with the input: a loss of 495.06 against eager's 46.43, silently), or None;
        `answers` memoises within one call, `leaves` are the call's flat inputs where the
        caller has them already."""
        if not self.value_guards.guards and not (self.input_members and modules is not None):
            return None
        leaves = self.flat_inputs(args, kwargs) if leaves is None else leaves
        for index, argument, member in self.input_members if modules is not None else ():
            held = modules.member(member, "_parameters")
            held = held if held is not None else modules.member(member, "_buffers")
            if index >= len(leaves) or leaves[index] is not held:
                return (f"argument {argument} is not the model's {member}, which it was at lowering "
                        f"(the graph reads that one tensor for both)")
        if not self.value_guards.guards:
            return None
        for name in self.value_guards.buffers() if modules is not None else ():
            # One set to None or resized since lowering is a change of the model's, not a
            # decision to make again on it (hunt72: replayed, it raised from inside).
            held, lowered = modules.member(name, "_buffers"), self.buffer_shapes.get(name)
            if not isinstance(held, torch.Tensor) or (lowered is not None and list(held.shape) != lowered):
                now = "None" if held is None else f"of shape {list(held.shape)}"
                return (f"the model's buffer {name}, whose values the forward's decisions read, is {now} "
                        f"now, and was of shape {lowered} when lowered")
        return self.value_guards.mismatch(leaves, lambda: argument_names(self.in_spec), answers,
                                          lambda name: modules.member(name, "_buffers"))

    def argument_sharing_written_buffer(self, runner: "_Runner", leaves: list, resident: tuple) -> str | None:
        """An argument sharing memory with a buffer the forward updates in place (a
        BatchNorm's running statistics), said for the user, or None. Eager's reads through
        the argument see the update; the graph, lowered for a tensor of its own, reads what
        it held before. A view of a member is refused by its `_base` (`member_arguments_differ`);
        `running_mean.detach()` or `.data` has none: 0.087 off eager's output, silently
        (found by a review). Only arguments no larger than the largest such buffer are
        compared (a batch of images never is): a ResNet updates 87 buffers."""
        largest = runner.largest_written_buffer
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or leaf.numel() > largest or leaf.numel() == 0:
                continue
            storage = leaf.untyped_storage().data_ptr()
            for slot in runner.buffer_slots:
                buffer = resident[slot]
                if buffer is not leaf and buffer.untyped_storage().data_ptr() == storage and _bytes_meet(leaf, buffer):
                    name = self.argument_names[index] if index < len(self.argument_names) else f"argument {index}"
                    return (f"argument {name} shares memory with the model's buffer {self.bindings[slot][1]}, "
                            f"which the forward updates in place (eager's reads of the argument see the "
                            f"update, the graph's read it as a tensor of its own): pass the buffer "
                            f"itself, read it inside the forward, or pass a copy (`.clone()`)")
        return None

    def written_argument_overlapping(self, leaves: list) -> str | None:
        """An argument the forward writes in place whose elements share memory, said for
        the user (`overlapping_write`), or None."""
        for written in self.written_inputs:
            target = leaves[written] if written < len(leaves) else None
            if isinstance(target, torch.Tensor) and overlaps_itself(target):
                name = self.argument_names[written] if written < len(self.argument_names) else f"input {written}"
                return overlapping_write(f"argument {name}", "pass a copy (`x.clone()`)")
        return None

    def written_argument_shared(self, leaves: list) -> str | None:
        """Two arguments of a call sharing memory where the forward writes into one in place,
        said for the user, or None. Eager's reads through the other see the write; the
        graph, lowered for separate tensors, reads what it held before (found by a review:
        `model(x, x[:3])` with `x.mul_(2)` in the forward, outputs 1.14 off, silently)."""
        for written in self.written_inputs:
            target = leaves[written] if written < len(leaves) else None
            if not isinstance(target, torch.Tensor) or target.untyped_storage().nbytes() == 0:
                continue
            storage = target.untyped_storage().data_ptr()
            for index, leaf in enumerate(leaves):
                if index != written and isinstance(leaf, torch.Tensor) and \
                        leaf.untyped_storage().data_ptr() == storage and _bytes_meet(target, leaf):
                    one, other = (self.argument_names[i] if i < len(self.argument_names) else f"input {i}"
                                  for i in (written, index))
                    return (f"arguments {one} and {other} share memory (one is a view of the other, "
                            f"or the same tensor), and the forward writes into {one} in place: eager's "
                            f"reads of {other} see the write where the two overlap, the graph, lowered "
                            f"for separate tensors, does not. Pass separate tensors (clone one)")
        return None

    def member_arguments_differ(self, leaves: list, tensors: tuple) -> str | None:
        """An argument of this call that is one of the model's parameters or buffers
        (`tensors`: the model's, per resident slot) where the plan was lowered with another
        tensor there, said for the user, or None (`torchlib/member_arguments.py`: the graph
        reads the two apart); raises RuntimeInputError for an argument viewing one."""
        # By identity against the members' tuple, argument by argument (one or two): a table
        # of the members' ids built at every call cost 47 us on the quick ResNet.
        members = tuple(tensors[slot] for slot in self._member_slots) if len(self._member_slots) < 2 \
            else self._pick_members(tensors)
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                continue
            base = leaf._base
            if base is not None and any(map(operator.is_, repeat(base), members)):
                raise RuntimeInputError(view_of_member([(self.argument_names[index], leaf)],
                                                       {id(base): self._member_name(members, base)}))
            if index not in self._recorded_members and any(map(operator.is_, repeat(leaf), members)):
                return (f"argument {self.argument_names[index]} is the model's "
                        f"{self._member_name(members, leaf)}, which it was not at lowering (the graph "
                        f"reads them as two tensors)")
        return None

    def _member_name(self, members: tuple, tensor: torch.Tensor) -> str:
        return self._member_names[next(i for i, m in enumerate(members) if m is tensor)]

    def model_members(self, modules: "_Submodules") -> tuple:
        """The model's parameters and buffers per resident slot (None elsewhere)."""
        return tuple(modules.member(what, "_parameters" if kind == "param" else "_buffers")
                     if kind == "param" or kind == "buffer" else None for kind, what in self.bindings)

    def tied_difference(self, modules: "_Submodules") -> tuple[str, str] | None:
        """("untied parameters", "tied buffers", ...: what changed, said for the user), or
        None. Untied: parameters (or buffers) that were one tensor at lowering (an
        embedding tied to the output head) and are not now; the graph reads the tensor
        under one name for all, so one would silently not be read nor trained (nor
        updated). Tied: ones that were apart at lowering and are one tensor now; the graph
        reads each apart: it hands each parameter its gradient whole, which autograd sums
        in another order than eager's engine adds the readers' parts (1.1e-7 relative off
        eager's where the loss also reads the weight), and it updates each buffer apart,
        where eager's second update reads the first (two BatchNorms given one running
        mean: 0.06 off). Lowered again, the graph sees the tie."""
        def listed(names) -> str:
            return ", ".join(repr(name) for name in names[:-1]) + f" and {names[-1]!r}"

        for kind, slot, word in (("param", "_parameters", "parameters"), ("buffer", "_buffers", "buffers")):
            groups = self.tied[kind]
            for group in groups or ():
                tensors = {id(modules.member(name, slot)) for name in group}
                if len(tensors) > 1:
                    return f"untied {word}", (f"{word} {listed(group)} were one tensor (tied) when "
                                              f"the model was lowered and are {len(tensors)} now")
            if groups is None:   # a graph from before ties were recorded: none to compare
                continue
            names_of: dict[int, list[str]] = {}
            for bound, what in self.bindings:
                tensor = modules.member(what, slot) if bound == kind else None
                # A frozen parameter gets no gradient, and the graph reads its values only.
                if tensor is not None and (kind == "buffer" or tensor.requires_grad):
                    names_of.setdefault(id(tensor), []).append(what)
            for names in names_of.values():
                if len(names) > 1 and not any(set(names) <= set(group) for group in groups):
                    return f"tied {word}", (f"{word} {listed(names)} are one tensor (tied) now "
                                            f"and were {len(names)} when the model was lowered")
        return None

    def trainable_difference(self, modules: "_Submodules") -> str | None:
        """How the graph's parameters that require a gradient now differ from those that
        did at lowering (layers frozen or unfrozen since: gradual unfreezing, a GAN's
        discriminator frozen for the generator's step), said for the user, or None. A plan
        for another set would compute gradients that autograd drops (memory and time a
        plan for this set does not spend), or none where one is needed."""
        unfrozen, frozen, seen = [], [], set()
        for kind, what in self.bindings:
            if kind != "param":
                continue
            t = modules.member(what, "_parameters")
            if t is not None and t.requires_grad == (what in self.frozen) and id(t) not in seen:
                seen.add(id(t))  # a tied weight is named once
                (unfrozen if t.requires_grad else frozen).append(what)
        if not (unfrozen or frozen):
            return None
        return "; ".join(_parameters_text(names, phrase) for names, phrase in (
            (unfrozen, "require{s} a gradient, and did not when lowered"),
            (frozen, "no longer require{s} a gradient")) if names)

    def resident(self, model: torch.nn.Module, leaves, device, modules: "_Submodules",
                 sharded: bool = False, checked: tuple | None = None) -> tuple:
        """The tensors a step binds, per resident slot; `sharded`: the model runs under
        FSDP2, whose root gathers its own parameters (in its mixed-precision dtype, if set);
        `checked`: the model's tensors as the plan's guard found them, which it passed
        (`CallGuard.model_tensors`) on this call's device."""
        if checked is not None:   # the model's tensors as checked: bind the rest
            resident = list(checked)
            for slot in self.call_slots:
                resident[slot] = self._bind(slot, model, leaves, device, modules, sharded)
            return tuple(resident)
        return tuple(self._bind(slot, model, leaves, device, modules, sharded)
                     for slot in range(len(self.bindings)))

    def _bind(self, slot: int, model: torch.nn.Module, leaves, device, modules: "_Submodules",
              sharded: bool) -> torch.Tensor:
        """The tensor of resident `slot` for this call, checked (`resident`)."""
        (kind, what), strides = self.bindings[slot], self.strides[slot]
        if kind == "param":
            t = modules.member(what, "_parameters")
            t = t if t is not None else parameter_slot(model, what)
        elif kind == "buffer":
            t = modules.member(what, "_buffers")
            t = t if t is not None else model.get_buffer(what)
        elif kind == "input":
            t = leaves[what]
        else:
            t = self.constant(what, device)
        if t.device != device:
            raise RuntimeInputError(f"{what if kind != 'const' else self.graph.value(what).name!r} is on {t.device} "
                                    f"but the inputs are on {device}; move the model with .to()")
        if strides is not None and t.stride() != strides:
            self._check_layout(slot, t)
        if kind in ("param", "buffer") and (t.shape, t.dtype) != self.traced_meta[slot]:
            if sharded and kind == "param":
                check_gathered(what, t, self.traced_meta[slot][1])
            self._refuse_changed(kind, what, t, *self.traced_meta[slot])
        if kind == "param" and what in self.frozen and t.requires_grad:
            self._refuse_unfrozen(what)
        if kind in ("param", "buffer") and type(t) not in (torch.Tensor, torch.nn.Parameter) \
                and changes_torch_functions(t):
            kind_name = f"{type(t).__module__}.{type(t).__qualname__}"
            raise RuntimeInputError(
                f"{'parameter' if kind == 'param' else 'buffer'} {what!r} is a {kind_name} now, a "
                f"torch.Tensor subclass changing what torch functions do, and was a plain tensor when "
                f"the model was lowered: the graph computes what a plain tensor does. Hold a plain "
                f"{'nn.Parameter' if kind == 'param' else 'tensor'} and do what the subclass does in "
                f"the forward")
        if kind == "buffer" and t.requires_grad:
            # Set since lowering (which refuses it): eager gives the buffer, or the tensor
            # assigned into its slot (a hypernetwork's output), a gradient, and the graph,
            # reading it as a constant, gave none, silently (found by a review).
            raise RuntimeInputError(
                f"buffer {what!r} requires a gradient now, and did not when the model was lowered: "
                f"the graph reads buffers as values and hands gradients over to parameters only. "
                f"Make it an nn.Parameter before remat_ir.remat if it is trained, or assign it "
                f"without requires_grad (`tensor.detach()`)")
        return t

    @staticmethod
    def _refuse_changed(kind: str, name: str, tensor: torch.Tensor, shape, dtype) -> None:
        """A parameter or buffer resized or converted since lowering (`resize_token_embeddings`,
        `model.to(torch.bfloat16)` with integer inputs, whose signature did not change): the
        graph's ops, casts and constants were traced for the old one."""
        raise RuntimeInputError(
            f"{'parameter' if kind == 'param' else 'buffer'} {name!r} is {list(tensor.shape)} "
            f"{tensor.dtype} but was {list(shape)} {dtype} when the model was lowered, and the "
            f"graph computes with that: call remat_ir.remat again after resizing or converting "
            f"the model")

    def check_hooks(self, model: torch.nn.Module) -> None:
        """The model's hooks changed since this graph was lowered: the graph runs what the
        hooks computed when it was traced (`torchlib.hooks`)."""
        changed = self.hooks.changed(model)
        if changed is not None:
            raise RuntimeInputError(
                f"the model's hooks changed after it was lowered ({changed}): its graph runs "
                f"what the hooks computed when it was traced, so a hook added since would not "
                f"run and one removed would still run. Call remat_ir.remat again, with the "
                f"hooks in place.{_checkpointing_hint(model)}")

    def check_modules(self, modules: "_Submodules") -> None:
        """A submodule replaced since lowering by one of another class (`model.act =
        nn.Sigmoid()`, a layer wrapped by a LoRA adapter or a parametrization): the graph
        computes what the old one did, so the new one would silently not run; likewise a
        module holding a submodule, parameter or buffer more (a ModuleList grown)."""
        changed = self.modules_difference(modules)
        if changed is not None:
            raise RuntimeInputError(
                f"{changed}: the lowered graph computes what the model did then. Call "
                f"remat_ir.remat again after changing the model's modules")

    def modules_difference(self, modules: "_Submodules") -> str | None:
        """The first submodule of another class than at lowering, or paths that were one
        module and are not now, said for the user, or None."""
        for path, kind in self.module_types:
            module = modules.at(path)
            if type(module) is not kind and not is_sharded_class(type(module), kind):
                # Named whole where the names alone agree (peft's `lora.Linear` for an
                # `nn.Linear`: "was a Linear ... and is a Linear now", found by a review).
                whole = module is not None and type(module).__name__ == kind.__name__
                named = (lambda cls: f"{cls.__module__}.{cls.__qualname__}") if whole else (lambda cls: cls.__name__)
                now = "gone" if module is None else f"a {named(type(module))} now"
                return (f"submodule {path!r} of {type(modules.at('')).__name__} was a "
                        f"{named(kind)} when the model was lowered and is {now}")
        for paths in self.module_aliases:
            if len({id(modules.at(path)) for path in paths}) > 1:
                shown = ", ".join(repr(path) for path in paths[:-1]) + f" and {paths[-1]!r}"
                return (f"submodules {shown} of {type(modules.at('')).__name__} were one module "
                        f"when the model was lowered and are not now")
        return self.members_difference(modules)

    def members_difference(self, modules: "_Submodules") -> str | None:
        """A module holding more or fewer submodules, parameters or buffers than at lowering,
        or the same in another order (`module_members`; its paths all hold a module of
        their class), said for the user, or None."""
        for path, *then, nones in self.module_members:
            module = modules.at(path)
            owner = f"{'the model' if not path else f'submodule {path!r}'} of {type(modules.at('')).__name__}"
            now_none = model_structure.none_members(module)
            if now_none != nones:
                table, name = min(now_none ^ nones)
                kind = model_structure.MEMBER_KINDS[table]
                return (f"{owner} holds None at {kind} {name!r} now and held a {kind} there when "
                        f"the model was lowered" if (table, name) not in nones else
                        f"{owner} holds a {kind} at {name!r} now and held None there when the model "
                        f"was lowered")
            for kind, names, now in zip(("submodules", "parameters", "buffers"), then,
                                        (module._modules, module._parameters, module._buffers)):
                if len(now) != len(names):
                    added = [name for name in now if name not in names]
                    return (f"{owner} holds {len(now)} "
                            f"{kind[:-1] if len(now) == 1 else kind} now and held {len(names)} "
                            f"when the model was lowered"
                            + (f" (added: {', '.join(map(repr, added))})" if added else ""))
                if tuple(now) != names:
                    how = "in another order" if set(now) == set(names) else "under other names"
                    return (f"{owner} holds its {kind} {how} now ({', '.join(map(repr, now))}) "
                            f"than when the model was lowered ({', '.join(map(repr, names))}), an order its "
                            f"forward may follow (a ModuleDict's or ParameterDict's items, a Sequential)")
        return None

    def model_difference(self, modules: "_Submodules") -> tuple[str, str, tuple | None] | None:
        """(kind, what, where) for the first way the model differs from the one this graph
        was lowered from that lowering it again follows: its hooks, a submodule replaced,
        a plain value its forward read changed (`where`: the place it is read and the value
        it has now, shown), parameters
        tied or untied (`tied_difference`), the parameters that require a gradient
        (`trainable_difference`); or None. What it does not cover is
        refused when the plan runs (a held tensor changed, a parameter resized)."""
        model = modules.at("")
        changed = self.hooks.changed(model)
        if changed is not None:
            if _checkpointing_hint(model):
                return None   # refused when it runs, saying that it is not needed
            return "changed hooks", changed, None
        changed = self.modules_difference(modules)
        if changed is not None:
            added = self.members_difference(modules) == changed
            return "changed module members" if added else "replaced submodule", changed, None
        read = self.traced_reads.plain_changed(modules.at)
        if read is not None:
            return "new value read by forward", read[1], (read[0], read[2])
        changed = self.tied_difference(modules)
        if changed is not None:
            return (*changed, None)
        changed = self.trainable_difference(modules)
        if changed is not None:
            return "other trainable parameters", changed, None
        changed = self.layout_difference(modules)
        if changed is not None:
            return "other layout", changed, None
        return None

    def layout_difference(self, modules: "_Submodules") -> str | None:
        """A parameter or buffer laid out otherwise than at lowering, said for the user, or
        None: with a planner, lowered again for it. Refused at the step before (found by
        hunt56): a weight assigned through `orthogonal`'s parametrization (torch's way to
        re-project it) gave its `base` buffer another layout than the one it was made in,
        and the way out offered, restriding torch's own buffer, was no user's."""
        for slot, (kind, what) in enumerate(self.bindings):
            strides = self.strides[slot]
            if kind not in ("param", "buffer") or strides is None:
                continue
            tensor = modules.member(what, "_parameters" if kind == "param" else "_buffers")
            if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
                continue   # none, or a subclass (FSDP2's DTensor: its runtime's business)
            if tensor.layout == torch.strided and tensor.stride() != tuple(strides):
                traced = describe_layout(torch.empty_strided(list(tensor.shape), list(strides), device="meta"))
                named = "parameter" if kind == "param" else "buffer"
                return f"{named} {what!r} is {describe_layout(tensor)}, was {traced}"
        return None

    @staticmethod
    def _refuse_unfrozen(name: str) -> None:
        """A parameter that needs a gradient now but did not when the graph was made (a
        layer unfrozen since): the graph computes no gradient for it, so it would silently
        not train. (Frozen since: autograd drops its gradient, as eager's.)"""
        raise RuntimeInputError(f"parameter {name!r} requires a gradient, but did not when the "
                                f"model was lowered, so the graph computes none for it: call "
                                f"remat_ir.remat again after unfreezing parameters")

    def _check_layout(self, slot: int, tensor: torch.Tensor) -> None:
        """A bound tensor laid out otherwise than at lowering (a model moved to
        channels_last after `remat`): the graph's views and copies were traced for the
        old layout, so running it could fail deep inside or compute on the wrong
        elements. Strides of dimensions of size 1 too: kernels choose from them
        (`types.describe_layout`)."""
        kind, what = self.bindings[slot]
        value = self.graph.value(self.slot_values[slot])
        if tensor.layout != torch.strided or tensor.stride() == tuple(self.strides[slot]):
            return
        traced = describe_layout(torch.empty_strided(list(value.shape), list(self.strides[slot]),
                                                     device="meta"))
        if kind == "input":
            name = next(name for index, _, name in self.user_inputs if index == what)
            where, fix = f"argument {name}", "pass it laid out as at lowering"
        else:
            where = f"{'parameter' if kind == 'param' else 'buffer'} {what!r}"
            # Not only a memory format: a weight assigned in another layout (a transposed
            # tensor loaded with `assign=True`, the one `parametrize`'s right_inverse makes
            # from an assigned weight) was said as one (found by a review).
            fix = ("it was converted (`model.to(memory_format=...)`) or given a tensor in another "
                   "layout (`load_state_dict(assign=True)`, a parametrized weight assigned): give "
                   "it the traced layout (`.contiguous()` for a contiguous one), or call "
                   "remat_ir.remat again after changing it")
        raise RuntimeInputError(f"{where} is {describe_layout(tensor)} but was {traced} when the "
                                f"graph was lowered, and its views and copies hold that layout: {fix}")

    def constant(self, value_id: int, device) -> torch.Tensor:
        key = (value_id, device)
        if key not in self.constants:
            self.constants[key] = constant_tensor(self.graph.value(value_id), device)
        return self.constants[key]

    def check_attributes(self, modules: "_Submodules", plain: bool = True) -> None:
        """Plain values the trace read (a flag in `forward`, a config's attribute, a
        global) decided what was lowered: a change since would silently run the old
        branch or constant (`traced_reads.py`); so do tensors the model holds outside its
        parameters and buffers (only those where not `plain`)."""
        reads = self.traced_reads
        changed = reads.changed(modules.at) if plain else reads.held_changed(modules.at)
        if changed is not None:
            raise RuntimeInputError(
                f"{changed}; forward read it while tracing, so the lowered graph computes with "
                "the old value (or takes the old branch): call remat_ir.remat (or lower) again "
                "after changing it, or pass a value that changes between steps to forward as a "
                "tensor")

    def run(self, model: torch.nn.Module, args, kwargs, gradient_groups: int = GRADIENT_GROUPS,
            scheduled: torch.nn.Module | None = None, backend: str = "eager",
            answers: dict | None = None, modules: "_Submodules | None" = None,
            model_checked: bool | tuple = False):
        """One call: the outputs of a training step through this plan (`scheduled`, the
        module the user called, is where FSDP2 may have been applied: `fsdp.Units`).
        `answers`: the call's value decisions, where the caller made them already;
        `modules`: the model's submodules as this call looks them up, likewise;
        `model_checked`: the caller found the model as this plan was made for
        (`model_difference`), so submodules, ties and plain values are not compared again;
        a tuple: found so by the plan's guard, the model's tensors it gave."""
        modules = modules or _Submodules(model)
        self.check_hooks(model)   # found changed and kept: gradient checkpointing's, refused
        units = Units.of(scheduled, model) if scheduled is not None else None
        checked = model_checked if isinstance(model_checked, tuple) else None
        if not model_checked and units is None:
            checked = self.guard.model_tensors(model)
        if checked is None and not model_checked:
            self.check_modules(modules)
            ties = self.tied_difference(modules)
            if ties is not None:
                kind, what = ties
                raise RuntimeInputError(
                    f"{what}: the lowered graph reads " + (
                        "one tensor for all of them. Call remat_ir.remat again now that they are "
                        "untied" if kind.startswith("untied") else
                        "each apart. Call remat_ir.remat again now that they are tied"))
        self.check_attributes(modules, plain=not (model_checked or checked is not None))
        leaves = self.flat_inputs(args, kwargs)
        differs = self.values_differ(args, kwargs, {} if answers is None else answers, leaves, modules)
        if differs is not None:
            raise RuntimeInputError(f"this call does not match the lowered graph: {differs}. "
                                    f"{_lower_again(scheduled)}")
        if self.written_inputs and (overlapping := self.written_argument_overlapping(leaves)) is not None:
            raise RuntimeInputError(overlapping)
        if self.written_inputs and (shared := self.written_argument_shared(leaves)) is not None:
            raise RuntimeInputError(f"this call does not match the lowered graph: {shared}")
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else next(model.parameters()).device
        if units is None:
            runner = self.runner(device, gradient_groups, backend=backend)
            runner.tell = getattr(scheduled, "_tell_once", None)
            if device != self.guard.device:
                checked = None
            resident = self.resident(model, leaves, device, modules, checked=checked)
            if runner.buffer_slots and (shared := self.argument_sharing_written_buffer(
                    runner, leaves, resident)) is not None:
                raise RuntimeInputError(f"this call does not match the lowered graph: {shared}")
            if not model_checked and self.argument_names:   # else the planner compared them
                differs = self.member_arguments_differ(leaves, resident)
                if differs is not None:
                    raise RuntimeInputError(f"this call does not match the lowered graph: {differs}. "
                                            f"{_lower_again(scheduled)}")
            if checked is None:   # every check passed: the next call may take the guard
                self.guard.passed(resident, device)
            call = getattr(scheduled, "_call_model", model)
            outputs = _run_step_failing_as_eager(runner, resident, model, lambda: call(*args, **kwargs))
        else:
            key = tuple(id(u) for u in units.units)
            if self.fsdp_owners[0] != key:  # module paths walked once per set of units
                owners = units.owners(model, [name if kind == "param" else None
                                              for kind, name in self.bindings])
                self.fsdp_owners = (key, owners, {slot: unit for slot, unit in enumerate(owners)
                                                  if unit is not None})
            _, owners, gathered = self.fsdp_owners
            runner = self.runner(device, gradient_groups, gathered, backend)
            runner.tell = getattr(scheduled, "_tell_once", None)
            slots: dict[int, list] = {}
            for slot, unit in gathered.items():
                name = self.bindings[slot][1]
                path, _, attribute = name.rpartition(".")
                dtype = torch_dtype(self.graph.value(runner.plan.resident[slot]).dtype)
                slots.setdefault(unit, []).append((slot, modules.at(path), attribute, name, dtype))
            # The units' own parameters are sharded here; the segments gather them (U).
            resident = self.resident(model, leaves, device, modules, sharded=True)
            step_units = StepUnits(units, slots)
            outputs = _run_step(runner, resident, _Sharding(units, owners, runner, step_units))
        if self.hook_weights:
            assign_weights(hook_reparametrizations(model))
        outputs = list(outputs)
        for position in sorted([*self.constant_outputs, *self.member_outputs]):
            outputs.insert(position, self.constant_outputs[position] if position in self.constant_outputs
                           else _member_output_of(self.member_outputs[position], leaves, modules))
        if self.stored_attributes:   # the forward's stores, as eager's call leaves them
            count = len(self.stored_attributes)
            outputs, stored = outputs[:-count], outputs[-count:]
            for (path, key), value in zip(self.stored_attributes, stored):
                setattr(modules.at(path), key, value)
        for path, key, value in self.assigned_after:
            setattr(modules.at(path), key, value)
        if self.out_spec is not None:
            return pytree.tree_unflatten(outputs, self.out_spec)
        return outputs[0] if len(outputs) == 1 else outputs


def _check_output_counts(g: pb.Graph, out_spec, constants: dict, members: dict, stored: int) -> None:
    """Refuse a graph whose entries on its outputs disagree (edited by hand: hunt68's
    `[]` for the constant outputs met a raw pytree error at the first call). A call
    returns the graph's user outputs less the hidden ones, with the constant and member
    outputs put at their positions, less the tensors the forward stores on modules."""
    returned = sum(o.role == pb.USER_OUTPUT for o in g.outputs) - int(g.metadata.get("torch.hidden_outputs", "0"))
    flat = returned + len(constants) + len(members)
    problems = [f"'torch.constant_outputs' and 'torch.member_outputs' both place an output at position {p}"
                for p in sorted(set(constants) & set(members))]
    problems += [f"an output is placed at position {p}, past the {flat} the call returns"
                 for p in sorted({*constants, *members}) if p >= flat]
    if returned < 0 or stored > flat:
        problems.append(f"'torch.hidden_outputs' and 'torch.stored_attributes' take more outputs than the "
                        f"graph's {returned + int(g.metadata.get('torch.hidden_outputs', '0'))}")
    elif out_spec is not None and out_spec.num_leaves != flat - stored:
        problems.append(f"the call returns {flat - stored} values ({returned} of the graph's user outputs, "
                        f"{len(constants)} constant and {len(members)} member outputs, less {stored} stored "
                        f"on modules), but 'torch.out_spec' holds {out_spec.num_leaves}")
    if problems:
        raise InvalidGraph([f"the graph's outputs do not add up: {problem}; the torch frontend writes these "
                            "entries together: lower the model again rather than edit them"
                            for problem in problems])


def _member_output_of(member: list, leaves, modules: "_Submodules") -> torch.Tensor:
    """An output that is one of the step's inputs as it is (`torch.member_outputs`): the
    parameter, buffer or caller's tensor itself, as eager's forward returns it (autograd
    sends its gradient straight to it)."""
    kind, what = member
    if kind == "input":
        return leaves[what]
    return modules.member(what, "_parameters" if kind == "param" else "_buffers")


def _flat_positional(spec) -> int | None:
    """The number of positional arguments of an (args, kwargs) spec whose arguments are
    all leaves (a tuple and a dict of them), else None (`_Lowered.flat_positional`)."""
    if spec is None or spec.child(0).type is not tuple or spec.child(1).type is not dict:
        return None
    parts = (spec.child(0), spec.child(1))
    if all(part.child(i).is_leaf() for part in parts for i in range(part.num_children)):
        return parts[0].num_children
    return None


def _checkpointing_hint(model: torch.nn.Module) -> str:
    """What to say of hooks that transformers' gradient checkpointing added: a new
    lowering would not need them (empty where the model does not checkpoint)."""
    if not getattr(model, "is_gradient_checkpointing", False):
        return ""
    # gradient_checkpointing_enable() adds one (on the embeddings).
    return (" transformers' gradient_checkpointing_enable() adds hooks, and remat-ir plans "
            "recomputation itself: it is not needed.")


def _parameters_text(names: list[str], phrase: str) -> str:
    """'parameter 'a' requires ...' or 'parameters 'a', 'b' and 3 more require ...'
    (`phrase` holds {s} where the verb takes an s for one parameter)."""
    shown = ", ".join(repr(n) for n in names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return f"parameter{'s' if len(names) > 1 else ''} {shown} {phrase.format(s='' if len(names) > 1 else 's')}"


class _Submodules:
    """The model's submodules by dotted path, looked up afresh at every call (a submodule
    or parameter the user replaced since lowering is the one that runs) but each path
    once per call, through the modules' own dictionaries: `get_submodule` and
    `get_parameter` per tensor cost milliseconds per step on a model with hundreds of
    parameters (a ResNet: 6 ms of a 30 ms CPU step)."""

    def __init__(self, model: torch.nn.Module):
        self.found: dict[str, torch.nn.Module | None] = {"": model}

    def at(self, path: str) -> torch.nn.Module | None:
        """The submodule at `path`, or None if there is none."""
        if path in self.found:
            return self.found[path]
        parent, _, name = path.rpartition(".")
        above = self.at(parent)
        module = above._modules.get(name) if above is not None else None
        self.found[path] = module
        return module

    def member(self, qualified: str, table: str) -> torch.Tensor | None:
        """The tensor `qualified` ("layer.0.weight") in its module's `table` ("_parameters"
        or "_buffers"), or None (the caller then asks torch, which explains what is wrong)."""
        path, _, name = qualified.rpartition(".")
        module = self.at(path)
        return getattr(module, table).get(name) if module is not None else None


def resident_values(model: torch.nn.Module, graph: Graph, args: tuple,
                    kwargs: dict | None = None) -> dict[int, torch.Tensor]:
    """The tensors a step of `graph` reads (value id -> tensor), bound from `model` and a
    call's inputs as a training step binds them: what `profiling` times the step on."""
    lowered = _Lowered(model, graph, store_all(graph))
    leaves = lowered.flat_inputs(tuple(args), dict(kwargs or {}))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    device = tensors[0].device if tensors else next(model.parameters()).device
    bound = lowered.resident(model, leaves, device, _Submodules(model))
    return dict(zip(resident_order(graph), bound))


def _traced_strides(value: pb.Value) -> tuple[int, ...]:
    """The strides a value was traced with (an IR value without strides is contiguous)."""
    return tuple(value.stride) or tuple(contiguous_strides(list(value.shape)))


def _check_bound(model: torch.nn.Module, kind: str, name: str, value: pb.Value, written: bool) -> None:
    """The model's member `name` is there, as the graph has it; one the forward writes in
    place (`written`) holds no element twice (`overlapping_write`)."""
    try:
        tensor = parameter_slot(model, name) if kind == "param" else model.get_buffer(name)
    except AttributeError:
        what = "parameter" if kind == "param" else "buffer"
        raise RuntimeInputError(f"the graph needs {what} {name!r}, which "
                                f"{type(model).__name__} does not have") from None
    if tuple(tensor.shape) != tuple(value.shape) or tensor.dtype != torch_dtype(value.dtype):
        raise RuntimeInputError(f"{name!r} is {tuple(tensor.shape)} {tensor.dtype} in the model but "
                                f"{tuple(value.shape)} {torch_dtype(value.dtype)} in the graph")
    if written and overlaps_itself(tensor):
        what = "parameter" if kind == "param" else "buffer"
        raise RuntimeInputError(overlapping_write(
            f"{what} {name!r}", f"hold a copy (`{'nn.Parameter(w.clone())' if kind == 'param' else 'w.clone()'}`)"))


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` in its layout, gaps included: `clone()` lays a strided slice out
    densely, and a backward recomputing from the copy of an input the forward writes
    (`x[..., ::2]` centred in place, its mean taken again) reduced it in another order:
    gradients 3.8e-6 off eager's (found checking hunt73's repros). Such a copy spans the
    tensor's storage extent, gaps included, more than the plan counts for it."""
    if tensor.layout != torch.strided or is_non_overlapping_and_dense_or_false(tensor):
        return tensor.clone()
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                               device=tensor.device).copy_(tensor)


def overlapping_write(what: str, instead: str) -> str:
    """Why a tensor whose elements share memory (hunt73: overlapping frames of a signal,
    `unfold(-1, 8, 4)`, or `as_strided` windows) cannot be written in place by a step:
    eager writes it element by element, each write seen by the elements sharing its
    memory after it, in an order PyTorch leaves undefined (it calls in-place writes to
    such tensors unsupported, and its check gives up on them without an error), where the
    graph computes the whole write from the values before it and copies it back: outputs
    0.99 off eager's, silently, before."""
    return (f"{what} has elements that share memory (a view made by `unfold` or `as_strided` "
            f"whose windows overlap), and the forward writes into it in place: eager writes it element "
            f"by element, each write seen by the elements sharing its memory, in an order PyTorch leaves "
            f"undefined (it calls such writes unsupported), while remat-ir's graph computes the whole "
            f"write from the values before it (refused for every write, a `clamp_` or `relu_` whose "
            f"result no order changes too). {instead[0].upper()}{instead[1:]} whose elements are its own, "
            f"or write into a copy inside the forward")


#: Plans a `ScheduledModule` keeps by default, one per input signature, least recently
#: used dropped first.
MAX_PLANS = 8

#: Values other than the lowered one that one of the model's plain values (a module
#: attribute the forward reads) may take, each lowered and planned again, before a call
#: with yet another is refused.
VALUE_REPLANS = 4

#: Makes the (graph, schedule) for a call of a new signature: `planner(model, args, kwargs,
#: alone=..., same_plan=...)` (`remat_ir.api.Planner`): under torch.distributed, `alone`
#: plans for this rank without waiting for the others (DDP), `same_plan` gives every rank
#: one plan (FSDP2: the ranks meet the call together) and refuses ranks whose inputs differ.
Planner = Callable[..., "tuple[Graph, pb.Schedule]"]


#: Said at the first call in eval mode with gradients on: a backward through it takes
#: eager's memory, which fine-tuning in eval mode (dropout off) met silently (found by a review).
_EVAL_WITH_GRADIENTS = (
    "remat-ir: the model is in eval mode with gradients enabled: calls run the model as it is, "
    "storing every activation (no plan, no budget), so a backward through them takes eager's "
    "memory. To train within the budget call model.train() (set dropout's p to 0 for no "
    "dropout; BatchNorm layers set to eval stay so); evaluate under torch.no_grad()")


#: A module's state-dict hooks, which a `ScheduledModule` shares with its model.
_STATE_DICT_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                     "_load_state_dict_post_hooks")


def _bytes_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one storage share a byte: the spans of memory they reach
    meet (two disjoint slices, `t[:4]` and `t[4:]`, do not: refusing them was a review's
    finding), and, for tensors of up to `_ELEMENTS_COMPARED` elements of one dtype, an
    element's bytes are both's (interleaved views, `t[::2]` and `t[1::2]`, share none:
    refused as sharing before, found by a review). Larger ones whose spans meet are taken
    as sharing."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        if t.numel() == 0:
            return 0, 0
        start = t.storage_offset() * t.element_size()
        extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
        return start, start + extent * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    if not (a0 < b1 and b0 < a1):
        return False
    if a.dtype != b.dtype or max(a.numel(), b.numel()) > _ELEMENTS_COMPARED:
        return True
    return bool(torch.isin(_element_offsets(a), _element_offsets(b)).any())


#: The most elements `_bytes_meet` compares one by one (only where spans meet: rare).
_ELEMENTS_COMPARED = 1 << 20


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """The storage offsets (in elements) of each of `t`'s elements."""
    offsets = torch.tensor([t.storage_offset()], dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.int64)[None, :] * stride).reshape(-1)
    return offsets


def _compile_routed(model: torch.nn.Module, *args, **kwargs) -> None:
    """`model.compile()` of a model whose calls run a plan (`ScheduledModule.route_calls`):
    compiles the plan's module, which runs the plan as it is and says so once; a copy of
    the model, which nn.Module's pickling leaves unrouted, compiles as nn.Module does."""
    routed = model.__dict__.get("_compiled_call_impl")
    if isinstance(routed, ScheduledModule):
        routed.compile(*args, **kwargs)
    else:
        torch.nn.Module.compile(model, *args, **kwargs)


#: Pickle saves a bound method as `getattr(model, name)`: named as nn.Module's method, a
#: saved model loads with that (a loaded copy is unrouted), where its own name raised.
_compile_routed.__name__ = "compile"


class ScheduledModule(torch.nn.Module):
    """`model`, trained through `schedule` of its lowered `graph` (see module docstring).

    `route_calls()` makes the model's own calls run it (`remat(..., in_place=True)`).

    With a `planner`, a call whose signature (`signatures.py`), value decisions or model
    (the parameters requiring a gradient, plain values its forward reads, submodules,
    hooks: `_Lowered.model_difference`) no plan was made for is lowered and planned
    again, once, with a one-line notice through `notify`; up to `max_plans` plans are
    kept. Without one, such a call raises `RuntimeInputError` naming what differs.

    The backward hands parameters' gradients to autograd in up to `gradient_groups`
    groups, each as soon as it is final (`codegen.release_points`), so that DDP's
    all-reduce and FSDP's reduce-scatter overlap the rest of the backward; 1 hands
    them all at its end. None (the default) chooses per call: `GRADIENT_GROUPS` when
    torch.distributed runs more than one process, else 1 (in one process nothing
    waits for gradients, and 13 groups cost 4% of a small CPU step).

    `backend`: "eager" (default) runs the segments op by op; "inductor" compiles their
    runs of plain steps with Inductor on first use (`compiled.py`), keeping what the
    schedule decided.
    """

    #: Whether a call runs the root module's own backward hooks around its step
    #: (`root_backward_hooks`): not the calls that time the step while planning, which
    #: the user's hook, a gradient monitor, would have counted as steps.
    runs_root_hooks = True

    def __init__(self, model: torch.nn.Module, graph: Graph, schedule: pb.Schedule, *,
                 planner: Planner | None = None, max_plans: int = MAX_PLANS,
                 notify: Callable[[str], None] | None = None,
                 gradient_groups: int | None = None, backend: str = "eager"):
        super().__init__()
        check_count("max_plans", max_plans)
        check_backend(backend)
        if gradient_groups is not None:
            check_count("gradient_groups", gradient_groups)
        for shared in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", *_STATE_DICT_HOOKS):
            self.__dict__[shared] = model.__dict__[shared]
        # The version a state dict records for the model's own entries, which its class's
        # `_load_from_state_dict` may convert by (BatchNorm's `num_batches_tracked`).
        self.__dict__["_version"] = model._version
        self.__dict__["_model"] = model
        first = _Lowered(model, graph, schedule)
        if first.stale is not None:
            raise RuntimeInputError(f"the model is not the one this graph was lowered from: {first.stale}. "
                                    f"Lower it again (remat_ir.remat, or remat-ir convert)")
        self.__dict__["_plans"] = OrderedDict([(first.key, first)])
        self.__dict__["_planner"] = planner
        self.__dict__["_notify"] = notify
        self.max_plans, self.gradient_groups, self.backend = max_plans, gradient_groups, backend
        self.training = model.training

    def __getattr__(self, name: str):
        """Attributes of the model itself (`config`, `accepts_loss_kwargs`, methods): what
        training tools such as Hugging Face's Trainer read from the module they are given."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or "_model" not in self.__dict__:
                raise
            return getattr(self.__dict__["_model"], name)

    #: The attributes this module keeps for itself; any other set on it is the model's.
    _OWN_ATTRIBUTES = frozenset({"max_plans", "gradient_groups", "backend", "training"})

    def __setattr__(self, name: str, value) -> None:
        """Set on the model (as `torch.compile`'s module does): an attribute read through
        this module is the model's, and one set here (`scheduled.temperature = 3.0`) stayed
        on this module while the model's forward read its own, silently (found by a
        review: 0.043 where eager gives 0.005). This module's own attributes, nn.Module's
        state and the properties of its class stay here; `training` goes to both."""
        if "_model" not in self.__dict__ or name in self.__dict__ or hasattr(type(self), name) \
                or name in self._OWN_ATTRIBUTES:
            super().__setattr__(name, value)
            if name == "training" and "_model" in self.__dict__:
                self.__dict__["_model"].training = value
        else:
            setattr(self.__dict__["_model"], name, value)

    def __delattr__(self, name: str) -> None:
        """Mirrors `__setattr__`."""
        if name in self.__dict__ or hasattr(type(self), name) or name in self._OWN_ATTRIBUTES \
                or "_model" not in self.__dict__:
            super().__delattr__(name)
        else:
            delattr(self.__dict__["_model"], name)

    def apply(self, fn):
        """`fn` on every module of the model, the model itself last (`nn.Module.apply`):
        inherited, it reached this module in the model's place, and an initialiser that
        recognises the model's class (`isinstance(m, Net)`) never saw it (found by a review)."""
        self.__dict__["_model"].apply(fn)
        return self

    # The model's own state-dict code and conversions (its class's `get_extra_state`,
    # `_load_from_state_dict`, `_apply`; its state-dict hooks, shared in `__init__`): on
    # this module's class they were torch's, and a checkpoint whose keys the model's
    # load pre-hook renames (transformers' EsmModel, MambaModel) loaded with
    # `strict=False` left the renamed weights as they were, silently; the extra state was
    # neither saved nor loaded (found by a review).

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        model = self.__dict__["_model"]
        type(model)._save_to_state_dict(model, destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args, **kwargs):
        model = self.__dict__["_model"]
        type(model)._load_from_state_dict(model, *args, **kwargs)

    def _apply(self, fn, recurse=True):
        self.__dict__["_model"]._apply(fn, recurse)
        return self

    # -------------------------------------------------------------- copying and saving

    def __getstate__(self):
        """Picklable state (torch.save, copy.deepcopy): graphs and schedules as protobuf
        bytes; compiled segments, constants and specs are rebuilt on first use."""
        state = self.__dict__.copy()
        state["_plans"] = [(p.graph.proto.SerializeToString(), p.schedule.SerializeToString())
                           for p in self._plans.values()]
        state.pop("_notify", None)
        # nn.Module's own pickling drops the model's routing (`route_calls`): said here,
        # so that a copy of this module routes its copy of the model to itself again.
        state["_routed"] = self._model.__dict__.get("_compiled_call_impl") is self
        return state

    def __setstate__(self, state):
        saved = state.pop("_plans")
        state.setdefault("gradient_groups", None)  # pickled before they existed
        state.setdefault("backend", "eager")
        self.__dict__.update(state)
        self.__dict__["_notify"] = None
        self.__dict__["_plans"] = OrderedDict()
        for graph_bytes, schedule_bytes in saved:
            graph, schedule = pb.Graph(), pb.Schedule()
            graph.ParseFromString(graph_bytes)
            schedule.ParseFromString(schedule_bytes)
            plan = _Lowered(self._model, Graph(graph), schedule)
            self._plans[plan.key] = plan
        if self.__dict__.pop("_routed", False):
            self.route_calls()

    # -------------------------------------------------------------- running

    @property
    def graph(self) -> Graph:
        """The graph of the plan used last (the first one before any call)."""
        return next(reversed(self._plans.values())).graph

    @property
    def schedule(self) -> pb.Schedule:
        """The schedule of the plan used last (the first one before any call)."""
        return next(reversed(self._plans.values())).schedule

    @property
    def plans(self) -> list[tuple[Graph, pb.Schedule]]:
        """Every (graph, schedule) kept, least recently used first."""
        return [(p.graph, p.schedule) for p in self._plans.values()]

    def train(self, mode: bool = True):
        self._model.train(mode)
        self.training = mode
        return self

    def runner(self, device: torch.device) -> _Runner:
        """Compiled segments of the current plan for `device`."""
        return next(reversed(self._plans.values())).runner(device, self._groups(), backend=self.backend)

    def _plan_for(self, args, kwargs, modules: "_Submodules") -> tuple[_Lowered | None, dict, bool | tuple]:
        """The plan for this call's signature, input values (`_Lowered.values_differ`) and,
        with a planner, the model as it is now (`_Lowered.model_difference`: parameters
        frozen or unfrozen, values and functions the forward reads, ties, submodules,
        hooks): kept, planned now, or an error naming what differs; with the call's value
        decisions, made once. Without a planner the model is checked when the plan runs
        (a plan made with more parameters trainable runs, autograd dropping the extra
        gradients; one made with fewer refuses the call). The flag: the plan is a kept one
        whose `model_difference` was found None, or the model's tensors where its guard found
        so (`CallGuard`). No plan (None) for a call nothing of which can have a gradient,
        where no kept plan matches: the model runs as it is."""
        last = next(reversed(self._plans.values()))
        answers: dict = {}
        if last.signature is None:  # no input spec (hand-built IR): checked input by input
            return last, answers, False
        signature = memoised_signature(args, kwargs)
        if kwargs and (order := free_keywords(self._model.forward, kwargs)):
            signature = dataclasses.replace(signature, keyword_order=order)
        same = [p for p in reversed(self._plans.values()) if p.signature.admits(signature)]
        if not same and self._planner is None:
            # Device follows the inputs: a plan lowered on another device (or, on CPU, with
            # another thread count) runs there too.
            same = [p for p in reversed(self._plans.values()) if p.signature.same_but_where(signature)]
        new = difference = where = None
        for plan in same:
            if plan.stale is not None:   # made again from its graph for a model changed since
                if new is None:
                    new, difference = "model changed since it was lowered", plan.stale
                continue
            differs = plan.values_differ(args, kwargs, answers, modules=modules)
            if differs is not None:
                if new is None:
                    new, difference = "new input values", differs
                continue
            checked = changed = None
            if self._planner is not None:
                checked = None if self._sharded() else plan.guard.model_tensors(self._model)
                changed = plan.model_difference(modules) if checked is None else None
                if changed is None and (held := plan.traced_reads.held_change(modules.at)) is not None \
                        and held[2] != "requires a gradient":   # lowering refuses that: said when run
                    # A tensor the graph holds as a constant, changed (an annealed
                    # temperature assigned as a new tensor): planned again, as a plain
                    # value is, up to `VALUE_REPLANS` values (hunt66: refused, where a float
                    # changed so was planned for).
                    changed = "new tensor held by the model", held[1], (held[0], held[2])
            if changed is not None:
                if new is None:
                    new, difference, where = changed
                continue
            if self._planner is not None and plan.argument_names:
                members = checked if checked is not None else plan.model_members(modules)
                differs = plan.member_arguments_differ(plan.flat_inputs(args, kwargs), members)
                if differs is not None:
                    if new is None:
                        new, difference = "new input values", differs
                    continue
            self._plans.move_to_end(plan.key)
            return plan, answers, checked if checked is not None else self._planner is not None
        new = new or "new input signature"
        if new == "new input signature":
            _check_call(self._model, args, kwargs)
        difference = difference or signature.difference(last.signature)
        if self._planner is None:
            raise RuntimeInputError(f"this call does not match the lowered graph: {difference}; "
                                    f"{_lower_again(self)}")
        if not self._differentiable(args, kwargs):
            # Every parameter frozen and no input requiring a gradient (BatchNorm statistics
            # recalibrated in train mode, a frozen model's outputs as targets): eager's call
            # saves nothing for a backward, so the model runs as it is, without a plan (was
            # planned and refused as computing no gradient).
            return None, answers, False
        if where is not None:
            self._count_value_change(where, difference, plain=new == "new value read by forward")
        elif new == "new input values":
            self._count_integer_reads(same, answers)
        elif new == "new input signature":
            self._count_argument_change(signature)
        if self._sharded():
            # Lowering runs the model's forward, whose FSDP2 units gather their parameters
            # in their hooks: a collective rank 0 alone (planning) would call, while the
            # others wait in theirs. Found by a review: every rank hung.
            raise FSDPUsageError(
                f"a module sharded by FSDP2 met a {new} ({difference}), and it cannot be lowered "
                f"again once sharded (tracing would gather the units on one rank): "
                f"{_FSDP_ADVICE.get(new, _FSDP_ADVICE['new input signature'])}")
        dropping = ("; the least recently used is dropped, and planned again if its shape "
                    "comes back: pad batches to fewer lengths (pad_to_multiple_of in "
                    "transformers' collators) or keep more plans (max_plans)"
                    if len(self._plans) >= self.max_plans else "")
        (self._notify or notify_stderr)(
            f"remat-ir: {new} ({difference}): lowering and planning again "
            f"(plan {len(self._plans) + 1}, at most {self.max_plans} kept{dropping})")
        devices = [t.device for t in pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"][:1]
        raises_in_eager = None
        with generators_kept(devices):  # planning never moves a generator
            sharded = self._sharded()
            try:
                graph, schedule = self._planner(self._model, args, kwargs, alone=not sharded,
                                                same_plan=sharded)
            except RematIRError as exc:
                if getattr(exc, "eager_error", None) is None:
                    # Say which call failed to plan (a larger batch at a byte budget),
                    # keeping the error's type and facts (InfeasibleBudget.smallest_feasible).
                    exc.args = (f"planning this call's {new} ({difference}): {exc}",
                                *exc.args[1:])
                    raise
                raises_in_eager = exc
        if raises_in_eager is not None:
            self._fail_as_eager(raises_in_eager, f"{new} ({difference})")
        plan = _Lowered(self._model, graph, schedule)
        if not plan.signature.admits(signature):
            raise RematIRError(f"the graph planned for this call was lowered for another "
                               f"signature ({signature.difference(plan.signature)})")
        differs = plan.values_differ(args, kwargs, answers, modules=modules)
        if differs is not None:
            raise RematIRError(f"the graph planned for this call was lowered for other input "
                               f"values ({differs})")
        self._plans.pop(plan.key, None)   # one for a model since changed otherwise (a module)
        self._plans[plan.key] = plan
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)
        return plan, answers, False

    def _differentiable(self, args, kwargs) -> bool:
        """Whether this call's outputs can have a gradient: a parameter or an input tensor
        requires one."""
        return any(p.requires_grad for p in self._model.parameters()) or any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves((args, kwargs)))

    def _count_value_change(self, where: tuple, difference: str, plain: bool) -> None:
        """A value the forward reads (`where`: its place and its value now) took a value no
        kept plan was made for: lowered and planned again (a BatchNorm set to eval for
        fine-tuning, a flag toggled between phases), for up to `VALUE_REPLANS` values of one
        place (values seen before count once, also when their plan was dropped since);
        beyond, a value that changes at every step, which would plan at every step, is
        refused with what to do."""
        place, value = where
        seen = self.__dict__.setdefault("_value_changes", {}).setdefault(place, {})
        if value not in seen and len(seen) >= VALUE_REPLANS:
            # A plain value is said by its values, not by `difference`, which compares with
            # one kept plan's value as the value "when the model was lowered" (the latest
            # planning's, where it was another at `remat`: hunt84 F2). A tensor's are digests.
            said = (f"{place} is {value} now, a value no kept plan was made for" if plain else difference)
            taken = f" ({', '.join(seen)})" if plain else ""
            raise RuntimeInputError(
                f"{said}; forward read it while tracing, and it has taken {len(seen)} other values "
                f"since the model was first lowered{taken}, each lowered and planned again: pass a "
                f"value that changes between steps to forward as a tensor, or call remat_ir.remat "
                f"again once it stays fixed")
        seen.setdefault(value, None)   # a dict: the values in the order taken

    def _count_integer_reads(self, plans: list, answers: dict) -> None:
        """Integers the forward reads from its inputs (`torchlib.value_guards`: Qwen2-VL's
        image grid, the count of a mask selecting tokens), taking a value no kept plan
        was made for: lowered and planned again, for up to `VALUE_REPLANS` values of one
        read besides the lowered one; beyond, integers that differ at most steps (a
        masked loss over a number of tokens each batch draws anew), which would plan at
        every step, are refused with what to do."""
        seen = self.__dict__.setdefault("_integer_reads", {})
        for plan in plans:
            for question, line, lowered, value, buffers in plan.value_guards.integer_reads(answers):
                values = seen.setdefault(question, {json.dumps(lowered)})
                if json.dumps(value) in values:
                    continue
                if len(values) > VALUE_REPLANS and buffers:   # a counter the forward keeps
                    raise RuntimeInputError(
                        f"the model's buffer{'s' if len(buffers) > 1 else ''} {' and '.join(buffers)} "
                        f"give {shown(value)} at {line}, where the forward reads integers from "
                        f"them, and {len(values)} other values were lowered and planned already, "
                        f"a graph each: a buffer changing at every step (a step counter) would "
                        f"plan at every step. Compute with it as a tensor there (torch.where, a "
                        f"mask) instead of reading a Python number from it")
                if len(values) > VALUE_REPLANS:
                    raise RuntimeInputError(
                        f"this call's inputs give {shown(value)} at {line}, where the forward "
                        f"reads integers from them (a size, a count of selected elements), and "
                        f"{len(values)} other values were lowered and planned already, a graph "
                        f"each: make them the same across batches (one image size, a fixed "
                        f"number of masked tokens), compute without them (mask every "
                        f"element's value, torch.where(mask, x, 0), or pass ignore_index= to the "
                        f"loss), or compute what the forward derives from them before the call "
                        f"and pass it in (Qwen2-VL's position ids: position_ids="
                        f"model.model.get_rope_index(...)[0])")
                values.add(json.dumps(value))

    def _count_argument_change(self, signature: Signature) -> None:
        """A call differing from a kept plan's only in plain arguments (a temperature, a
        step number: the trace bakes their values in) is lowered and planned again, for up
        to `VALUE_REPLANS` values of one argument other than the first (a string, up to
        `max_plans` values in all); beyond, one that changes at every step,
        which planned at every step (found by a review), is refused with what to do. Not
        counted: calls whose tensors differ too (a sequence length passed beside the
        batch of that length: each bucket has its plan)."""
        mine = dict(signature.arguments)
        for plan in self._plans.values():
            theirs = dict(plan.signature.arguments)
            if theirs.keys() != mine.keys() or not dataclasses.replace(
                    plan.signature, arguments=signature.arguments, shown=signature.shown).admits(signature):
                continue
            differing = [name for name in mine if mine[name] != theirs[name]]
            if not differing or any(mine[name].startswith("tensor ") for name in differing):
                continue
            changes = self.__dict__.setdefault("_argument_changes", {})
            for name in differing:
                seen = changes.setdefault(name, {theirs[name]})   # with the first one planned
                # A string names one of a few paths (a multi-task model's head by task name):
                # a plan per value, up to as many as are kept. Refused after the fifth, with
                # advice for numbers, before (found by a review).
                naming = mine[name][:1] in ("'", '"')
                if mine[name] not in seen and len(seen) > (self.max_plans - 1 if naming else VALUE_REPLANS):
                    advice = (f"each value is a plan of its own, and at most max_plans={self.max_plans} are "
                              f"kept: keep more plans (`remat(..., max_plans=...)`), or call remat_ir.remat "
                              f"on each path the string chooses (a head per task) and the shared part apart"
                              if naming else
                              f"pass a value that changes between steps as a tensor (`torch.tensor(value)`), "
                              f"which one plan computes with, or call remat_ir.remat again once it stays fixed")
                    raise RuntimeInputError(
                        f"{signature.difference(plan.signature)}; its value is traced into the graph, "
                        f"and it has taken {len(seen) - 1} other values since lowering, each lowered and "
                        f"planned again: {advice}")
                seen.add(mine[name])
            return

    def forward(self, *args, **kwargs):
        if torch.compiler.is_exporting():
            # Lowered as part of a larger model (`remat` of a model holding this module), or
            # the model itself lowered again (`in_place`): the model's own ops are traced.
            return self._call_model(*args, **kwargs)
        if torch.compiler.is_compiling():
            return self._under_torch_compile(*args, **kwargs)
        if torch.jit.is_tracing():
            # hunt74: traced in training mode, each call was taken for a new signature
            # (the tracer's tensors) and lowered again, failing inside torch.export.
            self._tell_once("jit_trace", "remat-ir: traced by torch.jit.trace: the trace records the model's "
                                         "own ops, without the plan (a TorchScript graph cannot hold a remat-ir "
                                         "step), and trains with eager's memory")
            return self._call_model(*args, **kwargs)
        if torch.fx._symbolic_trace.is_fx_symbolic_tracing() and any(
                isinstance(leaf, torch.fx.Proxy) for leaf in pytree.tree_leaves((args, kwargs))):
            # Its tensors FX's proxies (make_fx, which sets the flag too, passes tensors; the
            # flag's own `is_fx_tracing()` logs a warning at its first call).
            raise RematIRError(
                f"torch.fx.symbolic_trace reached a remat-ir module (of {type(self._model).__name__}): its step "
                f"runs a plan of ATen ops from autograd nodes, which symbolic tracing cannot record. Trace the "
                f"model passed to remat_ir.remat instead (and call remat on what the trace makes, to train it "
                f"in less memory), or mark this module a leaf of your tracer (`is_leaf_module`)")
        if not (self._model.training and torch.is_grad_enabled()):
            # The model's own mode decides (`model.eval()` on the model itself, not on this
            # module, is evaluation too): outside training, the model runs as it is.
            if torch.is_grad_enabled() and not self.__dict__.get("_told_eval_with_gradients") \
                    and any(p.requires_grad for p in self._model.parameters()):
                self._tell_once("eval_with_gradients", _EVAL_WITH_GRADIENTS)
            return self._call_model(*args, **kwargs)
        if torch._C._are_functorch_transforms_active():
            return self._under_torch_func(*args, **kwargs)
        if torch.autograd.forward_ad._current_level >= 0:
            # Inside `forward_ad.dual_level()`: dual inputs carry tangents through the ops,
            # which the step's segments (out= kernels, no jvp) cannot (torch's error about
            # `tanh_backward_out`, after the forward segment had run: found by a review).
            self._tell_once("forward_ad", "remat-ir: called inside torch.autograd.forward_ad.dual_level(): "
                                          "the model runs as it is, with eager's memory (forward-mode "
                                          "gradients need the model's own ops)")
            return self._call_model(*args, **kwargs)
        if modes := user_function_modes():   # hunt66: eager's numbers differed, silently
            self._tell_once("function_mode", f"remat-ir: called inside {', '.join(modes)}, a TorchFunctionMode: "
                                             f"the model runs as it is, with eager's memory (a step runs ATen "
                                             f"ops, below the torch functions such a mode sees)")
            return self._call_model(*args, **kwargs)
        self._check_saved_tensor_hooks()
        if torch.is_anomaly_enabled():
            # Found by a review: a NaN inside the backward that a later op masked went by
            # unnoticed, and one reaching a gradient was named at the step's own node.
            self._tell_once("anomaly", "remat-ir: torch.autograd.set_detect_anomaly is on, and a remat-ir "
                                       "step's backward runs its ops outside autograd: anomaly detection "
                                       "sees the gradients it hands over, not the op that made a NaN. To "
                                       "find that op, run the original model (the one passed to "
                                       "remat_ir.remat) under it")
        refused = cached_parametrizations(self._model)
        if refused is not None:
            raise RuntimeInputError(refused)
        if getattr(self._planner, "per_rank", False) and self._sharded():
            raise FSDPUsageError(
                "the ranks planned this module for inputs of different shapes, each its own "
                "plan, and FSDP2 needs one plan on every rank (its gathers and frees follow "
                "the plan): call remat_ir.remat with inputs of the same shapes on every rank "
                "(pad batches to a fixed length), and keep them so, or wrap with DDP, which "
                "takes ranks of different shapes")
        modules = _Submodules(self._model)
        hooks = root_backward_hooks(self._model) if self.runs_root_hooks else None
        if hooks is not None:
            self._check_root_hooks_arguments(args, kwargs)
        plan, answers, checked = self._plan_for(args, kwargs, modules)
        if plan is None:
            return self._call_model(*args, **kwargs)
        parameter_hooks.watch((f"parameter {what!r}", tensor) for (kind, what), tensor
                              in zip(plan.bindings, plan.model_members(modules))
                              if kind == "param" and tensor is not None and (
                                  tensor._backward_hooks or getattr(tensor, "_post_accumulate_grad_hooks", None)))
        if hooks is None:
            return plan.run(self._model, args, kwargs, self._groups(), self, self.backend, answers, modules,
                            model_checked=checked)
        around = BackwardHook(self._model, *hooks)   # as `nn.Module.__call__` runs the root's
        args = around.setup_input_hook(args)
        return around.setup_output_hook(plan.run(self._model, args, kwargs, self._groups(), self, self.backend,
                                                 answers, modules, model_checked=checked))

    def _check_root_hooks_arguments(self, args: tuple, kwargs: dict) -> None:
        """RuntimeInputError where one tensor is passed as two arguments (positional or
        keyword) to a model whose root has backward hooks: eager's hook sees each
        positional argument's part of the gradient, and the step's graph takes the tensor
        once (found by reviews: a hook doubling one part gave x.grad 0.0136 off; passed
        once by keyword, the hook was not called at all)."""
        # Those needing gradients only: an autoencoder's `model(x, x)` gives the hook None
        # for both, as eager's (refused, found by hunt54).
        tensors = [id(arg) for arg in (*args, *kwargs.values()) if isinstance(arg, torch.Tensor) and arg.requires_grad]
        if len(set(tensors)) < len(tensors):
            raise RuntimeInputError(
                f"{type(self._model).__name__} has a full backward hook (or pre-hook) of its own and "
                f"is called with one tensor as two arguments: the hook would see the gradient of "
                f"that tensor whole in one of them, where eager's sees each argument's part. Pass a "
                f"clone as the second (`model(x, x.clone())`), or put the hook on the module "
                f"remat_ir.remat returns")

    def _fail_as_eager(self, error: RematIRError, what: str) -> None:
        """Raise what the model's forward raised on these inputs (transformers' check of the
        labels' range, BatchNorm's of a batch of one), found by one eager forward while
        tracing them to plan (`error.eager_error`, `frontends/tracing_paths.EagerFailure`):
        eager's own exception, with eager's effects set again, so that a training loop
        catching it to skip a bad batch goes on as eager's does. The check put back the
        generators and buffers, which eager's forward had moved before it raised: its
        dropout draws and running statistics (found by a review: every later step's
        gradients 0.12 off, silently)."""
        failure = error.eager_error
        failure.apply()
        failure.exception.add_note(f"remat-ir: raised by {type(self._model).__name__}'s forward, run as it "
                                   f"is where tracing it to plan this call's {what} raised it")
        raise failure.exception from None

    def _call_model(self, *args, **kwargs):
        """The model run as it is. Where this module is what the model's own calls run
        (`route_calls`), its `_call_impl`, which calling it would route back here."""
        model = self._model
        if model.__dict__.get("_compiled_call_impl") is self:
            return model._call_impl(*args, **kwargs)
        return model(*args, **kwargs)

    def route_calls(self) -> None:
        """Make the model's own calls, `model(...)`, run this module, as `module.compile()`
        makes them run the compiled module: the model stays what training tools are given
        (a Hugging Face `PreTrainedModel`: Trainer then saves it with `save_pretrained`,
        reads its `forward`'s signature for label names and unused columns). Through
        nn.Module's `_compiled_call_impl`, which `module.compile()` sets too (so either
        replaces the other) and which copies and pickles of the model leave out: a copy
        is the plain model. Set in the model's dictionary, not as an attribute: nn.Module
        would register this module as the model's submodule, a cycle (`model.to()`
        recursed without end). The model's `compile()` then compiles this module
        (`_compile_routed`): nn.Module's would have replaced the routing with
        `torch.compile` of the model, and its calls ran without the plan, its budget or
        eager's dropout draws, silently (hunt81 F4)."""
        self._model.__dict__["_compiled_call_impl"] = self
        self._model.__dict__["compile"] = types.MethodType(_compile_routed, self._model)

    def _check_saved_tensor_hooks(self) -> None:
        """Saved-tensor hooks around the call see nothing the step keeps (`saved_hooks`):
        `save_on_cpu` is said once to move nothing; other hooks are refused."""
        pack = active_pack_hook()
        if pack is None:
            return
        if allows_mutation_on_saved(pack):
            raise RuntimeInputError(
                "torch.autograd.graph.allow_mutation_on_saved_tensors() is active around this "
                "call: it keeps what autograd saved as it was when a tensor is written in place "
                "before the backward, but a remat-ir step keeps its tensors outside autograd's "
                "saved tensors and recomputes from the inputs and parameters it holds, so such a "
                "write would reach its gradients. Call the module outside the context, and write "
                "into a clone (`x = x.clone()`) where a tensor changes between the forward and "
                "the backward")
        if is_checkpoint(pack):
            raise RuntimeInputError(
                "torch.utils.checkpoint (use_reentrant=False, or a checkpoint_wrapper) is around "
                "this call of a remat-ir module: its saved-tensor hooks would see none of what the "
                "step keeps, and the step itself already recomputes what its plan decides within "
                "its budget. Call the module without the checkpoint (a checkpoint inside the "
                "model is traced as a plain call)")
        if not is_save_on_cpu(pack):
            raise RuntimeInputError(
                f"saved-tensor hooks are set around this call (pack hook {hook_name(pack)}); "
                f"a remat-ir step keeps its tensors outside autograd's saved tensors, so the "
                f"hooks would see none of them, and one that changes values (a cast, a "
                f"quantization) would train otherwise than eager. Call the module outside "
                f"them: {INSTEAD}")
        self._tell_once("save_on_cpu", f"remat-ir: torch.autograd.graph.save_on_cpu around the call moves "
                                       f"nothing of what a remat-ir step keeps (its gradients are eager's): "
                                       f"{INSTEAD}")

    def _tell_once(self, what: str, message: str) -> None:
        """Say `message` at the first call that meets `what`, not at every step (kept in the
        module's dictionary, not an attribute nn.Module would register)."""
        if not self.__dict__.get(f"_told_{what}"):
            self.__dict__[f"_told_{what}"] = True
            (self._notify or notify_stderr)(message)

    def _under_torch_func(self, *args, **kwargs):
        """A call under a `torch.func` transform (`grad`, `vmap`, `jacrev`): the model runs
        as it is, said once. A step's segments run outside autograd, from an autograd
        Function without the `setup_context` the transforms need: such a call failed with
        torch's error about `_Outputs`, after its forward segment had run (BatchNorm's
        statistics updated, the generator advanced: found by a review)."""
        self._tell_once("torch_func", "remat-ir: called under a torch.func transform (grad, vmap, jacrev...): "
                                      "the model runs as it is, with eager's memory (a remat-ir step runs "
                                      "outside autograd, which the transforms build on)")
        return self._call_model(*args, **kwargs)

    @functools.partial(torch.compiler.disable, reason=(
        "a remat-ir step runs its plan from autograd nodes, which Dynamo cannot trace: compile without "
        "fullgraph=True (one graph break here, the step running as planned). A module of "
        "backend=\"inductor\" has its segments compiled already, and needs no torch.compile around it; "
        "with the eager backend, pass backend=\"inductor\" to remat_ir.remat to compile them"))
    def _under_torch_compile(self, *args, **kwargs):
        """`torch.compile(scheduled)`: Dynamo cannot trace the planned segments (they are
        generated code run from autograd nodes), so it hands the whole call over here, one
        graph break, and the step runs as planned. Said once, with what to use instead."""
        if self.backend == "eager":
            self._tell_once("compile", "remat-ir: torch.compile runs a remat-ir module as planned but does "
                                       "not compile its segments; pass backend=\"inductor\" to remat_ir.remat "
                                       "(or ScheduledModule) to compile them with Inductor")
        return self.forward(*args, **kwargs)

    def __prepare_scriptable__(self):
        """`torch.jit.script` of this module (or of a model holding it) compiles the model
        as it is, said once: a remat-ir step runs Python that TorchScript cannot compile
        (hunt74: its error pointed at `forward(self, *args, **kwargs)`), as `torch.export`
        and `torch.jit.trace` record the model's own ops."""
        self._tell_once("jit_script", "remat-ir: torch.jit.script compiles the model as it is, without the "
                                      "plan (TorchScript cannot hold a remat-ir step), training with eager's "
                                      "memory")
        return self._model

    def _sharded(self) -> bool:
        """Whether FSDP2's `fully_shard` was applied to this module."""
        fsdp = fsdp_module_class()
        return fsdp is not None and isinstance(self, fsdp)

    def _groups(self) -> int:
        """How many groups the backward hands gradients in (see the class docstring)."""
        if self.gradient_groups is not None:
            return self.gradient_groups
        return GRADIENT_GROUPS if world_size() > 1 else 1


def world_size() -> int:
    """Processes in torch.distributed's default group (1 when it is not running)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 1
    return torch.distributed.get_world_size()


def check_count(name: str, number) -> None:
    """`number` must be a positive integer (an argument called `name`)."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"{name} must be a positive integer, not {number!r}")


def notify_stderr(message: str) -> None:
    """The default sink of one-line notices (a new input signature planned)."""
    print(message, file=sys.stderr, flush=True)
