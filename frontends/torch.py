"""PyTorch frontend: an `nn.Module` and example inputs -> the joint training graph in the IR.

Path (torch 2.13): `torch.export.export(model, args, strict=False)`, then
`aot_export_joint_with_descriptors` on the exported module, which gives one FX
graph of forward *and* backward with every placeholder and output described
(parameter, buffer, user input, output gradient; user output, parameter
gradient, buffer mutation). Each FX op becomes an IR node carrying its aten
op and all non-tensor arguments, so a runtime can execute the file with only
the parameters and buffers bound by name. Fake-tensor metadata gives exact
shapes, dtypes and the storage each value views (about 40% of GPT-2's nodes
are views; memory is counted once per storage).

The joint graph holds the kernels eager runs where tracing would otherwise
replace them (`_eager_kernels`): AOTAutograd traces under PyTorch's Python
dispatcher, where Python decompositions registered for the Autograd key take
the place of eager's C++ kernels. For upsampling they compute other bits: the
bilinear, bicubic, linear and trilinear decompositions (`_unsafe_index` with
weights computed in Python) gave gradients up to 3e-8 off eager's, and the
nearest-neighbour one, equal in value, returns its backward contiguous where
eager's kernel keeps channels-last, so that a convolution downstream reduced in
another order (the U-Net with one intra-op thread: a bias gradient 1.4e-9 off).
The decomposition of `multilabel_margin_loss_forward` computes another loss
altogether.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import pydoc
import io
import json
import logging
import operator
import re
import sys
import traceback
import warnings
from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import _pytree as pytree

from remat_ir.ir import Graph, pb
from remat_ir.ir.arguments import TensorRef
from remat_ir.ir.memory import is_view
from remat_ir.ir.rng import SHAPE_ONLY_RANDOM_OPS
from remat_ir.ir.validation import mark_made_here

from .autocast_blocks import block_caches, eager_block_caches, has_blocks
from .autocast_casts import CAST_BACK, check_ops_cast_inside, share_autocast_casts
from .applied_code import record_applied_code
from .autograd_functions import (FunctionError, backward_of, forward_of, function_class, op_backward_of,
                                 preserving_functions)
from .buffer_reuse import reuse_dying_inputs
from .default_generators import default_generators_dropped
from .distributed_calls import distributed_calls_watched, rank_read_by_name
from .dropout_masks import split_dropout
from .gradient_buffers import mark_input_gradient_sums
from .rnn_workspaces import size_rnn_workspaces
from .rnn_parametrizations import stateful_rnn_parametrizations
from .fast_paths import eager_fast_paths_noted
from . import (cross_entropy_kernels, cudnn_rnns, dropout_kernels, evenly_kernels, gru_kernels, masked_fill_kernels,
               outside_values, prod_kernels, spectral_kernels, statistics_kernels)
from .export_draws import drawing_as_eager
from .traced_checkpoints import checkpoints_traced_plain
from .script_functions import script_functions_as_python
from .errors import LoweringError
from .fx_nodes import custom_op_definitions, node_module
from .selected_outputs import check_selection, select_outputs
from .cache_outputs import drop_caches, dropped_caches, dropping_caches, fill_dropped_caches, tell_caches
from .model_lines import library_line, model_line, node_line
from .output_aliases import output_aliases
from .overlapping_writes import refusing_overlapping_writes
from .paused_collection import paused_collection
from .python_functions import python_bodies_traced
from .added_members import members_kept
from .constant_arguments import constants_bound, constants_named, refuse_untakable_arguments
from .swapped_parameters import swapped_parameters_as_parameters
from .input_metadata import refusing_input_metadata
from .module_containers import keeping_module_containers
from .tensor_attributes import refusing_tensor_attribute_writes, refusing_tensor_attributes
from .tensor_checks import tensor_checks_as_value_checks
from .inference_buffers import inference_buffers_as_normal
from .random_ops import check_pure_ops, declared_pure, draws_random, opaque_custom_op, user_draws_kept
from .random_branches import HINT as RANDOM_BRANCH_HINT, NUMBER_HINT as RANDOM_NUMBER_HINT, drawn_branch, drawn_number
from .fresh_generators import fresh_generators_noted
from .outside_tensors import OutsideTensorRead, custom_op_backwards_watched
from .refusals import (check_backward_hooks, check_buffers_needing_gradients,
                       check_lazy_modules, check_member_views,
                       check_script_modules, backward_draws_error, backward_effects_error, constant_output,
                       data_error, mutation_error, refusing_autograd_calls, tensor_hook_error, trace_effects_error)
from .tensor_hooks import recording_tensor_hooks
from .inplace_draws import draw_in_layout
from .held_tensors import held_gradient_error, held_tensor_items, lift_held_tensors
from .masked_assign import assign_through_masks
from .metadata_writes import reshape_in_place
from .hook_registrations import registration_hooks_paused
from .statistics_kernels import statistics_traced_as_eager
from .unfold_writes import unwritable_view_error, write_through_unfold_views
from .inplace_layouts import keep_written_layouts, mark_written_layouts, written_layouts_traced
from .ctc_losses import ctc_losses_as_one_op, fold_target_selections
from .spec_augment import spec_augment_as_ops
from .module_casts import unchanged_module_casts
from .certain_draws import certain_draws
from .fake_dispatch import fake_cache_keeping_aliases
from .kernel_layouts import match_kernel_layouts, traced_as_run
from .autograd_contexts import inference_mode_as_grad_mode, noting_saved_tensor_hooks
from .compared_values import keep_compared_values
from .trace_effects import MISSING, data_uses, refusing_trace_effects
from .traced_reads import ANY_OF, TracedReads, record_globals, recording_reads
from .tracing_paths import eager_failure, traced_only_message, tracing_check
from .input_branches import eager_input_branches, integers_as_eager
from .transformers_masks import eager_mask_decisions
from .transformers_paths import eager_paths
from .value_dependent import (SYMBOLIC, data_sized_branch_error, symbolic_number_error,
                              value_dependent_error, watching_data_values)
from .view_compaction import compact_views
from remat_ir.torchlib.described_values import tensor_like
from remat_ir.torchlib.function_modes import user_function_modes
from remat_ir.torchlib.generators import PythonGenerators
from remat_ir.torchlib.held_tensors import shown as held_place
from remat_ir.torchlib.tensor_classes import changes_torch_functions
from remat_ir.torchlib.member_arguments import member_arguments
from remat_ir.torchlib.saved_hooks import INSTEAD
from remat_ir.torchlib.types import (FUNCTION_NAMESPACE, ONCE_PER_STEP, argument_name, argument_names,
                                     autocast_cache, autocast_nested, autocast_state, cast_per_reader,
                                     cpu_kernels_state, describe_input, input_aliases, ir_dtype,
                                     op_name, record_device, raw_bytes, resolve_op, sdpa_state,
                                     to_ir_argument)
from remat_ir.torchlib import model_structure, value_checks
from remat_ir.torchlib.parameter_slots import parameter_slot
from remat_ir.torchlib.parametrize_cache import cached_parametrizations
from remat_ir.torchlib.value_guards import ValueGuards

#: Ops that only check metadata at trace time; they compute nothing and are dropped.
_ASSERT_OPS = ("aten._assert_tensor_metadata", "aten._assert_scalar",
               "aten.sym_constrain_range_for_size")
def _drop_unread(module: torch.fx.GraphModule) -> None:
    """Remove the trace-time checks (`_ASSERT_OPS`), then every pure tensor op whose
    results nothing reads. AOTAutograd leaves some: BART's decoder made a mask of ones
    that only `_assert_tensor_metadata` read, LongT5 a `max` whose results were never
    taken, LiLT a product read by none. The IR kept those nodes, which `ir.validation`
    takes for a file with a graph output removed, so such a model's graph saved to a file
    could not be loaded (found by a hunt). Ops that draw or write are kept for what they do."""
    graph = module.graph
    for node in list(graph.nodes):
        if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and op_name(node.target).startswith(_ASSERT_OPS)):
            graph.erase_node(node)
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and _pure_tensor_op(node):
            graph.erase_node(node)


def _pure_tensor_op(node: torch.fx.Node) -> bool:
    """An aten op (or an item of one's results) that returns tensors, draws from no
    generator and writes into none of its arguments."""
    if node.target is operator.getitem:
        return True
    target, val = node.target, node.meta.get("val")
    results = val if isinstance(val, (tuple, list)) else (val,)
    return (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")
            and not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
            and bool(results) and all(isinstance(r, torch.Tensor) for r in results))


#: Ops that check tensor values at every call (`F.one_hot`'s class range, a user's
#: `torch._assert_async`): each becomes a `remat_ir.value_check` node
#: (`torchlib/value_checks.py`), whose empty result is a VALUE_CHECK output.
_VALUE_CHECK_OPS = ("aten._assert_async",)


def _masked_results(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> set[int]:
    """Positions of the results an op's `output_mask` turns off (a norm's or a
    convolution's backward not asked for the input's gradient): the kernel returns no
    tensor there. Some fake kernels still describe one (native_batch_norm_backward's
    grad_input, torch 2.13), which would be counted as memory no step ever holds: a
    BatchNorm over an input needing no gradient (16x64 floats) made the simulator count
    4 KiB the step never allocated."""
    for i, argument in enumerate(target._schema.arguments):
        if argument.name == "output_mask":
            mask = args[i] if i < len(args) else kwargs.get("output_mask")
            if isinstance(mask, (list, tuple)):
                return {j for j, wanted in enumerate(mask) if wanted is False}
    return set()


#: Ops traced as eager's kernels rather than as their Python decompositions (see the module
#: docstring): every aten overload whose name holds one of these (the upsampling family;
#: `multilabel_margin_loss_forward`, whose decomposition computes another loss: 3.79
#: where eager's kernel gives 1.60 on the same inputs), each with a backward kernel the
#: runtime calls as eager does. Checked bit for bit against eager in
#: tests/test_torch_training.py.
EAGER_KERNEL_OPS = ("upsample", "multilabel_margin_loss", "multi_margin_loss")
#: Recurrent layers traced through eager's C++ implementation, which applies a stacked
#: layer's dropout between its layers, where PyTorch's Python decomposition
#: (`_rnn_helper`) applies none (a 2-layer GRU with dropout 0.25 trained without it,
#: silently, before it was refused; now it trains with eager's masks). The LSTM's with
#: oneDNN on runs oneDNN's layer (`aten.mkldnn_rnn_layer`) in training mode, as eager's
#: does, where the decomposition took plain ops (2e-7 off eager's) or the layer's
#: inference mode (no workspace for its backward): the runtime runs that layer with grad
#: mode on (`runtimes/grad_mode_kernels.py`), and `rnn_workspaces.py` sizes its workspace.
RNN_EAGER_KERNEL_OPS = ("gru", "rnn_tanh", "rnn_relu", "lstm")


@contextlib.contextmanager
def _eager_kernels():
    """While tracing, `EAGER_KERNEL_OPS` dispatch to eager's C++ kernels: their Python
    kernels for the Autograd and CompositeImplicitAutograd keys are set aside, and put
    back on exit."""
    from torch._C import DispatchKey

    keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
    taken, parts = [], EAGER_KERNEL_OPS + RNN_EAGER_KERNEL_OPS
    for name in dir(torch.ops.aten):
        if not any(part in name for part in parts):
            continue
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            for key in keys:
                kernel = op.py_kernels.pop(key, None)
                if kernel is not None:
                    taken.append((op, key, kernel))
                    op._dispatch_cache.clear()
    # The GRU's CPU code computes other bits once traced; its Python version does not.
    # Recurrent layers that would run cuDNN's RNN are refused (`cudnn_rnns`).
    installed = dict(gru_kernels.KERNELS)
    for name in cudnn_rnns.KINDS:
        op = getattr(torch.ops.aten, name).input
        inner = installed.get(op) or functools.partial(op._op_dk, DispatchKey.CompositeImplicitAutograd)
        installed[op] = cudnn_rnns.refusing_cudnn(name, inner)
    for op, kernel in installed.items():
        op.py_kernels[DispatchKey.CompositeImplicitAutograd] = kernel
        op._dispatch_cache.clear()
    # eager's prod backward, by value; eager's istft and cov, op for op; eager's
    # masked_fill value gradient, a sum over the masked elements; eager's weighted and
    # smoothed cross entropy, its weight sum compacted; eager's zeros beside a whole-tensor
    # max's gradient; eager's dropout returning its input where it drops nothing
    replaced = (prod_kernels, spectral_kernels, masked_fill_kernels, statistics_kernels, cross_entropy_kernels,
                evenly_kernels, dropout_kernels)
    for module in replaced:
        for op, kernel in module.KERNELS.items():
            if (old := op.py_kernels.get(module.KEY)) is not None:
                taken.append((op, module.KEY, old))
            op.py_kernels[module.KEY] = kernel
            op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op in installed:
            op.py_kernels.pop(DispatchKey.CompositeImplicitAutograd, None)
            op._dispatch_cache.clear()
        for module in replaced:
            for op in module.KERNELS:
                op.py_kernels.pop(module.KEY, None)
                op._dispatch_cache.clear()
        for op, key, kernel in taken:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()


@contextlib.contextmanager
def _lstm_as_eager_while_exporting():
    """While torch.export traces, `aten.lstm.input` runs eager's C++ kernel under the
    caller's oneDNN and cuDNN settings, so that an LSTM under autocast returns eager's dtype
    (checked on CPU; on CUDA, eager's cuDNN LSTM casts under autocast too).

    Why: with oneDNN on, eager's CPU LSTM computes in bfloat16 under `torch.autocast("cpu")`
    and returns bfloat16 (its oneDNN path casts; with oneDNN off it stays float32). Export's
    trace ran PyTorch's Python decomposition (registered at the Autograd key, above
    autocast's), with oneDNN off (torch.export turns it off while it traces): float32. The
    joint graph computes in bfloat16 (it traces eager's kernel: `_eager_kernels`), but the
    forward's Python saw float32 where eager sees bfloat16: `y * w.to(y.dtype)` was traced
    as a float32 product, 5% off eager's output, silently (random networks under autocast
    found it as a masked assignment of mismatched dtypes)."""
    from torch._C import DispatchKey

    # The caller's settings; torch.export turns oneDNN and cuDNN off while it traces.
    settings = torch._C._get_mkldnn_enabled(), torch._C._get_cudnn_enabled()
    op, taken = torch.ops.aten.lstm.input, []

    def kernel(*args):
        if args[0].device.type != "cpu":   # cuDNN's RNN cannot be traced (`cudnn_rnns`)
            return decompositions[DispatchKey.CompositeImplicitAutograd](*args)
        during = torch._C._get_mkldnn_enabled(), torch._C._get_cudnn_enabled()
        torch._C._set_mkldnn_enabled(settings[0]), torch._C._set_cudnn_enabled(settings[1])
        try:
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args)
        finally:
            torch._C._set_mkldnn_enabled(during[0]), torch._C._set_cudnn_enabled(during[1])
    decompositions = dict(op.py_kernels)
    for key in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd):
        if (decomposition := op.py_kernels.get(key)) is not None:
            taken.append((key, decomposition))
            op.py_kernels[key] = kernel
    op._dispatch_cache.clear()
    try:
        yield
    finally:
        for key, decomposition in taken:
            op.py_kernels[key] = decomposition
        op._dispatch_cache.clear()


@contextlib.contextmanager
def _value_checks_kept():
    """While AOTAutograd traces, `aten._assert_async.default` (`torch._assert_async(t)`
    without a message) counts as an op with an effect, as its overload with a message does
    in PyTorch, and so does `remat_ir.value_check` (`raising_checks.py`): else the joint
    graph's dead-code pass drops them, and the step never checked."""
    effects = torch.fx.node._side_effectful_functions
    added = {torch.ops.aten._assert_async.default, torch.ops.remat_ir.value_check.default} - effects
    effects.update(added)
    try:
        yield
    finally:
        effects.difference_update(added)


#: Ops with an effect that AOTAutograd threads through a token (`with_effects`) and the
#: lowering turns into checks on values (`_Converter.effect`): `torch.linalg`'s checked
#: ops (inv, solve, cholesky, ...) raise on a singular input through this one.
_CHECKS_WITH_EFFECTS = (torch.ops.aten._linalg_check_errors.default,)


#: What to do with a sparse tensor, which the IR has no layout for.
_DENSE_ONLY = ("remat-ir lowers dense tensors only: pass a sparse matrix (a graph's "
               "adjacency) dense, made with `.to_dense()` before the call or held as a dense "
               "buffer, and use `torch.mm` on it; for nn.Embedding or EmbeddingBag with "
               "sparse=True (sparse gradients), pass sparse=False")
#: The same for a nested (jagged) tensor (found by a review: given the sparse advice).
_STRIDED_ONLY = ("remat-ir lowers dense tensors only: pass a padded tensor "
                 "(`nested.to_padded_tensor(0.0)`) and a mask of the padding")


def _dense_advice(layout) -> str:
    return _STRIDED_ONLY if layout == torch.jagged else _DENSE_ONLY


def _untraceable_said(model: torch.nn.Module, refused: LoweringError) -> LoweringError | None:
    """Where lowering failed (`refused`), the same error with the model's tensors and
    modules tracing cannot take named after it (hunt73: a quantized buffer or
    `quantize_dynamic`'s Linear met "data-dependent control flow", a sparse, quantized or
    subclass tensor held as a plain attribute torch's own words), or None where it holds
    none. Said after the failure, not as its cause: one the forward never reads lowers
    (hunt75: refused upfront, float helpers under `torch.ao.nn.quantized` and unused
    modules were refused, and an unread sparse tensor was blamed for another failure)."""
    said = [f"'{held_place(*place)}', a {kind} held as a plain attribute"
            for tensor, place in held_tensor_items(model) if (kind := _untraceable_kind(tensor))]
    said += [f"{what} {name!r}, a {kind}" for what, named in (("parameter", model.named_parameters()),
                                                               ("buffer", model.named_buffers()))
             for name, tensor in named if tensor.is_quantized and (kind := _untraceable_kind(tensor))]
    said += [f"submodule {path!r}, a {type(module).__module__}.{type(module).__qualname__}"
             for path, module in model.named_modules()
             if type(module).__module__.startswith("torch.ao.nn.quantized")
             and not type(module).__name__.endswith("FloatFunctional")]   # float add and cat helpers
    if not said:
        return None
    return LoweringError(f"{refused} ({type(model).__name__} holds {'; '.join(said)}, which remat-ir's tracing "
                         f"cannot take: it traces dense float tensors of torch.Tensor itself. If the forward "
                         f"reads one, hold a dense float tensor (`.to_dense()`, `.dequantize()`, "
                         f"`.as_subclass(torch.Tensor)`) or compute what it stands for in the forward; "
                         f"train a quantized model as the float model, quantized afterwards (quantization-aware "
                         f"training's fake-quant modules, `prepare_qat`, are traced))")


def _raise_said(model: torch.nn.Module, refused: LoweringError):
    """Raise `refused`, with what `_untraceable_said` names after it where it names any."""
    said = _untraceable_said(model, refused)
    if said is None:
        raise refused
    raise said from None


def _untraceable_kind(tensor: torch.Tensor) -> str | None:
    """What makes `tensor` one tracing cannot take (sparse, quantized, a subclass changing
    torch's functions), or None."""
    return (f"{tensor.layout} tensor" if tensor.layout != torch.strided else
            f"quantized ({tensor.dtype}) tensor" if tensor.is_quantized else
            f"{type(tensor).__module__}.{type(tensor).__qualname__}, a torch.Tensor subclass"
            if changes_torch_functions(tensor) else None)


def _check_dense_members(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """LoweringError naming a sparse parameter, buffer or input before tracing: a GCN's
    CSR adjacency buffer failed inside AOTAutograd ("Sparse CSR tensors do not have
    is_contiguous"), a COO one with advice about embeddings (found by a review); or an
    input of a tensor subclass."""
    named = [*(("parameter", n, t) for n, t in model.named_parameters()),
             *(("buffer", n, t) for n, t in model.named_buffers()),
             *(("input", argument_name(path), t) for path, t in pytree.tree_flatten_with_path((args, kwargs))[0]
               if isinstance(t, torch.Tensor))]
    for path, module in model.named_modules():
        # Its sparse backward selects the rows apart from padding with a `nonzero`, which
        # stopped the trace first: refused as a data-dependent op "in the forward", with
        # advice on masks (hunt76); without padding_idx the graph's check below names it.
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse \
                and module.padding_idx is not None and module.weight.requires_grad:
            raise LoweringError(f"{type(model).__name__}'s {type(module).__name__} {path!r} has sparse=True: "
                                f"its backward makes a sparse gradient, and remat-ir lowers dense "
                                f"tensors only; pass sparse=False")
    for kind, name, tensor in named:
        if tensor.layout != torch.strided:
            raise LoweringError(f"{type(model).__name__}'s {kind} {name!r} is a {tensor.layout} "
                                f"tensor; {_dense_advice(tensor.layout)}")
        if (kind == "input" and type(tensor) not in (torch.Tensor, torch.nn.Parameter)) or \
                changes_torch_functions(tensor):
            # Traced as a plain tensor: what its class does (`__torch_function__`, a branch
            # on `isinstance`) was not in the graph, 0.36 off eager's output (a review). A
            # parameter's or buffer's was refused as reading `.grad`, or as a RecursionError
            # of another path while traced (hunt63).
            kind_name = f"{type(tensor).__module__}.{type(tensor).__qualname__}"
            instead = "pass `x.as_subclass(torch.Tensor)`" if kind == "input" else \
                f"hold a plain {'nn.Parameter' if kind == 'parameter' else 'tensor'} and do what the subclass " \
                f"does in the forward"
            raise LoweringError(f"{type(model).__name__}'s {kind} {name!r} is a {kind_name}, a "
                                f"torch.Tensor subclass: remat-ir traces plain tensors, and what the "
                                f"subclass changes would not be in the graph; {instead}")


def _check_dense(module: torch.fx.GraphModule, model: str) -> None:
    """LoweringError naming the model's line where the forward makes a sparse tensor
    (`torch.sparse_coo_tensor`, `to_sparse`): found by a review, a GCN building its
    adjacency in the forward failed with torch's "Cannot access storage of
    SparseTensorImpl" from deep inside the lowering, naming nothing."""
    for node in module.graph.nodes:
        fake = node.meta.get("val") if node.op == "call_function" else None
        if isinstance(fake, torch.Tensor) and fake.layout != torch.strided:
            where = node_line(node) or node_module(node)
            if node.meta.get("partitioner_tag") == "is_backward":   # a sparse gradient
                raise LoweringError(
                    f"{model}'s backward makes a {fake.layout} tensor (a sparse gradient, of the "
                    f"op{f' at {where}' if where else ''}): remat-ir lowers dense tensors only; "
                    f"for nn.Embedding or EmbeddingBag with sparse=True, pass sparse=False")
            raise LoweringError(f"{model}'s forward makes a {fake.layout} tensor "
                                f"({node.target}{f', at {where}' if where else ''}); {_dense_advice(fake.layout)}")


def _is_distribution(kind: str) -> bool:
    """Whether the class named `kind` (export's 'module.Class') is a torch.distributions
    distribution, a user's subclass (`TanhNormal(Normal)`) too (found by a review)."""
    if kind.startswith("torch.distributions."):
        return True
    found = pydoc.locate(kind)
    return isinstance(found, type) and issubclass(found, torch.distributions.Distribution)


def _check_effects(module: torch.fx.GraphModule, model: str) -> None:
    """LoweringError naming an op with a side effect, which AOTAutograd threads through a
    token (`with_effects`), other than the checks lowered as such (`_CHECKS_WITH_EFFECTS`):
    the graph would need the token as an input, which a step of remat-ir does not have."""
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.with_effects:
            op = node.args[1]
            backward = node.meta.get("partitioner_tag") == "is_backward"
            if op in _CHECKS_WITH_EFFECTS and not backward:
                continue
            if op in _CHECKS_WITH_EFFECTS:
                # Found by a review: `torch.linalg.eigvals` of a parameter was refused as a
                # call "in its forward" to an op the user never wrote.
                where = node_line(node) or node_module(node)
                raise LoweringError(
                    f"{model}'s backward checks a matrix for singularity (torch.linalg's "
                    f"{op.__name__.split('.')[0]}, in the derivative of an op such as "
                    f"torch.linalg.eig or eigvals{f', at {where}' if where else ''}), which "
                    f"remat-ir runs in the forward only: compute that op outside the module "
                    f"given to remat_ir.remat, or of a tensor that needs no gradient")
            raise LoweringError(
                f"{model} calls {op} ({node_module(node) or 'in its forward'}), an op with a side "
                f"effect that tracing orders through a token, which remat-ir cannot lower: "
                f"call it outside the model")


def _tied(named) -> list[list[str]]:
    """The groups of names under which `named` (`named_parameters` or `named_buffers`,
    duplicates kept) holds one tensor, each sorted."""
    names: dict[int, list[str]] = {}
    for name, tensor in named:
        if tensor is not None:
            names.setdefault(id(tensor), []).append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def _check_something_trains(graph: Graph, model: str) -> None:
    """LoweringError where the step computes no gradient: a forward returning None, a
    number or only tensors without a gradient path (`detach()`, `no_grad`) was accepted
    with an empty graph, or planned into a refusal that named the whole step's peak as
    the smallest budget."""
    roles = {pb.PARAMETER_GRADIENT, pb.INPUT_GRADIENT}
    if any(o.role in roles for o in graph.proto.outputs):
        return
    returned = [graph.value(o.value_id) for o in graph.proto.outputs if o.role == pb.USER_OUTPUT]
    what = (f"{len(returned)} tensor output(s), none of which depends with a gradient on a "
            f"parameter or an input that requires one" if returned else "no tensor")
    # An imported ONNX graph's parameters are its float initializers: PyTorch's advice
    # (detach, no_grad) means nothing there (found by a review).
    advice = ("The ONNX graph's outputs depend on none of its float initializers through "
              "differentiable ops: train its Constant nodes too (trainable='constants', the "
              "command line's --trainable constants)"
              if model == "OnnxModule" else
              "Return the loss, or the tensors it is computed from, without detach() or "
              "torch.no_grad() around them, and with parameters that require gradients (to train "
              "an input through a frozen model, an adversarial perturbation: pass an example "
              "input that requires a gradient, as the training calls will)")
    raise LoweringError(
        f"{model} computes no gradient: its forward returns {what}, so a training step has "
        f"nothing to compute in its backward and nothing to plan. {advice}")


def _export(model: torch.nn.Module, args: tuple, kwargs: dict,
            reads: TracedReads) -> torch.export.ExportedProgram:
    """torch.export's program of `model`, or one LoweringError. Plain values the forward
    assigns to module attributes (`trace_effects`) are left on the model, as eager's call
    leaves them, and the model is traced again from them: the program is kept where the
    forward then assigns the values they hold and the program is the same, so that every
    call runs it, the first included (a window clamped to the input's shape before it is
    used). Where the forward then assigns nothing new but the program differs (a first
    call's setup behind a flag it sets, a value used before it is assigned), the
    attributes are put back and the first trace's program kept, the runtime assigning them
    after each of its calls (`_first_call_setup`): the next call plans again. Else they
    are put back and the forward refused (a counter: traced again, it assigns another
    value). Plain values the forward changes in the user's globals and
    closures are traced again alike (`outside_values`): a counter is refused, a first
    call's setup kept."""
    check_backward_hooks(model)
    check_buffers_needing_gradients(model)
    check_member_views(model, args, kwargs)
    check_script_modules(model)
    check_lazy_modules(model)
    assigned: dict = {}
    outside = outside_values.Snapshot(model)
    exported, kept = _trace_eager_paths(model, args, kwargs, reads, assigned)
    traced = outside_values.Snapshot(model)
    if reads.stored.places:
        _read_either_stored(model, args, kwargs, reads, kept, exported)
    if not assigned and not outside.changed(traced):
        reads.assigned_after = _assigned_each_call(reads)
        return exported
    modules = dict(model.named_modules())
    for (path, key), (value, _, _) in assigned.items():
        setattr(modules[path], key, value)
    again, first, before, traced_first = {}, _program(exported), reads.copy(), exported
    reads.clear()
    try:
        exported = _trace(model, args, kwargs, reads, again, [], kept)
        said = [f"it assigns module attribute {key!r} of {type(modules[path]).__name__} at {where} "
                f"({assigned[(path, key)][0] if (path, key) in assigned else was!r}, then "
                f"{value!r} when traced again)" for (path, key), (value, where, was) in again.items()]
        counters = outside_values.counters(outside, traced, outside_values.Snapshot(model))
        if said or counters:
            outside_values.put_back([change for change, _ in counters])
            raise trace_effects_error(type(model).__name__, said + [text for _, text in counters])
        if not _same_program(_program(exported), first):
            setup = _first_call_setup(assigned, modules, before)
            if setup is not None and not outside_values.changes(outside, traced, computed_with=True):
                # A first call's setup behind a flag it then sets (Glow's ActNorm:
                # `if not self.inited: <initialise from the batch>; self.inited = True`):
                # the first trace's program, for calls that find the flag as it was; the
                # runtime sets it after each (`torch.assigned_after`), and the next call,
                # reading it set, plans again. Refused before, as a counter (hunt61).
                _put_back(model, assigned)
                reads.take(before)
                for path, key, _ in setup:   # as read: either value (`_as_left`) planned nothing again
                    held = reads.modules[(path, key)]
                    reads.modules[(path, key)] = held[ANY_OF][0] if isinstance(held, dict) and ANY_OF in held else held
                reads.assigned_after = setup
                return traced_first
            said = [f"it assigns module attribute {key!r} of {type(modules[path]).__name__} at "
                    f"{where} after computing with it: eager's first call computes with {was!r}, "
                    f"later ones with {value!r}" for (path, key), (value, where, was) in assigned.items()]
            settled = outside_values.changes(outside, traced, computed_with=True)
            outside_values.put_back([change for change, _ in settled])
            raise trace_effects_error(type(model).__name__, said + [text for _, text in settled])
    except LoweringError:
        _put_back(model, assigned)
        raise
    reads.either(before)   # both traces made this program: the values either read lead to it
    reads.assigned_after = _assigned_each_call(reads)
    return exported


def _assigned_each_call(reads: TracedReads) -> list:
    """[[module path, attribute, value]] of the plain values the forward assigns where they
    are now (`reads.settled`), which the runtime assigns after each call, as eager's forward
    does at each: a caller may change them between calls (`model.train()` after a forward
    setting `self.teacher.training`), and a plan made for another value (`self.tau = tau`
    for an argument) leaves its own. Left on the model at lowering alone, a call of a plan
    kept for an earlier value left the attribute at the last value lowered (hunt77 F4:
    a loss read `model.tau` 0.5 where eager's had 1.0, 4x off)."""
    return [[path, key, value] for (path, key), value in sorted(reads.settled.items())]


def _first_call_setup(assigned: dict, modules: dict, reads: TracedReads) -> list | None:
    """[[module path, attribute, value]] of the plain values (bool, int, float, str, None)
    the forward assigned (`assigned`, as `_export` keeps it), which the runtime assigns
    after a call; None where one is another kind of value, on a module eager would not
    find at that path, or one whose read `reads` did not record: the next call would not
    plan again for it (hunt62: a flag read by `getattr(self, "inited", False)` or
    `self.__dict__.get`, absent before the first call, re-initialised at every step, 2.08
    off eager, silently)."""
    setup = []
    for (path, key), (value, _, _) in sorted(assigned.items()):
        if type(value) not in (bool, int, float, str, type(None)) or value != value or path not in modules \
                or (path, key) not in reads.modules:
            return None
        setup.append([path, key, value])
    return setup


def _read_either_stored(model: torch.nn.Module, args: tuple, kwargs: dict, reads: TracedReads,
                        kept: frozenset, exported: torch.export.ExportedProgram) -> None:
    """What the forward read of the attributes it stores tensors on (`stored_tensors`),
    before storing: Qwen2-VL asks `self.rope_deltas is None`, None when lowered and a
    tensor after every call. The model is traced again with a tensor of each stored one's
    shape there. Where the program is the same, each read is recorded as either: what it
    held, or a tensor of the stored one's shape, dtype and device (else the runtime
    would plan again at the second call; a stored tensor of another shape, which the
    forward may branch on, is a change as any). Where it differs, the reads stay, and a
    call after the first is planned again (or refused by name); but where the forward
    found out otherwise than by reading the attribute (`"prev" in self.__dict__`),
    nothing recorded would tell the second call apart, and lowering refuses, saying to
    call the model once first (found by a review: the second call computed 0.476 where
    eager's gave 0.952)."""
    modules = dict(model.named_modules())
    places = list(reads.stored.places)
    held = {place: vars(modules[place[0]]).get(place[1], MISSING) for place in places}
    for place, tensor in held.items():
        if place not in reads.modules and isinstance(tensor, torch.Tensor):
            # Stored by an earlier call: a tensor, which reads record by its metadata.
            reads.modules[place] = tensor_like(tensor.shape, tensor.dtype, tensor.device)
    def same_with_stand_ins(standing: list) -> bool:
        """Whether the model traced with a stand-in at each of `standing` makes the same program."""
        assigned: dict = {}
        try:
            for place, tensor in reads.stored.stand_ins().items():
                if place in standing:
                    setattr(modules[place[0]], place[1], tensor)
            again = _trace(model, args, kwargs, TracedReads(), assigned, [], kept)
        except LoweringError:
            again = None
        finally:
            _put_back(model, assigned)
            _put_back(model, {place: (None, None, was) for place, was in held.items()})
        return again is not None and _same_program(_program(again), _program(exported))

    if same_with_stand_ins(places):
        for place in places:   # either what it held, or a tensor of the stored one's metadata
            if place in reads.modules:
                _, shape, dtype, device = reads.stored.places[place]
                reads.modules[place] = {ANY_OF: [reads.modules[place], tensor_like(shape, dtype, device)]}
        return
    unread = [place for place in places if place not in reads.modules]
    # The program changed, but maybe by what the forward read alone (a table cached on an
    # attribute, rebuilt where it is None), which the next call tells apart: the unread ones
    # traced again alone. A logged statistic stored beside such a table was blamed before
    # (hunt80 F5).
    if unread and len(unread) < len(places) and same_with_stand_ins(unread):
        return
    if unread:
        raise LoweringError(
            f"{type(model).__name__}'s forward computes otherwise once it has stored "
            + ", ".join(f"a tensor on {described}" for place, described in
                        zip(places, reads.stored.described()) if place in unread)
            + ", and it finds that out without reading the attribute (`'name' in "
              "self.__dict__`?), which remat-ir cannot check at the next call: call the model "
              "once before remat, so that lowering sees it stored")


def _program(exported: torch.export.ExportedProgram) -> tuple[str, list]:
    """What tells two traces' programs apart: the graph's text, and the values of the
    constants it lifted (`torch.tensor([TAB["v"]])` is a constant, not in the text: a
    value changed after the forward computed with it passed as settled, and the second
    trace's constant trained from step 1, silently; review R5)."""
    return str(exported.graph), [(name, value.detach().clone() if isinstance(value, torch.Tensor) else value)
                                 for name, value in sorted(exported.constants.items())]


def _same_program(a: tuple[str, list], b: tuple[str, list]) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(
        x[0] == y[0] and (_same_values(x[1], y[1]) if isinstance(x[1], torch.Tensor) else x[1] is y[1])
        for x, y in zip(a[1], b[1]))


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN equal to NaN."""
    if not isinstance(b, torch.Tensor) or (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    return torch.equal(a, b)


#: Inputs or buffers sharing memory, one written in place by the forward, said for the user.
_SHARED_WRITTEN_INPUTS = (
    "the example inputs share memory (one is a view of another, two slices of one storage, or "
    "the same tensor passed twice), or two of the model's buffers do, and the forward writes "
    "into one in place; remat-ir lowers inputs and buffers that are separate tensors: pass "
    "separate ones (clone one)")


def _refuse_written_alias(graph: Graph, aliases: tuple[tuple[str, ...], ...]) -> None:
    """Refuse a graph lowered with one tensor passed as two arguments (`aliases`, by
    argument name) where the forward writes into it: the runtime refuses every call of
    such inputs (`written_argument_shared`), so remat() accepted a plan that its own
    example could not run (found by a review)."""
    aliased = {name for group in aliases for name in group}
    if not aliased:
        return
    updated = {output.name for output in graph.proto.outputs if output.role == pb.BUFFER_UPDATE}
    if any(entry.name in updated and entry.argument_name in aliased for entry in graph.proto.inputs):
        raise LoweringError(_SHARED_WRITTEN_INPUTS)


def _put_back(model: torch.nn.Module, assigned: dict) -> None:
    """The module attributes a trace assigned (`trace_effects`) as they were before it."""
    modules = dict(model.named_modules())
    for (path, key), (_, _, was) in assigned.items():
        if was is MISSING:
            delattr(modules[path], key)
        else:
            setattr(modules[path], key, was)


def _eager_failure(model: torch.nn.Module, args: tuple, kwargs: dict, assigned: dict):
    """`eager_failure` of the model as the trace found it: the attributes the failed trace
    assigned put back first (its members are, `added_members`). An eager run on what the
    trace left (a cache's length set to the new one, its table not grown) raised where
    eager's does not, and the refusal said that eager's forward raises it too (hunt80 F1,
    an older transformers rotary cache grown for a longer batch)."""
    _put_back(model, assigned)
    assigned.clear()
    return eager_failure(model, args, kwargs)


def _trace_eager_paths(model: torch.nn.Module, args: tuple, kwargs: dict, reads: TracedReads,
                       assigned: dict) -> tuple[torch.export.ExportedProgram, frozenset]:
    """torch.export's program on eager's code path in transformers' models
    (`transformers_paths`), and the call sites of the checks left to export's answer.
    Where eager's path cannot be traced, the last call site whose answer changed keeps
    export's, one more at each try; the sites kept are said in a warning."""
    kept: frozenset = frozenset()
    first: LoweringError | None = None   # eager's path's refusal
    while True:
        changed: list[str] = []
        try:
            exported = _trace(model, args, kwargs, reads, assigned, changed, kept)
        except LoweringError as refused:
            if not changed:
                # Export's paths failed too: what stops eager's, the one the model runs, is
                # said (SwitchTransformers' experts loop over a count read from data; export's
                # path then failed on a mask transformers leaves None there, which was said).
                raise first or refused
            first = first or refused
            reads.clear()
            _put_back(model, assigned)
            assigned.clear()
            kept |= {changed[-1]}
            failure = str(refused).splitlines()[0]
            failure = failure if len(failure) <= 240 else f"{failure[:240]}..."
            continue
        if kept:
            warnings.warn(f"{type(model).__name__} takes other code paths under torch.export "
                          f"than eager where {'; '.join(sorted(kept))}, and eager's could not "
                          f"be traced ({failure}): the graph computes export's path there, "
                          f"whose results may differ from eager's", stacklevel=5)
        return exported, kept


@contextlib.contextmanager
def _library_ops_as_ops():
    """Within: library code that has no fixed shapes, or draws from a host generator, when
    traced is traced as remat-ir's ops (the CTC loss, transformers' SpecAugment masks), and
    the LSTM as eager's C++ kernel (`_lstm_as_eager_while_exporting`)."""
    with ctc_losses_as_one_op(), spec_augment_as_ops(), _lstm_as_eager_while_exporting():
        yield


@contextlib.contextmanager
def _tensors_python_side(model: torch.nn.Module, args: tuple, kwargs: dict, hook_calls: list[str]):
    """Within: what the forward does with tensors' Python side, which no trace keeps,
    noted (gradient hooks put on them: `tensor_hooks`) or refused (Python attributes the
    model's tensors carry, read, and the forward's own, set: `tensor_attributes`; how the
    caller made an input, read: `input_metadata`)."""
    with recording_tensor_hooks(hook_calls), refusing_tensor_attributes(model, args, kwargs), \
            refusing_tensor_attribute_writes(model), refusing_input_metadata(model):
        yield


def _exported(model: torch.nn.Module, args: tuple, kwargs: dict, reads: TracedReads) -> torch.export.ExportedProgram:
    """torch.export's program, its `torch.autocast` blocks holding eager's cache settings
    (`autocast_blocks`), the rank the forward reads recorded and a collective it calls
    refused (`distributed_calls`), `torch.cov` traced as eager computes it
    (`statistics_kernels`), the containers the modules hold the same objects after it
    (`module_containers`), torch's default generator given by name drawn from as without
    it (`default_generators`), the members it makes taken out and refused
    (`added_members`), Python functions with torch's override prologue run under every
    mode (`python_functions`; around export alone: an eager run telling a model's own error
    from tracing's runs without it), NumPy scalars and torch dtypes among the arguments
    handed over as names (`constant_arguments`). Contexts of their own: `_trace`'s
    with-statement is at Python's limit of nested blocks."""
    named_args, named_kwargs, constants = constants_named(args, kwargs)
    with members_kept(model), eager_block_caches(), distributed_calls_watched(model, reads.globals), \
            statistics_traced_as_eager(), \
            keeping_module_containers(model), default_generators_dropped(), \
            dropping_caches(args, kwargs) as caches, python_bodies_traced(), constants_bound(model, constants):
        exported = torch.export.export(model, named_args, named_kwargs, strict=False)
        drop_caches(exported, caches)
        return exported


def _returned_input(result) -> list | None:
    """["param" | "buffer", name] or ["input", leaf position] of a joint graph's output
    that is one of its inputs as it is (open_clip's SigLIP returns its `logit_bias`
    parameter, a VAE its input: found by hunt59, refused before), else None."""
    if not isinstance(result, torch.fx.Node) or result.op != "placeholder":
        return None
    return _member(result.meta.get("desc"))


def _member(desc) -> list | None:
    """`_returned_input`'s answer for a joint graph input's descriptor."""
    kind = type(desc).__name__
    if kind in ("ParamAOTInput", "BufferAOTInput"):
        return ["param" if kind == "ParamAOTInput" else "buffer", desc.target]
    if kind == "PlainAOTInput":
        return ["input", desc.idx]
    return None


def _trace(model: torch.nn.Module, args: tuple, kwargs: dict, reads: TracedReads,
           assigned: dict, changed: list[str], kept: frozenset) -> torch.export.ExportedProgram:
    """torch.export's program, on eager's code path in transformers' models except at the
    call sites in `kept`; the call sites whose answer that changed are appended to
    `changed` (`transformers_paths`). An attention layer eager would run on PyTorch's
    inference fast path is refused (`fast_paths`; a block of its own: `_traced`'s
    with-statement is at Python's limit of nested blocks)."""
    fast: list[str] = []
    with eager_fast_paths_noted(model, fast):
        exported = _traced(model, args, kwargs, reads, assigned, changed, kept)
    if fast:
        raise LoweringError(fast[0])
    return exported


def _traced(model: torch.nn.Module, args: tuple, kwargs: dict, reads: TracedReads,
            assigned: dict, changed: list[str], kept: frozenset) -> torch.export.ExportedProgram:
    """`_trace` but for fast paths."""
    errors: list = []
    hook_calls: list[str] = []
    effects: list[str] = []
    saved_hooks: list[tuple[str, bool]] = []
    number_reads: list[str] = []
    # A failed torch.export prints the graph traced so far to stderr (hundreds of lines
    # above the error): kept out; whatever else it writes there goes through.
    printed, failure = io.StringIO(), None
    try:
        with _quiet_tracing(printed), preserving_functions(errors, reads.functions), \
                recording_reads(model, reads), _tensors_python_side(model, args, kwargs, hook_calls), \
                refusing_trace_effects(model, effects, assigned, reads.python_draws, reads.stored,
                                       reads.settled), \
                drawing_as_eager(), \
                eager_mask_decisions(model, args, kwargs, reads.decisions), \
                eager_input_branches(model, args, kwargs, reads.decisions), \
                eager_paths(changed, kept), inference_mode_as_grad_mode(), \
                noting_saved_tensor_hooks(saved_hooks), watching_data_values(type(model).__name__, number_reads), \
                refusing_autograd_calls(type(model).__name__), unchanged_module_casts(type(model).__name__), \
                refusing_overlapping_writes(type(model).__name__), swapped_parameters_as_parameters(model), \
                inference_buffers_as_normal(model), tensor_checks_as_value_checks(type(model).__name__), \
                _library_ops_as_ops():
            exported = _exported(model, args, kwargs, reads)
    except Exception as exc:
        failure = exc
    partial = getattr(failure, "partial_fx_graph", None)
    sys.stderr.write(printed.getvalue().replace(f"{partial}\n", "") if partial else printed.getvalue())
    if isinstance(failure, FunctionError):
        raise LoweringError(f"{failure} (in {type(model).__name__})") from None
    if isinstance(failure, LoweringError):   # a refusal of the tracing hooks, said whole
        raise failure.with_traceback(None) from None
    if errors:   # before export's own failure, which may follow from the Function run as is
        raise LoweringError(f"{errors[0]} (in {type(model).__name__})")
    if isinstance(failure, AssertionError) and (held := held_gradient_error(model)) is not None:
        raise held from None   # export's own assertion follows from it
    if failure is not None:
        raise _export_failure(type(model).__name__, failure, lambda: _eager_failure(model, args, kwargs, assigned),
                              number_reads)
    if hook_calls:
        raise tensor_hook_error(type(model).__name__, hook_calls,
                                root_hooks=bool(model._forward_hooks or model._forward_pre_hooks))
    if effects:
        raise trace_effects_error(type(model).__name__, effects)
    _check_saved_tensor_hooks(type(model).__name__, saved_hooks)
    return exported


class _UnlocatedSymbols(logging.Filter):
    """Drops torch's warning that it found no user line for a data-dependent symbol
    (`Unable to find user code corresponding to {u0}`): logged through torch's own handler,
    which `redirect_stderr` does not reach, at every integer read of tensor data that the
    tracing hooks answer as eager's (`input_branches`), where nothing is wrong; a read that
    stays data-dependent is refused with its model line (`_export_failure`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to find user code corresponding to")


@contextlib.contextmanager
def _quiet_tracing(printed: io.StringIO):
    """stderr into `printed`, and torch's warnings of unlocated symbols dropped."""
    logger, quiet = logging.getLogger("torch.fx.experimental.symbolic_shapes"), _UnlocatedSymbols()
    logger.addFilter(quiet)
    try:
        with contextlib.redirect_stderr(printed):
            yield
    finally:
        logger.removeFilter(quiet)


def _check_saved_tensor_hooks(model: str, entered: list[tuple[str, bool]]) -> None:
    """Refuses saved-tensor hooks the forward sets, which the graph does not keep
    (`autograd_contexts`); `save_on_cpu` keeps values exactly and is warned about."""
    changing = [where for where, exact in entered if not exact]
    if changing:
        raise LoweringError(
            f"{model}'s forward sets saved-tensor hooks at {changing[0]}; the traced step keeps "
            f"no trace of them, so a pack hook that changes what it keeps (a cast, a "
            f"quantization) would train otherwise than eager. Remove them from the forward: "
            f"{INSTEAD}")
    if entered:
        warnings.warn(f"{model}'s forward enters torch.autograd.graph.save_on_cpu at {entered[0][0]}, "
                      f"which moves nothing of what a remat-ir step keeps (its gradients are "
                      f"eager's): {INSTEAD}", stacklevel=7)


def _name_namedtuples(spec) -> None:
    """Give each namedtuple class in `spec` torch's serialized pytree name for it, its
    qualified name, where it has none: pytree takes namedtuples apart by itself, but
    cannot store a spec holding one without that name, and a model returning a
    namedtuple was refused. (A saved graph's spec then names the class; a process where
    no model registered it takes the outputs flat, as for any class it cannot load.)"""
    stack = [spec]
    while stack:
        node = stack.pop()
        cls = node.context if node.type is collections.namedtuple else None
        if isinstance(cls, type) and cls not in pytree.SUPPORTED_SERIALIZED_TYPES:
            pytree._register_namedtuple(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
        stack.extend(node.children())


def _unnamed_output_class(model: str, spec) -> str:
    """The error for outputs whose pytree spec cannot be stored: a class registered with
    torch's pytree without a serialized type name (the module returned its tensors flat,
    where the model returns that class)."""
    stack, kind = [spec], None
    while stack and kind is None:
        node = stack.pop()
        named = pytree.SUPPORTED_SERIALIZED_TYPES.get(node.type)
        if node.type in pytree.SUPPORTED_NODES and (
                named is None or named.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND):
            kind = f"{node.type.__module__}.{node.type.__qualname__}"
        stack.extend(node.children())
    return (f"{model} returns a {kind or 'class'} that torch's pytree knows without a serialized "
            f"type name, so the graph cannot store how its outputs nest and the scheduled module "
            f"would return them flat: pass serialized_type_name='{kind}' where it is registered "
            f"(torch.utils._pytree.register_dataclass or register_pytree_node), or return "
            f"tensors, tuples or dicts")


#: PyTorch functions whose branch on tensor data an argument avoids: function -> which.
_LAYER_BRANCHES = {
    "_detect_is_causal_mask": "it compares the attention mask with a causal one: say which it "
                              "is, is_causal=True or False (nn.Transformer: tgt_is_causal=, "
                              "src_is_causal=, memory_is_causal=)",
    "batchnorm.py:": "BatchNorm with momentum=None averages with 1 / num_batches_tracked, a "
                     "number read from a tensor: give it a momentum (PyTorch's default is 0.1)",
    "fake_quantize.py:": "torch.ao.quantization's FakeQuantize branches on its enable flags, "
                         "tensors: use FusedMovingAvgObsFakeQuantize, which does the same in one "
                         "op (get_default_qat_qconfig's default)",
    "quantization/utils.py:": "torch.ao.quantization's FakeQuantize computes its scale from the "
                              "min and max its observer has just written, read from tensors: use "
                              "FusedMovingAvgObsFakeQuantize, which does the same in one op "
                              "(get_default_qat_qconfig's default)",
    "observer.py:": "torch.ao.quantization's observers branch on the min and max they hold: use "
                    "FusedMovingAvgObsFakeQuantize, which observes in one op "
                    "(get_default_qat_qconfig's default), or observe outside the module",
    "adaptive.py:": "AdaptiveLogSoftmaxWithLoss gathers each cluster's rows by the targets' "
                    "values, which no argument avoids: return the hidden states from the "
                    "forward and call it on them outside the module",
}


def _known_layer_branch(inside: str) -> str | None:
    """What reads tensor data at PyTorch's line `inside`, and what avoids it, where known."""
    return next((hint for key, hint in _LAYER_BRANCHES.items() if key in inside), None)


def _layer_branch_hint(inside: str) -> str:
    """What avoids the branch on tensor data at PyTorch's line `inside`."""
    return _known_layer_branch(inside) or ("an argument of that call may avoid it; if none "
                                           "does, call it outside the module, on what the "
                                           "forward returns")


def _looping_experts(tb) -> tuple[str, bool] | None:
    """The class name of a transformers mixture-of-experts module whose forward is in the
    traceback `tb`, running the "eager" implementation (a loop over the experts hit,
    refused as a branch on tensor data with advice that did not fit: found by a review),
    and whether the class has other implementations (`use_experts_implementation` gives
    its instances the `config` that chooses; Switch Transformers' and NLLB-MoE's experts
    have only the loop, and `set_experts_implementation` changes nothing there), else None."""
    while tb is not None:
        module = tb.tb_frame.f_locals.get("self")
        if (isinstance(module, torch.nn.Module) and type(module).__module__.startswith("transformers.")
                and type(module).__name__.endswith("Experts")
                and getattr(getattr(module, "config", None), "_experts_implementation", "eager") == "eager"):
            return type(module).__name__, hasattr(module, "config") and hasattr(module, "is_concatenated")
        tb = tb.tb_next
    return None


def _experts_advice(switchable: bool) -> str:
    """What to do about a looping experts module (`_looping_experts`)."""
    if switchable:
        return ("Pick one that computes every expert without that loop before remat: "
                "model.set_experts_implementation(\"grouped_mm\") (or \"batched_mm\")")
    return ("This class has no other implementation in transformers, so remat-ir cannot lower "
            "the model: torch.utils.checkpoint, which reruns Python code, can checkpoint its "
            "layers instead")


def _export_failure(model: str, exc: Exception, eager_fails, number_reads: list[str]) -> LoweringError:
    """torch.export's error as one LoweringError: what, where, what to do. A branch on
    tensor data (the usual case: a loss that selects labels with `nonzero`) is explained
    whole; other errors keep the first lines of export's message, which name the
    construct, and export's error as their cause. `eager_fails()`: what one eager forward
    left where it raises (`tracing_paths.EagerFailure`, kept on the error as `eager_error`
    for a training call to raise), None where it runs; asked only of a plain Python error,
    which is the model's own unless eager runs (`tracing_paths`), and not of one on a
    number read from tensor data, held as a symbol (`number_reads`: where the first was
    read)."""
    text = str(exc).strip()
    if data_uses(exc) and "fake tensor in the exported program constant" in text:
        # `.data` hands export a tensor it did not trace, which it finds among constants.
        error = data_error(model, data_uses(exc))
        error.__cause__ = exc
        return error
    refused = value_dependent_error(model, exc)
    if refused is not None:
        refused.__cause__ = exc
        return refused
    if isinstance(exc, GuardOnDataDependentSymNode):
        frames = traceback.extract_tb(exc.__traceback__)
        where = model_line(frames)
        inside = library_line(frames)
        if where is None and inside is None:
            named = re.search(r"Caused by: \((.*?)\)\s*$", text, re.MULTILINE)
            where = named.group(1) if named else "a line export did not name"
        # Where no line is the model's (a torch module lowered itself), PyTorch's line is
        # said alone ("Caused by" named a frame of torch.export's own).
        inside_at = f"PyTorch's {inside}" if where is None else f"{where}, inside PyTorch at {inside}"
        if inside is not None and inside.startswith("torch/distributions/") and re.search(r" in \w*sample", inside):
            # A sampler that draws until its draws are accepted (VonMises' rejection
            # sampling): no argument check, which the advice below named (hunt61).
            where = (f"{inside_at} (the distribution's sampler draws until its draws are "
                     f"accepted, as many times as the values say: draw the sample outside the "
                     f"forward and pass it in)")
        elif inside is not None and inside.startswith("torch/distributions/"):
            # A distribution checks its arguments' values (`validate_args`, on by default).
            where = (f"{inside_at} (the distribution checks its "
                     f"arguments' values: pass validate_args=False to it, or call "
                     f"torch.distributions.Distribution.set_default_validate_args(False))")
        elif inside is not None and (known := _known_layer_branch(inside)) is not None:
            # A PyTorch layer reads a number from a tensor (BatchNorm's momentum=None): its
            # own way out alone. Found by a review: said as a branch, then with advice
            # about labels and losses, which fits a model's own code.
            # ("tensor data": the words `lower_torch` traces again on, with the caller's
            # integers read as eager's.)
            return LoweringError(
                f"torch.export could not trace {model}: PyTorch's code reads tensor data at "
                f"{inside_at}: {known}. remat-ir lowers one graph of the whole step, which "
                f"cannot depend on tensor values")
        elif inside is not None:   # a PyTorch layer branches
            where = f"{inside_at} ({_layer_branch_hint(inside)})"
        elif drawn_number(frames):
            return LoweringError(f"torch.export could not trace {model}: its forward reads a random "
                                 f"draw as a number at {where}: {RANDOM_NUMBER_HINT}")
        elif drawn_branch(frames):
            return LoweringError(f"torch.export could not trace {model}: its forward branches on "
                                 f"a random draw at {where}: {RANDOM_BRANCH_HINT}")
        elif (experts := _looping_experts(exc.__traceback__)) is not None:
            name, switchable = experts
            return LoweringError(
                f"torch.export could not trace {model}: {name} at {where} runs transformers' "
                f"\"eager\" experts implementation, which loops over the experts the router "
                f"picked, a number read from tensor data. {_experts_advice(switchable)}")
        return LoweringError(
            f"torch.export could not trace {model}: its forward branches on a value computed "
            f"from tensor data ({text.splitlines()[0].strip()}) at {where}. remat-ir lowers one "
            f"graph of the whole step, which cannot depend on tensor values: move that code out "
            f"of the forward (a model computing its loss from labels: call it without labels "
            f"and compute the loss outside it), or write it without the branch "
            f"(torch.where, a fixed size)")
    first = "\n".join(text.splitlines()[:6])
    output = re.search(r"Found <class '([^']+)'> in output|flatten_with_keys_fn for type "
                       r"<class '([^']+)'>", text)   # a class made in a function: `f.<locals>.Out`
    if output:   # a cache or an output class torch's pytree does not know
        kind = output.group(1) or output.group(2)
        hint = ("a training step needs no cache: call the model with use_cache=False; one "
                "that returns a cache even so (peft's prefix tuning hands its virtual tokens "
                "to the model as one) can be called from a Module whose forward returns only "
                "what training reads (the loss, the logits)"
                if "cache" in kind.lower() else
                # Found by a review: the register_dataclass hint raised for these, which
                # are no dataclasses; a distribution is rebuilt from tensors outside.
                f"return the tensors that parametrize it (logits, loc and scale) and build "
                f"the distribution outside the module given to remat_ir.remat (a policy: "
                f"`Categorical(logits=model(obs))`)"
                if _is_distribution(kind) else
                f"return plain tensors, tuples or dicts (return_dict=False), or register the "
                f"class with torch.utils._pytree.register_dataclass({kind.rsplit('.', 1)[-1]}, "
                f"serialized_type_name='{kind}') (a name, so that the graph can store it)")
        return LoweringError(f"{model} returns a {kind}, which torch.export cannot take apart "
                             f"into tensors: {hint}")
    where = model_line([f for f in traceback.extract_tb(exc.__traceback__)
                        if not f.filename.startswith("<")])   # not code torch generates
    if type(exc).__module__ == "builtins" and where is not None:
        # A plain Python error from the model's own code (a bug, a shape mismatch): what
        # eager raises too, not something tracing cannot do; unless it is on a number read
        # from tensor data (a symbol under tracing), or eager runs, where the forward took
        # another path because it was traced.
        if SYMBOLIC.search(text):
            error = symbolic_number_error(model, exc, where, number_reads[0] if number_reads else None)
        elif (failure := eager_fails()) is None:
            error = LoweringError(traced_only_message(model, exc, where, tracing_check(exc.__traceback__)))
        else:
            error = LoweringError(f"{model}'s forward raised {type(exc).__name__} at {where}: "
                                  f"{text.splitlines()[0] if text else ''} (eager raises it too: "
                                  f"fix the forward for these inputs, then call remat again)")
            error.eager_error = failure   # what a training call raises (`ScheduledModule`)
        error.__cause__ = exc
        return error
    failure = eager_fails() if type(exc).__module__ == "builtins" and not SYMBOLIC.search(text) else None
    if failure is not None:
        # Raised inside torch's own code, for a model made of torch's modules alone (an
        # `nn.Sequential` given a batch of one for its BatchNorm, or the wrong width): eager
        # raises it too. Found by a review: said as a construct torch.export cannot trace,
        # of a type a training loop skipping a bad batch does not catch.
        error = LoweringError(f"{model}'s forward raised {type(exc).__name__} inside torch's code: "
                              f"{text.splitlines()[0] if text else ''} (eager raises it too: fix the "
                              f"inputs or the model, then call remat again)")
        error.eager_error = failure
        error.__cause__ = exc
        return error
    if text.startswith("Pending unbacked symbols"):
        # `h.narrow(0, start, 3)` with a 0-d integer tensor `start`: the op takes it as a
        # tensor, so no integer read answers it as eager's (found by a review: torch's
        # internal text about fake implementations).
        # Or an op selecting by values inside PyTorch (`torch.combinations`, found by an op
        # sweep, was told about a number it never passed).
        return LoweringError(
            f"{model}'s forward makes a tensor whose size depends on tensor data"
            f"{f' at {where}' if where else ''}, which one graph of the step cannot follow: an op "
            f"given a number held in a tensor (a 0-d integer tensor, as Tensor.narrow's start "
            f"may be), or one that selects by values inside PyTorch (torch.combinations). Pass "
            f"such a number as a Python number (`int(start)`: remat-ir reads it as eager's and "
            f"plans each value it meets) or a Python argument of the forward; compute such an "
            f"op outside the module given to remat_ir.remat")
    if "higher order operator doesn't work unless it is captured completely" in text:
        # `torch.cond`, `scan`, `map`: their branches are captured by Dynamo, which stops at
        # the tracing hooks' Python (found by a review: torch's internal text, no line).
        return LoweringError(
            f"{model}'s forward calls a control-flow operator (torch.cond, scan, map, while_loop) "
            f"at {where or 'a line tracing did not record'}, whose branches remat-ir's tracing "
            f"cannot capture. Write a loop (scan, map) as a Python loop, which is traced "
            f"unrolled, and a choice (cond) as both branches chosen with torch.where, or move it "
            f"out of the forward (a Python argument)")
    error = LoweringError(f"torch.export could not trace {model} (data-dependent control flow "
                          f"or an unsupported construct):\n{first}")
    error.__cause__ = exc
    return error


class _Lowering:
    """Turns one joint FX graph into an IR `Graph`."""

    def __init__(self, name: str):
        self.g = Graph(name=name)
        self.value_of: dict[torch.fx.Node, int] = {}          # single-tensor FX node -> value
        self.items_of: dict[torch.fx.Node, dict[int, int]] = {}  # tuple FX node -> position -> value
        # A plain number among a tuple's items (cuDNN attention's max_q and max_k on CUDA,
        # fixed by the shapes): tuple FX node -> position -> number, and the getitem
        # nodes reading one, whose users take the number as a constant argument.
        self.numbers_of: dict[torch.fx.Node, dict[int, int | float | bool]] = {}
        self.number_of: dict[torch.fx.Node, int | float | bool] = {}
        self.masked_of: dict[torch.fx.Node, set[int]] = {}  # tuple FX node -> undefined positions
        self.storage_of: dict[int, int] = {}                   # fake storage cdata -> IR storage
        self.checked: list[torch.Tensor] = []   # value checks' empty results (`add_check`)
        self.tokens: set[torch.fx.Node] = set()   # effect tokens of checks (`effect`)
        #: Tangents of parameters' new values, zero at every step (`placeholder`).
        self.zero_tangents: set[torch.fx.Node] = set()
        self.forward_by_seq: dict[int, int] = {}
        #: User outputs the trace fixed (None, a number, a string), by flat output position.
        self.constant_outputs: dict[int, object] = {}
        #: Flat output position -> ["param" | "buffer", name] or ["input", leaf position]
        #: of an output that is one of the step's inputs as it is (`_returned_input`).
        self.member_outputs: dict[int, list] = {}

    # -------------------------------------------------------------- values

    def new_value(self, name: str, fake: torch.Tensor, kind: str) -> int:
        if not isinstance(fake, torch.Tensor):
            raise LoweringError(f"{name!r} is a {type(fake).__name__}, not a tensor; "
                                "only static-shape tensor programs can be lowered")
        if fake.layout != torch.strided:
            raise LoweringError(f"{name!r} is a {fake.layout} tensor; {_dense_advice(fake.layout)}")
        key = fake.untyped_storage()._cdata
        if key not in self.storage_of:
            self.storage_of[key] = self.g.add_storage(fake.untyped_storage().nbytes())
        storage = self.storage_of[key]
        try:
            dtype = ir_dtype(fake.dtype)
        except ValueError as exc:
            raise LoweringError(f"{name!r}: {exc}") from None
        vid = self.g.add_value(name, dtype, tuple(fake.shape), kind=kind, storage_id=storage)
        value = self.g.value(vid)
        if fake.layout == torch.strided:
            value.stride.extend(fake.stride())
            value.storage_offset = fake.storage_offset()
        return vid

    def value_check(self, node: torch.fx.Node) -> None:
        """`_assert_async(condition[, message])` as a `remat_ir.value_check` node."""
        message = node.args[1] if len(node.args) > 1 else node.kwargs.get("assert_msg")
        self.add_check(node, value_checks.OP, node.args[0], [message])

    def effect(self, node: torch.fx.Node) -> None:
        """`with_effects(token, op, *args)` of a check (`_CHECKS_WITH_EFFECTS`, the only
        ones `_check_effects` lets through): `_linalg_check_errors(info, api_name,
        is_matrix)` as a `remat_ir.linalg_check` node; its token is dropped."""
        _, op, info, api_name, *rest = node.args
        is_matrix = rest[0] if rest else node.kwargs.get("is_matrix")
        self.add_check(node, value_checks.LINALG_OP, info, [api_name, is_matrix])
        self.tokens.add(node)

    def add_check(self, node: torch.fx.Node, op: str, tensor: torch.fx.Node, rest: list) -> None:
        """A check on the values of `tensor` (`torchlib/value_checks.py`): a node in the
        forward whose empty result is a VALUE_CHECK output, so that every schedule runs it
        (a node whose result nothing reads would be left out of plans)."""
        if node.meta.get("partitioner_tag") == "is_backward":
            # A custom backward's `F.one_hot(i, n)` (its class-range check) was said as "an
            # unknown module" with "call it outside the model" (hunt63): named by the
            # forward op it differentiates, with the ways that train.
            forward = self.forward_by_seq.get(node.meta.get("seq_nr"))
            within = node_module(node) or "an unknown module"
            if forward is not None:
                cls = function_class(self.g.node(forward).op)
                within = (f"autograd.Function {cls.__qualname__}" if cls is not None else self.g.node(forward).op) \
                    + f" from {self.g.node(forward).source or 'the model'}"
            raise LoweringError(f"the backward of {within} checks tensor values with {node.target} (such as "
                                f"F.one_hot's check of its classes' range), which remat-ir runs in the forward "
                                f"only: compute that in the forward and save it for the backward "
                                f"(`ctx.save_for_backward(F.one_hot(i, n))`), or without the check "
                                f"(`torch.zeros(..., n).scatter_(-1, i.unsqueeze(-1), 1.0)`)")
        empty = tensor.meta["val"].new_empty(0)
        self.checked.append(empty)   # its storage's id stays its own (`new_value`)
        output = self.new_value(node.name, empty, "activation")
        vid = self.tensor_id(tensor)
        self.g.add_node(op, [vid], [output], phase="forward", name=node.name,
                        args=[TensorRef(vid), *rest], source=node_module(node))
        self.g.add_output(output, "value_check", node.name)

    def tensor_id(self, node: torch.fx.Node) -> int:
        try:
            return self.value_of[node]
        except KeyError:
            raise LoweringError(f"FX node {node.name!r} ({node.target}) is used as a tensor but "
                                "produces none") from None

    # -------------------------------------------------------------- nodes

    def placeholder(self, node: torch.fx.Node) -> None:
        desc = node.meta.get("desc")
        kind_name = type(desc).__name__
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            return  # a non-tensor input (a flag, None): fixed by the trace, passed nowhere
        if kind_name == "ParamAOTInput":
            vid = self.new_value(desc.target, fake, "parameter")
            self.g.add_input(vid, desc.target)
        elif kind_name == "BufferAOTInput":
            vid = self.new_value(desc.target, fake, "buffer")
            self.g.add_input(vid, desc.target)
        elif kind_name == "PlainAOTInput":
            # desc.idx counts the leaves of (args, kwargs) flattened: the caller's position.
            vid = self.new_value(f"input{desc.idx}", fake, "user_input")
            self.g.add_input(vid, f"input{desc.idx}", position=desc.idx)
        elif kind_name == "TangentAOTInput" and type(desc.output).__name__ == "InputMutationAOTOutput":
            # The gradient of a parameter's new value (written under no_grad). AOTAutograd adds
            # it to the parameter's gradient as if the new value were an output, but nothing
            # takes a gradient of it: zero, and the sum is the other term (eager's gradient;
            # adding a zero would turn its -0.0s into +0.0s). Read otherwise, it would carry
            # gradients through the write, which the step cannot give. Returned as it is, it
            # is the parameter's whole gradient: the loss reaches the parameter no other way,
            # and eager's gradient is None (`output`; a search found it refused, 2026-12-04).
            if any(not (_adds_to_another(user, node) or user.op == "output") for user in node.users):
                raise LoweringError(mutation_error(desc.output.mutated_input))
            self.zero_tangents.add(node)
            return
        elif kind_name == "TangentAOTInput":
            vid = self.new_value(f"grad_{node.name}", fake, "gradient")
            self.pending_tangents.append((vid, desc))
        elif kind_name == "ForwardTokenAOTInput":   # orders the checks' effects (`effect`)
            self.tokens.add(node)
            return
        elif kind_name == "ViewBaseAOTInput":   # inputs sharing memory, one written in place
            raise LoweringError(_SHARED_WRITTEN_INPUTS)
        else:
            raise LoweringError(f"graph input {node.name!r} has a kind this frontend does not "
                                f"handle yet: {desc}")
        self.value_of[node] = vid

    def constant(self, node: torch.fx.Node, module: torch.nn.Module) -> None:
        """A tensor constant lifted by torch.export (`torch.tensor(...)` built inside forward,
        such as T5's `_shift_right` start token): its bytes go into the graph, row-major."""
        tensor = getattr(module, node.target, None)
        if isinstance(tensor, torch.Generator):
            users = ", ".join(sorted({str(u.target) for u in node.users}))
            # By line (found by a review: no line, where the other refusals name one).
            line = next((found for u in node.users if (found := node_line(u)) is not None), None)
            raise LoweringError(
                f"the model's forward draws random numbers from a torch.Generator of its own "
                f"(generator= in {users or 'a random op'}{f' at {line}' if line else ''}); remat-ir "
                f"replays the default "
                f"generator's draws only, so a recomputation could not draw the same numbers. "
                f"Draw from the default generator (seeded with torch.manual_seed); numbers that are the "
                f"same at every call (a generator seeded in the forward): draw them once in `__init__` "
                f"and keep them as a buffer")
        if not isinstance(tensor, torch.Tensor):
            raise LoweringError(f"FX node {node.name!r} reads attribute {node.target!r}, which is "
                                f"a {type(tensor).__name__}, not a tensor constant")
        try:
            dtype = ir_dtype(tensor.dtype)
        except ValueError as exc:
            raise LoweringError(f"tensor constant {node.target!r}: {exc}") from None
        with unset_fake_temporarily():  # a real tensor, read while AOTAutograd's fake mode is on
            tensor = tensor.detach().to("cpu").contiguous()
            raw = raw_bytes(tensor)
        vid = self.g.add_value(node.name, dtype, tuple(tensor.shape), kind="constant", constant=raw)
        self.g.value(vid).stride.extend(tensor.stride())
        self.value_of[node] = vid

    def call(self, node: torch.fx.Node) -> None:
        target = node.target
        zero = next((a for a in node.args if isinstance(a, torch.fx.Node) and a in self.zero_tangents),
                    None) if self.zero_tangents else None
        if zero is not None:   # `zero + gradient` (`placeholder`): the gradient itself
            self.value_of[node] = self.tensor_id(next(a for a in node.args[:2] if a is not zero))
            return
        if target is operator.getitem:
            parent, index = node.args
            if parent in self.tokens:   # a check's new token (`effect`)
                self.tokens.add(node)
                return
            items = self.items_of.get(parent)
            if index in self.numbers_of.get(parent, {}):
                self.number_of[node] = self.numbers_of[parent][index]
                return
            if index in self.masked_of.get(parent, ()) and not node.users:
                return  # an undefined result nothing reads (`_masked_results`)
            if items is None or index not in items:
                raise LoweringError(f"{node.name!r} takes item {index} of {parent.name!r}, "
                                    "which has no such tensor")
            self.value_of[node] = items[index]
            return
        if target is torch.ops.higher_order.with_effects:
            self.effect(node)
            return
        if not isinstance(target, torch._ops.OpOverload):
            where = node_module(node) or 'an unknown module'
            if isinstance(target, torch._ops.HigherOrderOperator) and target.name().startswith("auto_functionalized"):
                mutating = node.args[0] if node.args else None
                shown = mutating.name() if isinstance(mutating, torch._ops.OpOverload) else mutating
                raise LoweringError(
                    f"custom op {shown} in {where} writes into its arguments "
                    f"(mutates_args=...), which remat-ir cannot run again or plan around: "
                    f"return the new value from the op instead (mutates_args=()) and write it "
                    f"in the forward with a PyTorch op (`self.stat.copy_(new)` for a buffer, "
                    f"lowered as a buffer update)")
            raise LoweringError(f"op {getattr(target, '__name__', target)!r} from "
                                f"{where} is not an aten-level op; the runtime cannot execute it")
        name = op_name(target)
        if name.startswith(_VALUE_CHECK_OPS):
            self.value_check(node)
            return
        if name == value_checks.OP:   # traced where a branch only raises (`raising_checks`)
            self.add_check(node, name, node.args[0], list(node.args[1:]))
            return
        if name.startswith(_ASSERT_OPS):
            return
        phase = "backward" if node.meta.get("partitioner_tag") == "is_backward" else "forward"
        val = node.meta.get("val")
        kind = "activation" if phase == "forward" else "gradient"
        if isinstance(val, (tuple, list)):
            self.numbers_of[node] = {i: v for i, v in enumerate(val) if type(v) in (int, float, bool)}
            masked = self.masked_of[node] = _masked_results(target, node.args, node.kwargs)
            items = {i: self.new_value(f"{node.name}_{i}", v, kind) for i, v in enumerate(val)
                     if v is not None and i not in self.numbers_of[node] and i not in masked}
            outputs, indices = list(items.values()), list(items)
            self.items_of[node] = items
        else:
            outputs, indices = [self.new_value(node.name, val, kind)], []
            self.value_of[node] = outputs[0]
        fx_args, fx_kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                   lambda n: self.number_of.get(n, n))
        seq = node.meta.get("seq_nr")
        forward_node = self.forward_by_seq.get(seq) if phase == "backward" else None
        try:
            args = [to_ir_argument(a, self.tensor_id) for a in fx_args]
            kwargs = {k: to_ir_argument(v, self.tensor_id) for k, v in fx_kwargs.items()}
        except TypeError as exc:
            # A backward op's argument comes from a derivative formula the user never wrote
            # (`angle`'s multiplies by 1j): name the forward op it differentiates.
            within = ""
            if forward_node is not None:
                forward = self.g.node(forward_node)
                within = f", in the backward of {forward.op} from {forward.source or 'the model'},"
            raise LoweringError(f"op {name} from {node_module(node) or 'an unknown module'}{within} "
                                f"takes {exc}, which the IR cannot store") from None
        inputs = list(dict.fromkeys(
            a.value_id for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorRef)))
        source = node_module(node)
        if phase == "backward" and forward_node is not None:
            source = source or self.g.node(forward_node).source
        random = draws_random(target, node.args, node.kwargs)
        nid = self.g.add_node(
            name, inputs, outputs, phase=phase, name=node.name, args=args, kwargs=kwargs,
            forward_node_id=forward_node, random=random,
            mutating=target._schema.is_mutable, source=source)
        self.g.node(nid).rng_shape_only = random and name.split(".")[1] in SHAPE_ONLY_RANDOM_OPS
        self.g.node(nid).non_recomputable = name in ONCE_PER_STEP or opaque_custom_op(target)
        self.g.node(nid).output_indices.extend(indices)
        # AOTAutograd's sum of a tensor's gradient contributions (its readers' backward):
        # the runtime may hand them to autograd one by one, as eager's engine adds them.
        self.g.node(nid).accumulates_gradient = (bool(node.meta.get("is_gradient_acc"))
                                                 and name == "aten.add.Tensor")
        self.g.node(nid).autocast_cast_back = bool(node.meta.get(CAST_BACK))
        if phase == "forward" and seq is not None:
            # Backward nodes link to the first forward node of their sequence number that
            # computes something, or else to the first view of it.
            known = self.forward_by_seq.get(seq)
            if known is None or (self._is_view(known) and not self._is_view(nid)):
                self.forward_by_seq[seq] = nid

    def _is_view(self, nid: int) -> bool:
        return is_view(self.g, self.g.node(nid))

    def output(self, node: torch.fx.Node) -> None:
        results, descs = node.args[0], node.meta["desc"]
        user_outputs: dict = {}   # each differentiable output's descriptor: its value
        # Tensors AOTAutograd returns for its wrapper to take views of returned outputs on
        # (`output_aliases`): user outputs after the model's own, which the runtime takes
        # those views again on and does not hand over (`runtimes/output_views.py`).
        hidden: list[int] = []
        returned = sum(type(desc).__name__ == "PlainAOTOutput" for desc in descs)
        differentiable = {desc.grad_of for result, desc in zip(results, descs)   # inputs
                          if type(desc).__name__ == "GradAOTOutput" and result is not None}
        # A member written in place and returned (CLIP clamping its temperature under
        # no_grad): eager returns the parameter itself, after the write. Returned as the
        # write's value, it was a copy no gradient reached the parameter through (hunt77
        # F2: the temperature never trained), or a buffer's snapshot (F3).
        written_members = {result: member for result, desc in zip(results, descs)
                           if type(desc).__name__ == "InputMutationAOTOutput"
                           and (member := _member(desc.mutated_input)) is not None}
        for result, desc in zip(results, descs):
            if desc is None:
                continue
            kind_name = type(desc).__name__
            if kind_name == "ForwardTokenAOTOutput":   # the checks' last token (`effect`)
                continue
            if kind_name == "PlainAOTOutput" and not isinstance(result, torch.fx.Node):
                self.constant_outputs[desc.idx] = constant_output(result, desc.idx)
                continue
            member = _returned_input(result) or written_members.get(result) if kind_name == "PlainAOTOutput" else None
            if member is not None:
                # A parameter, buffer or input returned as it is: the runtime hands over the
                # object itself, as eager's forward does (`member_outputs`).
                self.member_outputs[desc.idx] = member
                continue
            if result is None or result in self.zero_tangents:   # no gradient (`placeholder`)
                continue
            vid = self.tensor_id(result)
            if kind_name == "PlainAOTOutput":
                user_outputs[desc] = vid
                self.g.value(vid).kind = pb.OUTPUT
                self.g.add_output(vid, "user_output", f"output{desc.idx}")
            elif kind_name == "IntermediateBaseAOTOutput":
                user_outputs[desc] = vid
                hidden.append(vid)
            elif kind_name == "GradAOTOutput":
                of = desc.grad_of
                if type(of).__name__ == "ParamAOTInput":
                    self.g.add_output(vid, "parameter_gradient", of.target)
                else:
                    self.g.add_output(vid, "input_gradient", f"input{of.idx}")
            elif kind_name == "InputMutationAOTOutput" and type(desc.mutated_input).__name__ in (
                    "BufferAOTInput", "ParamAOTInput"):
                # A parameter written in place under no_grad (nn.Embedding's max_norm renorm,
                # a clamp): its new value is copied in after the forward, as a buffer's. Its
                # readers run in the forward only: read again in the backward (a copy of its
                # old value), it took its gradient parts otherwise than eager's engine, 7e-8
                # off where a loss reads the parameter too (found by random schedules).
                self.g.add_output(vid, "buffer_update", desc.mutated_input.target)
                # So do the readers of its views (hunt77 F10: a target network's EMA written
                # through `p.detach()` or `state_dict()`'s aliases; recomputed in the
                # backward, the update read the new weights and was applied twice, 2.5 off).
                if type(desc.mutated_input).__name__ == "ParamAOTInput":
                    written = next(e.value_id for e in self.g.proto.inputs if e.name == desc.mutated_input.target)
                    storage = self.g.value(written).storage_id
                    for view in [v.id for v in self.g.proto.values if v.storage_id == storage]:
                        for reader in self.g.users(view):
                            self.g.node(reader).non_recomputable = True
            elif (kind_name == "InputMutationAOTOutput"
                  and type(desc.mutated_input).__name__ == "PlainAOTInput"
                  and desc.mutated_input not in differentiable):
                # A user input written in place (no gradient through it: a mask or labels
                # the forward edits): its new value is copied into the caller's tensor after
                # the forward, as a buffer's update, and a backward step reading its old
                # value reads a copy taken before (`ir.memory.snapshot_buffers`).
                self.g.add_output(vid, "buffer_update", f"input{desc.mutated_input.idx}")
            elif kind_name == "InputMutationAOTOutput":
                raise LoweringError(mutation_error(desc.mutated_input))
            else:
                raise LoweringError(f"the model returns {desc}, which this frontend does not handle "
                                    "(only user outputs, gradients and buffer updates)")
        for j, vid in enumerate(hidden):
            self.g.value(vid).kind = pb.OUTPUT
            self.g.add_output(vid, "user_output", f"output{returned + j}")
        if hidden:
            self.g.proto.metadata["torch.hidden_outputs"] = json.dumps(len(hidden))
        for vid, desc in self.pending_tangents:
            of = desc.output
            position = (of.idx if type(of).__name__ == "PlainAOTOutput"
                        else returned + hidden.index(user_outputs[of]))
            self.g.add_input(vid, f"grad_output{position}", gradient_of=user_outputs.get(of))
        if self.constant_outputs:
            self.g.proto.metadata["torch.constant_outputs"] = json.dumps(self.constant_outputs)
        if self.member_outputs:
            self.g.proto.metadata["torch.member_outputs"] = json.dumps(self.member_outputs)

    def run(self, module: torch.fx.GraphModule) -> Graph:
        self.pending_tangents = []
        for node in module.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "get_attr":
                self.constant(node, module)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.output(node)
            else:
                raise LoweringError(f"FX node {node.name!r} of kind {node.op!r} "
                                    f"({node.target}) is not supported")
        return self.g


def _adds_to_another(node: torch.fx.Node, tangent: torch.fx.Node) -> bool:
    """Whether `node` is `tangent + other` (either order) of `tangent`'s shape and dtype."""
    if node.target is not torch.ops.aten.add.Tensor or len(node.args) != 2 or node.kwargs:
        return False
    other = node.args[1] if node.args[0] is tangent else node.args[0]
    value, mine = getattr(other, "meta", {}).get("val"), tangent.meta.get("val")
    return (other is not tangent and isinstance(value, torch.Tensor) and value.shape == mine.shape
            and value.dtype == mine.dtype)


def _device_of(example_inputs) -> torch.device:
    for leaf in pytree.tree_leaves(example_inputs):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def example_arguments(example_inputs, example_kwargs: dict | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) from example inputs as users hold them: a tuple or list of positional
    arguments, a dict of keyword arguments (`model(**batch)`), or one tensor."""
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, dict) or (hasattr(example_inputs, "keys")
                                              and hasattr(example_inputs, "__getitem__")):
        args, kwargs = (), {key: example_inputs[key] for key in example_inputs.keys()}
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif example_inputs is None:
        args, kwargs = (), {}
    else:
        raise LoweringError(f"example_inputs must be a tuple of positional arguments, a dict of "
                            f"keyword arguments or one tensor, not {type(example_inputs).__name__}")
    for key, value in (example_kwargs or {}).items():
        if key in kwargs:
            raise LoweringError(f"keyword input {key!r} is given both in example_inputs and in "
                                "example_kwargs; give it once")
        kwargs[key] = value
    return args, kwargs


def _without_grad(tensor: torch.Tensor) -> torch.Tensor:
    """An input tensor as tracing should see it: without the `.grad` a step before left on
    it. AOTAutograd reads that too, and failed on a transposed one ("'NoneType' object has
    no attribute 'size'", review AE); the graph's step accumulates into it as eager's."""
    if not tensor.is_leaf or isinstance(tensor, torch.nn.Parameter) or tensor.grad is None:
        return tensor
    return tensor.detach().requires_grad_(tensor.requires_grad)


def _fusing_decompositions() -> dict:
    """Forward ops decomposed in a graph for a fusing backend (`lower(..., fusing=True)`):
    training BatchNorm into its statistics (a reduction) and a pointwise normalization from
    them, so that a plan may keep the convolution's output and the statistics and compute
    the normalized (and ReLU'd) activation again as one fused kernel, which is what
    `torch.compile`'s partitioner does, where the whole op would compute its statistics
    again. Its backward stays `native_batch_norm_backward`, reading the saved statistics.

    The normalized result is laid out as eager's kernels lay it out, in its input's
    suggested memory format (`_as_the_kernel_lays_out`), not in the input's own layout,
    which the decomposition's pointwise ops keep: after a BatchNorm1d over a transposed
    (B, T, C) sequence, a dropout's mask and `rand_like` draw in memory order, and in the
    decomposition's layout they drew eager's numbers into other positions (a review:
    outputs 1.5 off, gradients 8-29% of the largest)."""
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    op = aten._native_batch_norm_legit_functional.default
    return {op: _as_the_kernel_lays_out(decomposition_table[op])}


def _as_the_kernel_lays_out(decomposition):
    """`decomposition` of a BatchNorm op whose first result is made contiguous in its
    input's suggested memory format (channels-last where the input is, else plain), as
    the CPU and CUDA kernels allocate it."""
    from torch._prims_common import suggest_memory_format

    def decomposed(x, *args, **kwargs):
        out = decomposition(x, *args, **kwargs)
        return (out[0].contiguous(memory_format=suggest_memory_format(x)), *out[1:])
    return decomposed


FUSING_DECOMPOSITIONS = _fusing_decompositions()


def lower(model: torch.nn.Module, example_inputs: Sequence | dict | torch.Tensor, *,
          example_kwargs: dict | None = None, reuse_buffers: bool = True,
          split_dropouts: bool = True, copy_long_lived_views: bool = True,
          fusing: bool = False, outputs=None, pure_ops=()) -> Graph:
    """The joint forward+backward graph of one training step of `model`, as IR, without costs.

    `example_inputs` fix the shapes: a tuple of positional arguments, a dict of
    keyword arguments (a Hugging Face batch) or one tensor; `example_kwargs` add
    keyword arguments. The autocast state active now is traced into the graph
    (its casts) and recorded. Every node's cost is left empty and
    `provenance.cost_device` names the inputs' device: costs come from executing
    ops, which is the runtimes' business (`remat_ir.runtimes.profiling.estimate_costs`;
    `remat_ir.lowering.lower_torch` does both). With `reuse_buffers` (the default),
    backward ops that can write their result into an input read by them alone do
    (`buffer_reuse`): one buffer where eager holds two. Raises `LoweringError` naming
    the op and module that cannot be lowered. With `split_dropouts` (the default), each
    CPU training dropout becomes its drawn mask and a product (`dropout_masks`), so that a
    plan can compute its output again without drawing. With `copy_long_lived_views` (the
    default), a small view read long after the rest of its storage (the skip connection's
    slice of a `cat` gradient) is copied, so that the storage dies (`view_compaction`).
    `fusing`: the graph is for a backend that fuses pointwise chains (Inductor): buffer
    reuse leaves pointwise ops functional (`buffer_reuse.reuse_dying_inputs`) and the ops
    of `FUSING_DECOMPOSITIONS` (training BatchNorm) are traced as their decompositions.
    `outputs`: the names or positions of the top-level outputs the step returns (None:
    all); the others are None in what it returns, and the plan frees or recomputes them
    like any intermediate (`selected_outputs`). `pure_ops`: custom ops ("namespace::name")
    the caller declares pure, recomputed like PyTorch's (`random_ops.opaque_custom_op`).
    """
    outputs = check_selection(outputs)
    try:
        pure = check_pure_ops(pure_ops)
    except ValueError as refused:
        raise LoweringError(str(refused)) from None
    if modes := user_function_modes():
        raise LoweringError(f"{type(model).__name__} is lowered inside {', '.join(modes)}, a TorchFunctionMode: "
                            f"remat-ir traces and runs ATen ops, below the torch functions such a mode sees, "
                            f"so what it does would not be in the graph. Call remat_ir.remat outside the "
                            f"mode (a scheduled call inside one runs the model as it is), or do what the mode "
                            f"does in the model's forward")
    refused = cached_parametrizations(model)
    if refused is not None:
        raise LoweringError(refused.replace("is called inside", "is lowered inside"))
    refused = stateful_rnn_parametrizations(model)
    if refused is not None:
        raise LoweringError(refused)
    checkpointed: list = []   # the lines of torch.utils.checkpoint blocks traced as plain calls
    with paused_collection(), traced_as_run(), certain_draws(), checkpoints_traced_plain(checkpointed), \
            user_draws_kept(), script_functions_as_python(), _tracing_state_released(), \
            fake_cache_keeping_aliases(), registration_hooks_paused(), declared_pure(pure):
        try:
            return _checkpoints_noted(_lower(model, example_inputs, example_kwargs, reuse_buffers, split_dropouts,
                                             copy_long_lived_views, fusing, outputs), checkpointed)
        except LoweringError as refused:
            if not any(words in str(refused) for words in _DATA_DEPENDENT):
                _raise_said(model, refused)
        # A number read from tensor data stopped the trace (a split's sizes, a mask's
        # count): lowered again with those computed from the caller's inputs read as
        # eager's, each checked at every call (`input_branches.integers_as_eager`). Not
        # first: where tracing goes on without (a CTC loss's masked targets, folded into
        # one op of fixed shapes), the graph serves every value, with nothing to check.
        with integers_as_eager():
            try:
                return _checkpoints_noted(_lower(model, example_inputs, example_kwargs, reuse_buffers,
                                                 split_dropouts, copy_long_lived_views, fusing, outputs),
                                          checkpointed)
            except LoweringError as refused:
                _raise_said(model, refused)


def _checkpoints_noted(graph: Graph, lines: list) -> Graph:
    """`graph` with the lines of the model's own checkpointed blocks in its metadata
    (`torch.checkpointed_blocks`): traced as plain calls, they make the store-everything
    peak that share budgets are taken of higher than eager's with them (hunt86 F5: 1.68x)."""
    if lines:
        graph.proto.metadata["torch.checkpointed_blocks"] = json.dumps([line or "a line of the model"
                                                                        for line in lines])
    return graph


@contextlib.contextmanager
def _tracing_state_released():
    """After lowering, the tracing state torch keeps in globals let go: its fake-tensor
    modes, which hold weak references to every parameter (two per parameter after a
    lowering), stayed alive through them, and with
    `torch.__future__.set_swap_module_params_on_conversion(True)` the model's
    `load_state_dict` and `.to()` then failed ("Cannot swap t1 because it has weakref
    associated with it"; found by a review). Nothing reads them between traces."""
    try:
        yield
    finally:
        from torch._decomp.decompositions_for_rng import PhiloxStateTracker
        from torch.fx.experimental import proxy_tensor

        getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", {}).clear()
        PhiloxStateTracker.reset()


#: What the refusals of a value read from tensor data say (`value_dependent`,
#: `_export_failure`; export's own, where it kept a size it could not bind, `x[mask, idx]`):
#: the ones lowering tries again with integers read as eager's. Also a branch on a random
#: draw: `random_branches.drawn_branch` finds one by the lines near the read, and took an
#: integer read a few lines below a draw for one (found by a review); a real one is
#: refused so again.
_DATA_DEPENDENT = ("tensor data", "data-dependent", "branches on a random draw")


def _reader(model: str, function: str | None) -> str:
    """Who read or wrote what an error is about: the model's forward, or the backward of a
    custom Function (`autograd_functions.backward_of`) in it."""
    return f"the backward of autograd.Function {function} (in {model})" if function else f"{model}'s forward"


def check_arguments_bind(model: torch.nn.Module, args: tuple, kwargs: dict, example_inputs) -> None:
    """LoweringError where a forward taking one dict (or list) argument was given that dict
    as `example_inputs`, which is spread into keywords (positional arguments): torch.export's
    refusal was said as data-dependent control flow (found by a review). Only where the
    spread arguments do not bind to the forward's signature and the one argument does (a
    decorated forward's signature may not say all it takes)."""
    if not isinstance(example_inputs, (dict, list)):
        return
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):   # no signature to check against
        return
    if isinstance(example_inputs, dict) and any(key in signature.parameters for key in example_inputs):
        return   # a batch meant as keywords (one with a key too many is said by torch.export)
    try:
        signature.bind(*args, **kwargs)
        return
    except TypeError as exc:
        failure = exc
    try:
        signature.bind(example_inputs, **({} if isinstance(example_inputs, dict) else kwargs))
    except TypeError:
        return
    kind = "keyword" if isinstance(example_inputs, dict) else "positional"
    raise LoweringError(
        f"{type(model).__name__}'s forward does not take the example inputs as {kind} arguments "
        f"({failure}), as remat-ir reads a {type(example_inputs).__name__} of them "
        f"({'`model(**batch)`' if kind == 'keyword' else '`model(*inputs)`'}): pass the forward's one "
        f"{type(example_inputs).__name__} argument inside a tuple, "
        f"`({'{...}' if kind == 'keyword' else '[...]'},)`")


def _lower(model, example_inputs, example_kwargs, reuse_buffers, split_dropouts,
           copy_long_lived_views, fusing, outputs) -> Graph:
    given = example_arguments(example_inputs, example_kwargs)
    args, kwargs = pytree.tree_map_only(torch.Tensor, _without_grad, given)
    check_arguments_bind(model, args, kwargs, example_inputs)
    refuse_untakable_arguments(model, *given)   # as given: pytree's map makes a torch.Size a tuple
    _check_dense_members(model, args, kwargs)
    reads = TracedReads()
    hooks_before = model_structure.hooks(model)
    with members_kept(model):
        exported = _export(model, args, kwargs, reads)
    if places := dropped_caches(exported):   # said after tracing (what it says may be recorded)
        tell_caches(type(model).__name__, places)
    out_spec = exported.call_spec.out_spec   # how the outputs nest (`select_outputs` changes it)
    if reads.stored.places:   # (outputs, stored tensors): the stored ones after the outputs' leaves
        out_spec = out_spec.child(0)
    record_globals(model, reads, exported.graph_module)
    record_applied_code(reads, exported.graph_module)
    rank_read_by_name(reads.globals)
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    mixed: list[str] = []   # cast by autocast and read otherwise (`share_autocast_casts`)
    nested = autocast_nested()   # inside a block of the caller's (`autocast_blocks`)
    with contextlib.ExitStack() as stack:
        # Eager's backward runs outside autocast (as PyTorch recommends calling it), in the
        # dtypes of the forward's casts; AOTAutograd would otherwise trace it under the
        # forward's autocast and cast again inside regions the model ran with autocast off.
        stack.enter_context(torch._functorch.config.patch(backward_pass_autocast="off"))
        stack.enter_context(_eager_kernels())
        stack.enter_context(_value_checks_kept())
        stack.enter_context(written_layouts_traced())
        try:
            decompositions = FUSING_DECOMPOSITIONS if fusing else None
            module = exported.module()
            fill_dropped_caches(exported, module)
            held, global_tensors = lift_held_tensors(exported, module, model, reads.tensors)
            draw_in_layout(module, type(model).__name__)
            assign_through_masks(module)
            write_through_unfold_views(module, type(model).__name__)
            reshape_in_place(module)
            mark_written_layouts(module)
            fold_target_selections(module)
            if outputs is not None:
                out_spec = select_outputs(module, out_spec, outputs, type(model).__name__)
            # A custom Function's backward is Python that runs here, once (`changes`).
            outside = outside_values.Snapshot(model) if reads.functions else None
            # What it reads of the model's modules (`ctx.module.scale`, a module passed to
            # `apply`) is compared at every call, as the forward's reads are: its new value
            # had been baked into the backward, silently (found by a review).
            drawn = PythonGenerators()   # a custom backward's draws (`backward_draws_error`)
            with recording_reads(model, reads) if reads.functions else contextlib.nullcontext(), \
                    fresh_generators_noted() as fresh, custom_op_backwards_watched(
                        d for d in custom_op_definitions(module)
                        if d._qualname.split("::")[0] != FUNCTION_NAMESPACE):
                joint = aot_export_joint_with_descriptors(stack, module, *constants_named(args, kwargs)[:2],
                                                          decompositions=decompositions)
            if (moved := drawn.moved()) or fresh:
                drawn.restore()
                raise backward_draws_error(type(model).__name__, moved,
                                           sorted(cls.__qualname__ for cls in reads.functions), fresh)
            if outside is not None and (said := outside_values.changes(outside, outside_values.Snapshot(model))):
                outside_values.put_back([change for change, _ in said])
                raise backward_effects_error(type(model).__name__, [text for _, text in said])
        except LoweringError as refused:   # said whole, without FX's note of the node it ran
            refused.args = (str(refused).split("\n\nWhile executing ")[0], *refused.args[1:])
            raise
        except Exception as exc:
            refused = (value_dependent_error(type(model).__name__, exc, exported.graph)
                       or data_sized_branch_error(type(model).__name__, exc, exported.graph))
            if refused is not None:
                raise refused from exc
            first = str(exc).strip().splitlines()[0]
            function = backward_of(exc)
            if isinstance(exc, OutsideTensorRead) and (op := op_backward_of(exc)) is not None:
                raise LoweringError(
                    f"the backward or setup_context {op} registered (register_autograd, in "
                    f"{type(model).__name__}) "
                    f"{'writes into' if exc.writes else 'reads'} a tensor that is none of its "
                    f"arguments (a global's, a closure's), which tracing cannot follow ({first}): "
                    f"keep what it needs in setup_context from the op's inputs, or pass the tensor "
                    f"to the op as an input (held as a module's buffer where it changes between "
                    f"steps)") from exc
            if function is not None and ((isinstance(exc, OutsideTensorRead) and not exc.writes)
                                         or "convert all Tensors to FakeTensors" in first):
                raise LoweringError(
                    f"{_reader(type(model).__name__, function)} reads a tensor its forward did not "
                    f"save for it (a module's parameter or buffer reached through ctx, a global, a "
                    f"closure's), which tracing cannot follow ({first.split('Found in ')[-1]}): pass "
                    f"it to `apply` as an argument and save it with ctx.save_for_backward (held as "
                    f"a module's buffer where it changes between steps)") from exc
            if "does not yet handle non-differentiable view input mutations" in first:
                # Inputs sharing a storage without being views of one another (a deepcopy of
                # two overlapping slices): said as those that are (found by a review), with
                # AOTAutograd's names of the two.
                which = re.search(r"(input \d+ \(.*?\) and input \d+ \(.*?\)) share storage", str(exc))
                raise LoweringError(_SHARED_WRITTEN_INPUTS + (f" ({which.group(1)} do)" if which else "")) from exc
            unwritable = unwritable_view_error(type(model).__name__, first, exported.graph_module)
            if unwritable is not None:
                raise unwritable from exc
            if "Mixing fake modes" in first and (applied := forward_of(exc)) is not None:
                raise LoweringError(
                    f"the forward of autograd.Function {applied} (applied in "
                    f"{type(model).__name__}) reads a tensor it is not passed (a parameter, "
                    f"buffer or activation its closure holds), which tracing cannot follow: "
                    f"pass it to `apply` as an argument (and save it with "
                    f"ctx.save_for_backward where the backward reads it)") from exc
            if "convert all Tensors to FakeTensors" in first:
                raise LoweringError(
                    f"{_reader(type(model).__name__, function)} reads a tensor that is neither a "
                    f"parameter, a buffer, an input nor one the model holds (a global variable, a "
                    f"closure's), which tracing cannot follow "
                    f"({first.split('Found in ')[-1]}): register it as a buffer "
                    f"(module.register_buffer) or pass it as an input") from exc
            if function is not None and "does not require grad and does not have a grad_fn" in first:
                # Found by a review: said as a backward computing with what it may not.
                raise LoweringError(
                    f"AOTAutograd could not trace {_reader(type(model).__name__, function)}: "
                    f"{first.rstrip('.')}. Its backward differentiates a graph its forward built "
                    f"(under torch.enable_grad(), a hand-written checkpoint or a DEQ's fixed "
                    f"point): remat-ir runs a Function's forward without recording one, as a "
                    f"custom op. Build that graph in the backward instead, from the tensors the "
                    f"forward saved (`with torch.enable_grad(): y = f(x.detach().requires_grad_())`)") from exc
            if function is not None:
                raise LoweringError(
                    f"AOTAutograd could not trace {_reader(type(model).__name__, function)}: "
                    f"{first.rstrip('.')}. Its backward is traced once into the graph: it may compute with its "
                    f"arguments, what its forward saved and plain values, and write into no other "
                    f"tensor (a global's, a module's: update such a statistic outside the model)") from exc
            if "modified by an inplace operation" in first:
                # Found by a review: AOTAutograd's text alone, with no name and no way out.
                raise LoweringError(
                    f"{type(model).__name__}'s forward writes in place into a tensor that an op "
                    f"before the write saved for the backward (a buffer updated after a product "
                    f"read it), as eager's backward() "
                    f"finds too ({first.split(': ')[0]}): read a copy (`.clone()`) before the "
                    f"write, or write it after the backward") from exc
            if "resize a view tensor to a larger size" in first:
                # Found by hunt56: a per-channel fake-quant of torch.ao's QAT, not yet
                # run, sizes its scale at its first call; AOTAutograd's text named nothing.
                raise LoweringError(
                    f"{type(model).__name__}'s forward resizes a buffer it holds as it runs (a "
                    f"first call that sizes it, as a per-channel fake-quant or an observer of "
                    f"torch.ao's QAT does; AOTAutograd: {first.rstrip('.')}): run the model "
                    f"once, under torch.no_grad(), before remat_ir.remat") from exc
            raise LoweringError(f"AOTAutograd could not build the joint graph of "
                                f"{type(model).__name__}: {first}") from exc
        keep_written_layouts(joint.graph_module)
        problem, aliased, view_bases = output_aliases(joint, out_spec, type(model).__name__,
                                                      reads.stored.described())
        if problem is not None:
            raise LoweringError(problem)
        _check_effects(joint.graph_module, type(model).__name__)
        _check_dense(joint.graph_module, type(model).__name__)
        if autocast_state():
            check_ops_cast_inside(joint.graph_module, type(model).__name__)
        leaves = pytree.tree_leaves((args, kwargs))
        share_autocast_casts(joint.graph_module, frozenset(
            i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and cast_per_reader(leaf)),
            mixed, block_caches(exported), nested)
        if split_dropouts:
            split_dropout(joint.graph_module)
        if copy_long_lived_views:
            compact_views(joint.graph_module)
        match_kernel_layouts(joint.graph_module)
        _drop_unread(joint.graph_module)
        graph = _Lowering(type(model).__name__).run(joint.graph_module)
    _check_something_trains(graph, type(model).__name__)
    if fusing:   # a recomputation compiled elsewhere may differ in its last bits
        keep_compared_values(graph)
    mark_input_gradient_sums(graph)
    size_rnn_workspaces(graph)
    if reuse_buffers:
        reuse_dying_inputs(graph, pointwise=not fusing)
    # Each user input's argument, by the name a call gives it ('input_ids', 'args[0]').
    names = argument_names(exported.call_spec.in_spec)
    for entry in graph.proto.inputs:
        if entry.HasField("user_input_position") and entry.user_input_position < len(names):
            entry.argument_name = names[entry.user_input_position]
    # How user inputs flatten (PlainAOTInput indices count these leaves) and outputs nest.
    for key, spec in (("torch.in_spec", exported.call_spec.in_spec),
                      ("torch.out_spec", out_spec)):
        _name_namedtuples(spec)
        try:
            graph.proto.metadata[key] = pytree.treespec_dumps(spec)
        except Exception:  # a class without a serialized pytree name
            if key == "torch.out_spec":   # the module would return its tensors flat
                raise LoweringError(_unnamed_output_class(type(model).__name__, spec)) from None
    if aliased:   # views among the outputs: refused at the backward if a gradient reaches one
        graph.proto.metadata["torch.aliased_outputs"] = json.dumps(aliased)
    if view_bases:   # views of other outputs: taken again on the outputs handed over
        graph.proto.metadata["torch.output_view_bases"] = json.dumps(view_bases)
    for key, rows in reads.metadata().items():
        graph.proto.metadata[key] = json.dumps(rows)
    if reads.decisions:   # made from input values, made again at every call
        graph.proto.metadata[ValueGuards.KEY] = json.dumps(reads.decisions)
    if held:   # tensors kept outside parameters and buffers, compared at every call
        graph.proto.metadata["torch.held_tensors"] = json.dumps(held)
    if global_tensors:   # likewise, tensors of globals
        graph.proto.metadata["torch.global_tensors"] = json.dumps(global_tensors)
    if mixed:
        # Cast by autocast and read otherwise: a second call in one autocast block is not
        # summed like eager's (runtimes/autocast_anchors.py warns there).
        graph.proto.metadata["torch.autocast_cast_and_read"] = json.dumps(mixed)
    # The signature a call must match to run this graph (runtimes/signatures.py): every
    # input leaf described (tensor shapes and dtypes, non-tensor values the trace baked in),
    # and the autocast state whose casts the trace holds.
    with_paths = pytree.tree_flatten_with_path((args, kwargs))[0]
    graph.proto.metadata["torch.inputs"] = json.dumps([describe_input(leaf) for _, leaf in with_paths])
    # Arguments that were the model's own parameters or buffers, which the trace reads as
    # one tensor with them (runtimes/torch.py `values_differ`).
    members = {id(t): name for name, t in (*model.named_parameters(remove_duplicate=False),
                                           *model.named_buffers(remove_duplicate=False))}
    named = [(argument_name(path), leaf) for path, leaf in with_paths]
    graph.proto.metadata["torch.input_members"] = json.dumps(
        [[named[i][0], member] for i, member in member_arguments(named, members).items()])
    # Arguments that were one tensor, which the trace reads once (runtimes/signatures.py).
    aliases = input_aliases(with_paths)
    graph.proto.metadata["torch.input_aliases"] = json.dumps(aliases)
    _refuse_written_alias(graph, aliases)
    graph.proto.metadata["torch.autocast"] = json.dumps(dict(autocast_state()))
    graph.proto.metadata["torch.default_dtype"] = str(torch.get_default_dtype())
    graph.proto.metadata["torch.autocast_cache"] = json.dumps(autocast_cache())
    if has_blocks(exported):   # its blocks' casts: shared with the caller's or not, per reader or not
        graph.proto.metadata["torch.autocast_blocks"] = json.dumps(
            {"nested": nested, "per_reader": sorted(name for name, leaf in named
                                                    if isinstance(leaf, torch.Tensor) and cast_per_reader(leaf))})
    graph.proto.metadata["torch.sdpa"] = sdpa_state()
    graph.proto.metadata["torch.deterministic"] = json.dumps(torch.are_deterministic_algorithms_enabled())
    # The CPU kernels' setting the costs will be measured under (a call under another is
    # planned again: signatures.py); it is part of the graph's fingerprint, so of the key
    # a plan cache stores the profiled graph under.
    if next((leaf.device.type for _, leaf in with_paths if isinstance(leaf, torch.Tensor)), "cpu") == "cpu":
        graph.proto.metadata["torch.cpu_kernels"] = cpu_kernels_state()
    # Parameters (and buffers) that were one tensor (a tied embedding and head): a call
    # after they were untied, or others tied, is lowered again.
    graph.proto.metadata["torch.tied_parameters"] = json.dumps(_tied(model.named_parameters(remove_duplicate=False)))
    graph.proto.metadata["torch.tied_buffers"] = json.dumps(_tied(model.named_buffers(remove_duplicate=False)))
    # Its modules, their members and its hooks as traced: a plan made again from this graph
    # (a copy, a saved module loaded, a file) checks the model against them first.
    graph.proto.metadata[model_structure.KEY] = json.dumps(
        model_structure.with_forwards_hooks(model_structure.structure(model), hooks_before))
    # The parameters it computes no gradient for because they needed none when traced
    # (frozen): a call that trains one needs another graph (runtimes/torch.py). Recorded,
    # not read from the model when the graph is run: by then they may be unfrozen.
    graph.proto.metadata["torch.frozen_parameters"] = json.dumps(sorted(
        e.name for e in graph.proto.inputs if graph.value(e.value_id).kind == pb.PARAMETER
        and not parameter_slot(model, e.name).requires_grad))
    prov = graph.proto.provenance
    prov.frontend, prov.frontend_version = "torch", torch.__version__
    prov.source_model = f"{type(model).__module__}.{type(model).__qualname__}"
    # Where the graph was traced: profiling measures there unless told otherwise.
    record_device(prov, _device_of((args, kwargs)))
    return mark_made_here(graph)
