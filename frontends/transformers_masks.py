"""transformers' attention masks decided as eager decides them, while torch.export traces.

transformers asks whether SDPA needs an explicit mask (`_ignore_bidirectional_mask_sdpa`,
`_ignore_causal_mask_sdpa` in `transformers.masking_utils`) and, under torch.export,
always answers yes, also where no padding mask was passed and eager's answer reads no
tensor value. Eager then calls SDPA with no mask; the trace built a (batch, 1, q, k)
mask of True and passed that. BEiT adds the mask to its relative position bias, so
every attention score got +1.0 and every gradient before it was up to 3.5e-7 off eager's;
on CUDA a mask also keeps SDPA off its flash kernel, which eager runs.

So while tracing, where no padding mask was given, the question is answered as eager
answers it (the same function with its tracing checks off). So also where the model
built the padding mask itself from shapes alone (Perceiver: `torch.ones` when the caller
passes none; traced, it added a float32 mask of zeros to bfloat16 scores, and its
softmax ran in float32 where eager's ran in bfloat16). A padding mask the caller passes
is data, whose values eager reads (is every token kept?) and one graph cannot hold for
every call: there the trace gets eager's answer for the example inputs, and the way to
it is recorded (`torchlib/value_guards.py`), so that the runtime asks again at every
call and plans another graph for a call whose answer differs.

Causal models ask one more question first: do the position ids pack several sequences
in a row (`find_packed_sequence_indices`)? Eager reads their values; traced, the answer
was always "maybe", so the mask was built, and with fewer key/value heads than query
heads the keys and values were repeated to every head where eager calls SDPA with
`enable_gqa` (Llama, Mistral, Qwen2, GPT-BigCode: gradients 1e-7 off in float32, a
bfloat16 last bit under autocast). Where the model computed the position ids itself
from shapes alone (an `arange`, when the caller passes none), their values are the
same at every call: they are computed here from the ops that traced them, and eager's
answer is given. Position ids the caller passes are data, answered and recorded as a
padding mask is. Where the way from the inputs cannot be recorded (an op reading a
parameter), the traced answer stays: a mask, right for every call, not eager's bits.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode, get_proxy_slot
from torch.utils import _pytree as pytree

from .attribute_patches import replaced
from remat_ir.torchlib.value_guards import DECISIONS, Unrecordable, answer, encoded

from .fx_nodes import written_arguments

#: transformers' functions deciding whether SDPA may run without an explicit mask.
_DECISIONS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")
#: transformers' function finding sequences packed in a row from the position ids.
_PACKED = "find_packed_sequence_indices"
#: transformers' checks for a trace, which eager answers False.
_TRACING_CHECKS = ("is_torchdynamo_exporting", "is_tracing")


class CallInputs:
    """The example inputs of one trace: their flat leaves (for the runtime, flat in the
    order of torch.export's input spec), and the FX node tracing each tensor, found
    when the model is called with the traced ones (a forward pre-hook).

    With `model`, its buffers too: the node tracing each (`buffers`, by qualified name)
    and its tensor as the caller holds it (`buffer`). A decision read from a buffer is
    made again from the buffer's values at every call, as one read from an input is:
    Encodec's and Mimi's convolutions read their padding from integer buffers (`.item()`),
    which were refused as values that may change at any step. Parameters stay apart:
    they do change at every step."""

    def __init__(self, args: tuple, kwargs: dict, model: torch.nn.Module | None = None):
        with_paths, _ = pytree.tree_flatten_with_path((args, kwargs))
        self.leaves = [leaf for _, leaf in with_paths]
        self._index = {pytree.keystr(path): index for index, (path, _) in enumerate(with_paths)}
        self.nodes: dict[torch.fx.Node, int] = {}
        # Taken before tracing, which puts traced tensors in the buffers' places.
        self._held = dict(model.named_buffers(remove_duplicate=False)) if model is not None else {}
        self.buffers: dict[torch.fx.Node, str] = {}

    def buffer(self, name: str) -> torch.Tensor:
        """The buffer `name` as the caller holds it."""
        return self._held[name]

    def hook(self, module, args, kwargs):
        mode = get_proxy_mode()
        if mode is None:
            return
        for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
            index = self._index.get(pytree.keystr(path))
            proxy = _proxy(leaf, mode)
            if index is not None and proxy is not None:
                self.nodes.setdefault(proxy.node, index)
        for name, traced in module.named_buffers(remove_duplicate=False) if self._held else ():
            proxy = _proxy(traced, mode)
            if name in self._held and proxy is not None and proxy.node.op == "placeholder":
                self.buffers.setdefault(proxy.node, name)

    def known(self) -> set:
        """The nodes whose values a call's decision is made from: inputs and buffers."""
        return set(self.nodes) | set(self.buffers)


def _proxy(value, mode):
    """The proxy tracing `value` in `mode`, or None."""
    if not isinstance(value, torch.Tensor):
        return None
    return get_proxy_slot(value, mode.tracer, None, lambda slot: slot.proxy)


@contextlib.contextmanager
def eager_mask_decisions(model: torch.nn.Module, args: tuple, kwargs: dict, guards: list):
    """Within (a trace of `model` on `args`, `kwargs`): transformers' mask decisions are
    eager's; those read from values the caller passes are appended to `guards`
    (`torchlib.value_guards`). Does nothing where transformers' masking module was not
    imported."""
    masking = sys.modules.get("transformers.masking_utils")
    # The tracing checks `_as_eager` answers: transformers 5.17 asks `is_tracing` alone,
    # later versions `is_torchdynamo_exporting` too.
    if masking is None or not any(hasattr(masking, name) for name in _TRACING_CHECKS):
        yield
        return
    inputs = CallInputs(args, kwargs, model)
    wrapped = {name: _eager_when_unpadded(masking, getattr(masking, name), inputs, guards)
               for name in _DECISIONS if hasattr(masking, name)}
    if hasattr(masking, _PACKED):
        wrapped[_PACKED] = _eager_when_computed(masking, getattr(masking, _PACKED), inputs, guards)
    handle = model.register_forward_pre_hook(inputs.hook, with_kwargs=True, prepend=True)
    try:
        with replaced(masking, wrapped):
            yield
    finally:
        handle.remove()


def _eager_when_unpadded(masking, original, inputs: CallInputs, guards: list):
    @functools.wraps(original)
    def decide(padding_mask, *args, **kwargs):
        values = None if padding_mask is None else shape_determined(padding_mask)
        if padding_mask is not None and values is None:
            decided = _caller_decision(masking, original, padding_mask, args, kwargs, inputs, guards)
            return original(padding_mask, *args, **kwargs) if decided is None else decided
        with _as_eager(masking), unset_fake_temporarily(), disable_proxy_modes_tracing():
            return original(values, *args, **kwargs)
    return decide


def _as_eager(masking):
    """transformers' tracing checks answered as eager answers them, for a decision on
    values known here (none, or computed from shapes)."""
    return replaced(masking, {name: lambda *_: False for name in _TRACING_CHECKS if hasattr(masking, name)})


def _eager_when_computed(masking, original, inputs: CallInputs, guards: list):
    @functools.wraps(original)
    def find(position_ids):
        values = shape_determined(position_ids)
        if values is not None:
            with _as_eager(masking), unset_fake_temporarily(), disable_proxy_modes_tracing():
                if original(values) is None:
                    return None   # eager's answer: one sequence per row
        elif _caller_decision(masking, original, position_ids, (), {}, inputs, guards):
            return None
        return original(position_ids)
    return find


def _caller_decision(masking, original, tensor: torch.Tensor, args: tuple, kwargs: dict,
                     inputs: CallInputs, guards: list) -> bool | None:
    """Eager's answer of `original` for a `tensor` computed from the caller's inputs,
    recorded in `guards` with the way to it; None where that way cannot be recorded
    (`record_decision`)."""
    with _as_eager(masking):
        return record_decision(f"{original.__module__}.{original.__name__}", original, tensor, args,
                               kwargs, inputs, guards)


def record_decision(decision: str, decide, tensor: torch.Tensor, args: tuple, kwargs: dict,
                    inputs: CallInputs, guards: list, buffers_only: bool = False, **said) -> bool | None:
    """Eager's answer of `decide(tensor, *args, **kwargs)` (the function `decision` of
    `torchlib.value_guards.DECISIONS` names) for a traced `tensor` computed from the
    caller's inputs, appended to `guards` with the way to it (`said`: more the guard
    records for its message); None where that way cannot be recorded, or for a mask
    decision under torch.distributed: the traced answer (a mask) is right for every
    batch, and one plan for every rank is what FSDP2 needs (a rank whose batch answered
    otherwise would plan alone). A branch or an integer read from values
    (`input_branches`) has no traced answer, so it is recorded there too: rank 0's
    answer goes with its plan, and a rank whose batch answers otherwise plans its own
    under DDP (refused, saying so, under FSDP2). They were refused under
    torch.distributed with "cannot depend on tensor values", which one process trains
    (found by a review). `buffers_only`: None where a caller's input reaches `tensor`."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1 and DECISIONS.get(decision) not in ("branch", "integers"):
        return None
    found = ancestry(tensor, inputs.known(), constants=True)
    if found is None:
        return None
    nodes, read = found
    device = next((leaf.device for leaf in inputs.leaves if isinstance(leaf, torch.Tensor)), None)
    if device is None:   # no tensor input: nothing of the caller's to decide from
        return None
    refs = {node: {"input": inputs.nodes[node]} for node in inputs.nodes}
    refs.update({node: {"buffer": inputs.buffers[node]} for node in inputs.buffers})
    ops = []
    try:
        for node in nodes:
            if node.op == "get_attr":   # a tensor the forward built: recorded by value
                refs[node] = _constant(getattr(get_proxy_mode().tracer.root, node.target, None))
                continue
            ops.append([_op_name(node.target), encoded(list(node.args), refs, device),
                        {key: encoded(value, refs, device) for key, value in node.kwargs.items()}])
            refs[node] = {"op": len(ops) - 1}
        ancestors = _ancestors(read)
        reached = [refs[n] for n in inputs.known() if n in ancestors]
        guard = {"decision": decision,
                 "inputs": sorted({ref["input"] for ref in reached if "input" in ref}),
                 "ops": ops, "reads": refs[read], "args": encoded(list(args), {}, device),
                 "kwargs": {key: encoded(value, {}, device) for key, value in kwargs.items()}, **said}
        buffers = sorted({ref["buffer"] for ref in reached if "buffer" in ref})
        if buffers:   # only where read: a file of a guard of inputs alone is as before
            guard["buffers"] = buffers
    except Unrecordable:
        return None
    if guard["decision"] not in DECISIONS or not reached or buffers_only and guard["inputs"]:
        return None
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        guard["answer"] = answer(guard, inputs.leaves, decide, inputs.buffer)
    if not any(_asked(known) == _asked(guard) for known in guards):   # once: a read per layer
        guards.append(guard)
    return guard["answer"]


def _asked(guard: dict) -> dict:
    """A guard's question: what it records but its answer and the line that asked."""
    return {key: value for key, value in guard.items() if key not in ("answer", "line")}


#: In-place ops that change a tensor's autograd metadata alone, not its values: replayed
#: as their out-of-place op (`detach_` as `detach`), they write into no caller's tensor.
METADATA_WRITES = {torch.ops.aten.detach_.default: "aten.detach.default"}
#: The largest tensor the forward built that a decision records by value.
_CONSTANT_LIMIT = 4096


def _op_name(target) -> str:
    """The name `torchlib.value_guards` replays `target` by."""
    if target is operator.getitem:
        return "getitem"
    return METADATA_WRITES.get(target, str(target))


def _constant(value) -> dict:
    """A small tensor the forward built (`torch.tensor([0, 1])`), recorded by its values."""
    if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or \
            value.numel() > _CONSTANT_LIMIT:
        raise Unrecordable("a tensor constant")
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        return {"tensor": value.tolist(), "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape)}


def _ancestors(target: torch.fx.Node) -> set:
    """`target` and the nodes it is computed from. (Once per decision: asked per input and
    buffer, a model of hundreds of buffers walked its graph hundreds of times.)"""
    stack, seen = [target], set()
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return seen


def ancestry(tensor: torch.Tensor, leaves: set, constants: bool = False) -> tuple[list, torch.fx.Node] | None:
    """The FX nodes computing a traced `tensor`, in graph order, and its own node, where
    every one is an op that draws nothing (and, with `leaves`, writes into no tensor of
    theirs nor a view of one), from `leaves` (nodes whose values are known) or from none
    (or, with `constants`, from tensor constants the forward built: `get_attr` nodes);
    else None (one reads a parameter, another input, a buffer not among `leaves`, a
    tensor the model holds).
    An op that writes into one of these tensors through a view of it, before one of them
    reads it (Qwen2-VL's `positions[0] += start`), is among them: replayed in order on
    real tensors, the write lands in the viewed tensor as in eager (found by a review: a
    chain without it, replayed, computed what its nodes compute and not what eager reads:
    a mask of labels written through a slice kept 0.831 where eager's loss was 0.816)."""
    mode = get_proxy_mode()
    if mode is None or not isinstance(tensor, torch.Tensor):
        return None
    proxy = get_proxy_slot(tensor, mode.tracer, None, lambda slot: slot.proxy)
    if proxy is None:
        return None
    order = {n: i for i, n in enumerate(proxy.node.graph.nodes)}
    needed, reached, stack = set(), set(), [proxy.node]
    while stack:
        while stack:
            node = stack.pop()
            if node in needed:
                continue
            if node in leaves:
                reached.add(node)
                continue
            if node.op == "call_function" and node.target is operator.getitem:
                needed.add(node)   # one result of an op of several (`unbind`: a loop over rows)
                stack.extend(node.all_input_nodes)
                continue
            if constants and node.op == "get_attr" and node.users and all(
                    user.target is torch.ops.aten.lift_fresh_copy.default for user in node.users):
                # A tensor the forward built (`torch.tensor(1.0)`), which the trace reads through
                # a fresh copy (`held_tensors._made_in_forward`): the same at every call. One the
                # model holds (a plain attribute, perhaps a `.data` alias of a parameter) is read
                # directly and may change between calls, with nothing recorded to see it.
                needed.add(node)
                continue
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
                    torch.Tag.nondeterministic_seeded in node.target.tags:
                return None
            needed.add(node)
            stack.extend(node.all_input_nodes)
        for node in needed | reached:   # writes through views before a read: replayed too
            stack.extend(_unreplayed_writes(node, needed, order))
    # Replayed on a call's inputs (or the model's buffers), a write into one would write
    # into the caller's tensors. (A write reaches what it writes into: among `reached`.)
    written = set().union(*(_aliases(leaf) for leaf in reached))
    if any(value in written for node in needed for value in _written(node)):
        return None
    return (node_order(needed) if needed else []), proxy.node


def _aliases(node: torch.fx.Node) -> set:
    """`node` and the nodes viewing its tensor (views, results of in-place ops on them)."""
    aliases, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in aliases:
            continue
        aliases.add(current)
        for user in current.users:
            if user.target is operator.getitem or (   # one view of several (`split`, `unbind`)
                    isinstance(user.target, torch._ops.OpOverload) and user.target not in METADATA_WRITES
                    and any(r.alias_info is not None for r in user.target._schema.returns)):
                stack.append(user)
    return aliases


def _written(node: torch.fx.Node) -> list:
    """The nodes whose tensors the op of `node` writes into (a BatchNorm's running
    statistics too, which its schema does not mark: `fx_nodes.written_arguments`)."""
    if node.target in METADATA_WRITES:
        return []
    return [value for value in written_arguments(node) if isinstance(value, torch.fx.Node)]


def _unreplayed_writes(node: torch.fx.Node, chain: set, order: dict) -> list:
    """The ops outside `chain` that write into `node`'s tensor, or a view of it, before an
    op of `chain` reads it (or a view of it); one after the chain's reads (Qwen2-VL adds
    to positions it has already read) changes nothing read."""
    aliases = _aliases(node)
    writers = [user for alias in aliases for user in alias.users
               if user not in chain and any(value in aliases for value in _written(user))]
    if not writers:
        return []
    last_read = max((order[reader] for reader in chain
                     if any(value in aliases for value in reader.all_input_nodes)), default=-1)
    return [writer for writer in writers if order[writer] < last_read]


def shape_determined(tensor: torch.Tensor) -> torch.Tensor | None:
    """The values of a traced tensor computed by ops that read no input, parameter or
    buffer and draw nothing (an `arange` of a length, offset and expanded; a mask of ones
    the forward made, compared with a tensor constant it made too): the same at every
    call, so computed here, for real; else None."""
    found = ancestry(tensor, set(), constants=True)
    if found is None:
        return None
    nodes, read = found
    root = get_proxy_mode().tracer.root
    computed: dict = {}
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        for node in nodes:
            if node.op == "get_attr":
                value = getattr(root, node.target, None)
                if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
                    return None
                computed[node] = value
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), computed.__getitem__)
            if any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((args, kwargs))):
                return None   # a symbolic size: not one value
            computed[node] = node.target(*args, **kwargs)
    return computed[read]


def node_order(nodes: set) -> list:
    """`nodes` in their graph's order (every input before its reader)."""
    order = {node: index for index, node in enumerate(next(iter(nodes)).graph.nodes)}
    return sorted(nodes, key=order.__getitem__)
