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
is data, whose values eager reads (is every token kept?) and one graph cannot: there
transformers' traced answer stays (README, grouped-query attention).

Causal models ask one more question first: do the position ids pack several sequences
in a row (`find_packed_sequence_indices`)? Eager reads their values; traced, the answer
was always "maybe", so the mask was built, and with fewer key/value heads than query
heads the keys and values were repeated to every head where eager calls SDPA with
`enable_gqa` (Llama, Mistral, Qwen2, GPT-BigCode: gradients 1e-7 off in float32, a
bfloat16 last bit under autocast). Where the model computed the position ids itself
from shapes alone (an `arange`, when the caller passes none), their values are the
same at every call: they are computed here from the ops that traced them, and eager's
answer is given. Position ids the caller passes are data, and keep the traced answer.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode, get_proxy_slot
from torch.utils import _pytree as pytree

#: transformers' functions deciding whether SDPA may run without an explicit mask.
_DECISIONS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")
#: transformers' function finding sequences packed in a row from the position ids.
_PACKED = "find_packed_sequence_indices"


@contextlib.contextmanager
def eager_mask_decisions():
    """Within: transformers' mask decisions are eager's where they read no value the
    caller passes (no padding mask, or one and position ids the model computed from
    shapes). Does nothing where transformers' masking module was not imported."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "is_torchdynamo_exporting"):
        yield
        return
    wrapped = {name: _eager_when_unpadded(masking, getattr(masking, name))
               for name in _DECISIONS if hasattr(masking, name)}
    if hasattr(masking, _PACKED):
        wrapped[_PACKED] = _eager_when_computed(masking, getattr(masking, _PACKED))
    with _replaced(masking, wrapped):
        yield


@contextlib.contextmanager
def _replaced(module, replacements: dict):
    """Within: `module`'s attributes named in `replacements` are those; put back after."""
    saved = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _eager_when_unpadded(masking, original):
    @functools.wraps(original)
    def decide(padding_mask, *args, **kwargs):
        values = None if padding_mask is None else shape_determined(padding_mask)
        if padding_mask is not None and values is None:
            return original(padding_mask, *args, **kwargs)
        with _as_eager(masking), unset_fake_temporarily(), disable_proxy_modes_tracing():
            return original(values, *args, **kwargs)
    return decide


def _as_eager(masking):
    """transformers' tracing checks answered as eager answers them, for a decision on
    values known here (none, or computed from shapes)."""
    return _replaced(masking, {name: lambda *_: False for name in ("is_torchdynamo_exporting", "is_tracing")
                               if hasattr(masking, name)})


def _eager_when_computed(masking, original):
    @functools.wraps(original)
    def find(position_ids):
        values = shape_determined(position_ids)
        if values is not None:
            with _as_eager(masking), unset_fake_temporarily(), disable_proxy_modes_tracing():
                if original(values) is None:
                    return None   # eager's answer: one sequence per row
        return original(position_ids)
    return find


def shape_determined(tensor: torch.Tensor) -> torch.Tensor | None:
    """The values of a traced tensor computed by ops that read no input, parameter,
    buffer or constant and draw nothing (an `arange` of a length, offset and expanded):
    the same at every call, so computed here, for real; else None."""
    mode = get_proxy_mode()
    if mode is None or not isinstance(tensor, torch.Tensor):
        return None
    proxy = get_proxy_slot(tensor, mode.tracer, None, lambda slot: slot.proxy)
    if proxy is None:
        return None
    needed, stack = set(), [proxy.node]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
                torch.Tag.nondeterministic_seeded in node.target.tags:
            return None
        needed.add(node)
        stack.extend(node.all_input_nodes)
    computed: dict = {}
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        for node in node_order(needed):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), computed.__getitem__)
            if any(isinstance(a, torch.SymInt) for a in pytree.tree_leaves((args, kwargs))):
                return None   # a symbolic size: not one value
            computed[node] = node.target(*args, **kwargs)
    return computed[proxy.node]


def node_order(nodes: set) -> list:
    """`nodes` in their graph's order (every input before its reader)."""
    order = {node: index for index, node in enumerate(next(iter(nodes)).graph.nodes)}
    return sorted(nodes, key=order.__getitem__)
