"""PyTorch's inference fast paths of its attention layers, which eager takes and a trace
does not: refused by module.

`nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerEncoder` run
fused kernels (`torch._native_multi_head_attention`, `torch._transformer_encoder_layer_fwd`)
and, given a padding mask, nested tensors, where at the call the layer is in eval mode and
no gradient is asked of it (its parameters frozen and its input needing none, or the call
under `torch.no_grad()`), among other conditions. Tracing turns them off
(`_is_make_fx_tracing`), so the graph computes the layer's plain ops: found by hunt58, a
frozen eval encoder under a trainable head, with a padding mask, gave padded positions
values where eager's nested path gives zeros (loss 0.109 where eager gives 0.142, head
gradients 5.6e-2 off), and without a mask the fused kernels' last bits (3e-8); a teacher
branch under `torch.no_grad()` in eval mode did the same, silently. While the model is
traced, each such layer's call is checked against eager's conditions (`_fast`), and one
that eager would run fast is refused, naming the way out."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.modules.module import register_module_forward_hook

_LAYERS = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder)


@contextlib.contextmanager
def eager_fast_paths_noted(model: torch.nn.Module, found: list[str]):
    """Within (a trace of `model`): what to say of the outermost of its attention layers
    called where eager would take its fast path, appended to `found` on the way out. A
    global forward hook, registered before the trace notes the hooks a forward adds."""
    layers = {id(m): (path, m) for path, m in model.named_modules() if isinstance(m, _LAYERS)}
    if not layers or not torch.backends.mha.get_fastpath_enabled():
        yield
        return
    fast: list[tuple[str, str]] = []

    def check(module, args, kwargs, output):
        if id(module) in layers and (why := _fast(module, args, kwargs)) is not None:
            fast.append((layers[id(module)][0], why))

    handle = register_module_forward_hook(check, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
    if fast:
        path, why = min(fast, key=lambda taken: taken[0].count("."))
        module = layers[next(i for i, (p, _) in layers.items() if p == path)][1]
        found.append(
            f"{type(model).__name__}'s {path or '<root>'} ({type(module).__name__}) runs in eval mode with no "
            f"gradient asked of it ({why}), where eager takes PyTorch's inference fast path (fused attention "
            f"kernels, and nested tensors for a padding mask, whose padded positions come out as zeros) and a "
            f"traced graph the layer's plain ops, which compute otherwise. Turn the fast path off for the "
            f"whole training (`torch.backends.mha.set_fastpath_enabled(False)` before remat_ir.remat: eager "
            f"then computes as the graph does), or compute the layer outside the model and pass its result in")


#: torch's own forward of each layer: a subclass overriding it runs its own.
_FORWARDS = {kind: kind.forward for kind in _LAYERS}


def _runs_torchs_forward(cls: type) -> bool:
    """Whether `cls`'s forward is torch's own, or one of a subclass that calls it
    (`super().forward(...)`): eager takes the fast path there as well, whose fused kernel
    computed the last bits otherwise than the traced plain ops on an AVX-512 CPU, 1.1e-7
    off, silently, where that subclass was taken to run its own forward (found by a run
    of the suite on that CPU)."""
    forward = _FORWARDS[next(kind for kind in _LAYERS if issubclass(cls, kind))]
    if cls.forward is forward:
        return True
    names = set(getattr(getattr(cls.forward, "__code__", None), "co_names", ()))
    return "forward" in names and bool(names & {"super", *(kind.__name__ for kind in _LAYERS)})


def _kind(module: torch.nn.Module) -> type:
    return next(kind for kind in _LAYERS if isinstance(module, kind))


def _fast(module: torch.nn.Module, args: tuple, kwargs: dict) -> str | None:
    """Why eager's call of `module` with `args`, `kwargs` would take its fast path (its
    parameters frozen, or the call under no_grad), or None where it would not. PyTorch's
    conditions (torch 2.13's `MultiheadAttention.forward`, `TransformerEncoderLayer.forward`,
    `TransformerEncoder.forward`), less those tracing itself decides."""
    if module.training or torch.is_autocast_enabled() or not _runs_torchs_forward(type(module)):
        return None   # a subclass's own forward takes no fast path of torch's (hunt60)
    if isinstance(module, torch.nn.TransformerEncoder) and (
            any(type(layer) is not torch.nn.TransformerEncoderLayer for layer in module.layers)
            or _fast(module.layers[0], args[:1], {}) is None):
        return None   # the encoder's fast path is its layers' (hunt60: a SiLU encoder was refused)
    if not isinstance(module, torch.nn.MultiheadAttention) and (
            (len(args) > 1 and args[1] is not None) or kwargs.get("mask") is not None
            or kwargs.get("src_mask") is not None):
        return None   # an attention mask (a causal one) turned eager's fast path off (hunt60)
    attention = module if isinstance(module, torch.nn.MultiheadAttention) else \
        module.self_attn if isinstance(module, torch.nn.TransformerEncoderLayer) else module.layers[0].self_attn
    source = args[0] if args else kwargs.get("query" if attention is module else "src")
    if not isinstance(source, torch.Tensor) or source.dim() != 3 or not attention.batch_first \
            or attention.num_heads % 2 or attention.in_proj_bias is None or attention.in_proj_weight is None \
            or not attention._qkv_same_embed_dim or attention.bias_k is not None or attention.bias_v is not None \
            or attention.add_zero_attn or source.dtype != attention.in_proj_weight.dtype \
            or source.device.type not in ("cpu", "cuda"):
        return None
    if attention is module:
        key = args[1] if len(args) > 1 else kwargs.get("key")
        value = args[2] if len(args) > 2 else kwargs.get("value")
        # `forward(query, key, value, key_padding_mask, need_weights, attn_mask, ...)`
        masks = [kwargs.get("attn_mask"), kwargs.get("key_padding_mask"), *args[3:4], *args[5:6]]
        if key is not source or value is not source or any(
                isinstance(m, torch.Tensor) and m.is_floating_point() for m in masks):
            return None
    if isinstance(module, torch.nn.TransformerEncoderLayer) and (
            not module.activation_relu_or_gelu or module.norm1.eps != module.norm2.eps
            or any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())):
        return None
    tensors = [source, *module.parameters()]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return "under torch.no_grad()" if not torch.is_grad_enabled() else "its parameters and input need no gradient"
