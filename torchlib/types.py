"""The one mapping between PyTorch objects and IR types, both directions.

The frontend uses it to write dtypes and op arguments into the IR; the PyTorch
runtime uses it to turn them back into torch objects when it executes a graph
read from a file, and profiling uses it to run single ops. Keeping both
directions here means a dtype or argument kind added on one side cannot be
forgotten on the other, and it lets frontends and runtimes share it without
importing each other (it imports only `remat_ir.ir` and torch).
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.utils import _pytree as pytree

from remat_ir.ir import arguments
from remat_ir.ir.dtypes import dtype_from_name, dtype_name

from . import ctc_loss  # noqa: F401  registers remat_ir::ctc_loss, which graphs name
from . import layout_draws  # noqa: F401  registers remat_ir::draw_in_layout, which graphs name
from . import masked_assign  # noqa: F401  registers remat_ir::put_masked, which graphs name
from . import masked_fill_grads  # noqa: F401  registers remat_ir::masked_fill_value_grad
from . import spec_augment  # noqa: F401  registers remat_ir::spec_augment_mask, which graphs name
from . import value_checks  # noqa: F401  registers remat_ir::value_check, which graphs name

#: remat-ir's own ops whose workspace their arguments' shapes tell, where a run on synthetic
#: inputs does not (the CTC loss's, the boolean-mask assignment's:
#: `runtimes/profiling.declared_workspace`): op -> bytes from its arguments.
DECLARED_WORKSPACES = {**ctc_loss.WORKSPACES, **masked_assign.WORKSPACES, **masked_fill_grads.WORKSPACES}
#: remat-ir's own ops that must run exactly once per step (`Node.non_recomputable`): each run
#: draws from a host generator the graph cannot replay.
ONCE_PER_STEP = frozenset({spec_augment.OP})

_TORCH_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32,
    "uint64": torch.uint64, "bool": torch.bool, "complex32": torch.complex32,
    "complex64": torch.complex64, "complex128": torch.complex128,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}
_IR_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format,
}
_IR_MEMORY_FORMATS = {v: k for k, v in _MEMORY_FORMATS.items()}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr}
_IR_LAYOUTS = {v: k for k, v in _LAYOUTS.items()}


def ir_dtype(dtype: torch.dtype) -> int:
    """IR enum value of a torch dtype; ValueError naming it if the IR has none."""
    try:
        return dtype_from_name(_IR_DTYPES[dtype])
    except KeyError:
        raise ValueError(f"the IR has no dtype for {dtype}") from None


def torch_dtype(dtype: int) -> torch.dtype:
    return _TORCH_DTYPES[dtype_name(dtype)]


def empty_tensor(value, device: torch.device | str) -> torch.Tensor:
    """An uninitialized tensor with an IR value's shape, strides and dtype on `device`.

    Profiling builds its synthetic op inputs from it, and the runtime its placeholders
    (inputs a skipped random op does not have at hand): both must match the value's
    layout exactly, since an op's kernel, cost and random draws may depend on strides.
    """
    dtype = torch_dtype(value.dtype)
    if value.stride:
        return torch.empty_strided(list(value.shape), list(value.stride), dtype=dtype, device=device)
    return torch.empty(list(value.shape), dtype=dtype, device=device)


def constant_tensor(value, device: torch.device | str) -> torch.Tensor:
    """An IR constant (a lifted tensor the graph holds by value) as a tensor on `device`."""
    dtype = torch_dtype(value.dtype)
    if value.constant.raw:
        flat = torch.frombuffer(bytearray(value.constant.raw), dtype=dtype)
    else:  # zero elements: frombuffer refuses an empty buffer
        flat = torch.empty(0, dtype=dtype)
    return flat.reshape(list(value.shape)).to(device)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's elements as bytes, row-major (what `constant_tensor` reads back)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def to_ir_argument(obj, tensor_id):
    """An FX argument as an IR argument object; `tensor_id(node)` maps graph nodes to value ids."""
    if isinstance(obj, torch.fx.Node):
        return arguments.TensorRef(tensor_id(obj))
    if isinstance(obj, (list, tuple)):
        items = [to_ir_argument(x, tensor_id) for x in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, torch.dtype):
        return arguments.DTypeArg(_IR_DTYPES[obj])
    if isinstance(obj, torch.device):
        return arguments.Device(str(obj))
    if isinstance(obj, torch.memory_format):
        return arguments.MemoryFormatArg(_IR_MEMORY_FORMATS[obj])
    if isinstance(obj, torch.layout):
        return arguments.LayoutArg(_IR_LAYOUTS[obj])
    if obj is None or isinstance(obj, (bool, int, float, complex, str)):
        return obj
    raise TypeError(f"an argument of type {type(obj).__name__} ({obj!r})")


def to_torch_argument(obj, tensor, device: torch.device):
    """An IR argument object as what the op takes; `tensor(ref)` gives the tensor or its name.

    Device arguments are replaced by `device`: a graph runs on the device of
    its inputs, whatever device it was lowered on.
    """
    if isinstance(obj, arguments.TensorRef):
        return tensor(obj)
    if isinstance(obj, (list, tuple)):
        items = [to_torch_argument(x, tensor, device) for x in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, arguments.DTypeArg):
        return _TORCH_DTYPES[obj.name]
    if isinstance(obj, arguments.Device):
        return device
    if isinstance(obj, arguments.MemoryFormatArg):
        return _MEMORY_FORMATS[obj.name]
    if isinstance(obj, arguments.LayoutArg):
        return _LAYOUTS[obj.name]
    return obj


#: The namespace of the ops that stand for user-defined `torch.autograd.Function`s
#: (`frontends/autograd_functions.py`), registered by the process that lowers the model.
FUNCTION_NAMESPACE = "remat_ir_fn"


def resolve_op(name: str):
    """The OpOverload for an IR op name like 'aten.mm.default'; LookupError if unknown."""
    parts = name.split(".")
    if len(parts) != 3:
        raise LookupError(f"{name!r} is not a PyTorch op name of the form namespace.op.overload")
    namespace, op, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        hint = ""
        if namespace == FUNCTION_NAMESPACE:
            hint = (" (a custom torch.autograd.Function, which lowering turns into an op that "
                    "exists only in the process that lowered the model: in this process, call "
                    "remat_ir.remat on the model instead of loading a saved one; cache_dir= "
                    "makes that fast)")
        raise LookupError(f"PyTorch has no op {name!r}{hint}") from None


def op_name(op) -> str:
    """IR name of an OpOverload: 'aten.mm.default'."""
    return f"{op.namespace}.{op._schema.name.split('::')[1]}.{op._overloadname}"


#: Device types whose autocast state a lowering records (graph metadata "torch.autocast")
#: and a call is compared against: the casts autocast inserts are traced into the graph.
AUTOCAST_DEVICES = ("cpu", "cuda")


#: The dtype `torch.get_autocast_dtype(device)` gives where no autocast context chose one.
_DEFAULT_AUTOCAST_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16}
#: How `autocast_state` marks a device whose autocast is off but set to another dtype.
_DISABLED = " disabled"


def autocast_state() -> tuple[tuple[str, str], ...]:
    """((device type, dtype name), ...) of the autocast contexts active now, and of those
    entered disabled with another dtype than torch's default (`torch.autocast("cpu",
    dtype=torch.float16, enabled=False)`, or `torch.set_autocast_dtype`), whose dtype name
    is followed by " disabled". Why the disabled ones: a forward can read the dtype
    (`torch.get_autocast_dtype`) and branch on it, and an inner `torch.autocast(device)`
    block without a dtype takes it; the trace holds the branch and the casts of the
    dtype it saw, so a call under another must be lowered again (found by a review: a
    graph lowered outside autocast ran under a disabled float16 one, its loss 17.5 off
    eager's, silently). Disabled with the default dtype is "off": ()."""
    state = []
    for device in AUTOCAST_DEVICES:
        dtype = torch.get_autocast_dtype(device)
        if torch.is_autocast_enabled(device):
            state.append((device, _IR_DTYPES[dtype]))
        elif dtype != _DEFAULT_AUTOCAST_DTYPES[device]:
            state.append((device, _IR_DTYPES[dtype] + _DISABLED))
    return tuple(state)


def autocast_enabled() -> bool:
    """Whether autocast is on for a device whose state a lowering records (`autocast_state`
    also names disabled contexts)."""
    return any(torch.is_autocast_enabled(device) for device in AUTOCAST_DEVICES)


def autocast_cache() -> bool:
    """Whether autocast's cast cache is on (`torch.is_autocast_cache_enabled()`), autocast
    on or off: with it, eager casts a parameter once per region for all its readers (a
    graph lowered so shares one cast, `frontends/autocast_casts.py`); without, once per
    reader. Off too: an inner `torch.autocast` block of the forward inherits the setting
    (`torch.autocast(..., enabled=False, cache_enabled=False)` around the call, or
    `torch.set_autocast_cache_enabled(False)`), so a graph lowered with the cache on would
    share casts eager's block makes per reader (found by a review: 3.1e-3 relative off
    eager's gradients, silently)."""
    return torch.is_autocast_cache_enabled()


def autocast_nested() -> bool:
    """Whether the call runs inside a `torch.autocast` block, entered enabled or not
    (autocast's nesting count, read by counting up and down: neither clears the cache).
    Eager's cast cache then lives until that block ends: the blocks of the forward share
    it with the caller's casts and with the module's other calls in the block
    (`frontends/autocast_blocks.py`)."""
    nested = torch.autocast_increment_nesting() > 1
    torch.autocast_decrement_nesting()
    return nested


#: The flag (`torch._C._get_<flag>_sdp_enabled`) of each scaled-dot-product-attention
#: backend `sdpa_state` names, by `SDPBackend` name (FA3 is in no priority order).
_SDPA_FLAGS = {"CUDNN_ATTENTION": "cudnn", "FLASH_ATTENTION": "flash",
               "EFFICIENT_ATTENTION": "mem_efficient", "MATH": "math", "OVERRIDEABLE": "overrideable",
               "FA3": "fa3"}


def sdpa_state() -> str:
    """The scaled-dot-product-attention kernels a call may pick, in their priority order,
    and whether the math kernel may reduce in half precision: the trace holds the kernel
    it picked (`_scaled_dot_product_flash_attention_for_cpu`), and eager picks per call
    (`with sdpa_kernel(SDPBackend.MATH):`), whose gradients differ in the last bits (in
    bfloat16, 6e-5: found by a review, silently)."""
    order, enabled, reducing, library, fast_path = sdpa_flags()
    names = [name for name in [*(torch.nn.attention.SDPBackend(i).name for i in order), "FA3"]
             if name in _SDPA_FLAGS and enabled[list(_SDPA_FLAGS).index(name)]]
    return ", ".join(names + ["MATH reducing in half precision"] * reducing
                     + [f"diffusers' attention backend {library}"] * (library is not None)
                     + ["the attention layers' fast path off"] * (not fast_path))


def sdpa_flags() -> tuple:
    """What `sdpa_state` describes, as read (a key: a few calls, no names). With
    `torch.backends.mha`'s fast path: turned off so that a frozen eval encoder trains as
    the graph computes (`frontends/fast_paths.py`), then on again after `remat`, the step
    trained on with the plain ops where eager took the fused ones, 7.1e-2 off, silently
    (hunt60); now such a call plans again, and lowering refuses it."""
    return (tuple(torch._C._get_sdp_priority_order()),
            tuple(getattr(torch._C, f"_get_{flag}_sdp_enabled", bool)() for flag in _SDPA_FLAGS.values()),
            torch._C._get_math_sdp_allow_fp16_bf16_reduction(), _diffusers_backend(),
            torch.backends.mha.get_fastpath_enabled())


def _diffusers_backend() -> str | None:
    """diffusers' global attention backend (`with attention_backend("_native_math"):`),
    where diffusers' dispatch is loaded: its attention picks a kernel by it, in a library's
    class the model's reads are not recorded in. Switched after `remat`, the step ran the
    traced one, 1.5e-8 off eager's gradients, silently (found by hunt55)."""
    dispatch = sys.modules.get("diffusers.models.attention_dispatch")
    backend = getattr(getattr(dispatch, "_AttentionBackendRegistry", None), "_active_backend", None)
    name = None if backend is None else str(getattr(backend, "value", backend))
    # Its default is no setting: a graph lowered before diffusers was loaded (a file, an
    # ONNX model's) runs after as before.
    return None if name == "native" else name


def cpu_kernels_state() -> str:
    """Which CPU kernels a step runs, as far as they change its memory: whether oneDNN is
    on, whether NNPACK is (the convolutions oneDNN does not take), and the number of
    threads (oneDNN's convolutions take workspaces that depend on both). Profiling
    measures what the kernels take under this state, and a plan is made for those bytes:
    run under another, four convolutions took 4.1x their byte budget (oneDNN off) or
    1.14x (one thread planned, two run), three 3.27x (NNPACK off, oneDNN off), silently
    (found by reviews). oneDNN comes first: it alone changes which ops a trace holds."""
    onednn = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
    nnpack = torch.backends.nnpack.is_available() and torch._C._get_nnpack_enabled()
    threads = torch.get_num_threads()
    return (f"oneDNN {'on' if onednn else 'off'}, NNPACK {'on' if nnpack else 'off'}, "
            f"{threads} thread{'s' * (threads != 1)}")


def cpu_kernels_flags() -> tuple:
    """What `cpu_kernels_state` describes, as read (a key), then whether denormals are
    flushed (`flushes_denormals`), and last the float32 precision the CPU kernels compute
    in (`cpu_precision_flags`): the forward's are compared with the backward's where the
    backward computes forward values again (`backward_settings`). A signature holds
    neither of the last two (a graph's ops are the same under any); in the key of a
    remembered signature they only split entries that are equal."""
    return (torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled(), torch.get_num_threads(),
            flushes_denormals(), cpu_precision_flags())


#: The smallest normal double: half of it is a denormal, or zero where denormals are flushed.
_SMALLEST_NORMAL = 2.2250738585072014e-308


def flushes_denormals() -> bool:
    """Whether `torch.set_flush_denormal(True)` is in effect: torch keeps no getter, and the
    CPU's flush-to-zero mode it sets applies to Python's own float arithmetic too (0.3
    microseconds, where a tensor op read back took 8)."""
    return _SMALLEST_NORMAL * 0.5 == 0.0


#: The settings of the float32 precision oneDNN's kernels compute in (a matmul, a
#: convolution, an RNN: "bf16" or "tf32" computes them in lower precision, "ieee" in
#: float32, "none" inherits the parent's), by the names they are set by, with the
#: (backend, op) torch keeps each under; `torch.set_float32_matmul_precision("medium")`
#: sets the matmul's to "bf16".
CPU_PRECISION_SETTINGS = {"torch.backends.fp32_precision": ("generic", "all"),
                          "torch.backends.mkldnn.fp32_precision": ("mkldnn", "all"),
                          "torch.backends.mkldnn.matmul.fp32_precision": ("mkldnn", "matmul"),
                          "torch.backends.mkldnn.conv.fp32_precision": ("mkldnn", "conv"),
                          "torch.backends.mkldnn.rnn.fp32_precision": ("mkldnn", "rnn")}


def cpu_precision_flags() -> tuple[str, ...]:
    """The values of `CPU_PRECISION_SETTINGS`, in that order (read from torch directly:
    a half microsecond, where the attributes took 15 for every call's signature key)."""
    read = torch._C._get_fp32_precision_getter
    return tuple(read(backend, op) for backend, op in CPU_PRECISION_SETTINGS.values())


def autocast_caches(tensor: torch.Tensor) -> bool:
    """Whether autocast's cache would keep `tensor`'s cast for the rest of the block, for
    every reader: a float32 leaf (not a view) that requires a gradient, as eager's
    `cached_cast` decides. Any other tensor is cast once per reader."""
    return (tensor.dtype == torch.float32 and tensor.requires_grad and tensor.is_leaf
            and not tensor._is_view())


def cast_per_reader(tensor: torch.Tensor) -> bool:
    """Whether autocast would cast `tensor` (float32, needing a gradient) once per reader
    where it casts a leaf once per cache: one that is not a leaf (hidden states from a
    layer outside the module). The trace must know it (a signature difference): its
    gradient is summed otherwise. Whatever autocast is around the call where the forward
    has autocast blocks of its own, which cast it too."""
    return tensor.dtype == torch.float32 and tensor.requires_grad and not autocast_caches(tensor)


@contextlib.contextmanager
def entered_autocast(state: tuple[tuple[str, str], ...]):
    """The autocast contexts `state` (as `autocast_state` gives it) describes, entered."""
    with contextlib.ExitStack() as stack:
        for device, dtype in state:
            name = dtype.removesuffix(_DISABLED)
            stack.enter_context(torch.autocast(device, dtype=_TORCH_DTYPES[name], enabled=name == dtype))
        yield


def describe_input(leaf) -> str:
    """How a signature names one input leaf: 'tensor [2, 16] int64' (with its layout when
    it is not contiguous: 'tensor [8, 3, 64, 64] float32 channels_last'), else the value's
    repr (a flag such as use_cache=False is baked into the trace). The layout belongs to
    the signature because the trace holds it: a `view` lowered for one layout fails on
    another, and the plan's copies and costs were made for it. So does whether the tensor
    requires a gradient ('... requires_grad'): the graph computes a gradient for it only if
    it did when traced; its class where it is not `torch.Tensor` and the Python attributes
    it carries (`carried_names`); and, under autocast with its cache, whether autocast casts it once
    or per reader ('... requires_grad non-leaf', `cast_per_reader`; a forward with
    autocast blocks of its own is told it by `runtimes.signatures.Signature.autocast_blocks`,
    so that a graph without them is not lowered again for it)."""
    if isinstance(leaf, torch.Tensor):
        layout = describe_layout(leaf)
        attributes = carried_names(leaf)
        return (f"tensor {list(leaf.shape)} {_IR_DTYPES.get(leaf.dtype, str(leaf.dtype))}"
                + (f" {layout}" if layout != "contiguous" else "")
                + (" requires_grad" if leaf.requires_grad else "")
                + (" non-leaf" if cast_per_reader(leaf) and autocast_enabled()
                   and torch.is_autocast_cache_enabled() else "")
                + (f" {type(leaf).__module__}.{type(leaf).__qualname__}"
                   if type(leaf) not in (torch.Tensor, torch.nn.Parameter) else "")
                + (f" carrying {', '.join(attributes)}" if attributes else ""))
    return repr(leaf)


def carried_names(tensor: torch.Tensor) -> tuple[str, ...]:
    """The Python attributes set on `tensor` (`x.scale = 2.5`), which a forward may read
    (`getattr(x, "scale", 1.0)`): the trace holds what it read, so a call whose input
    carries others is another signature, lowered for them (`frontends/tensor_attributes.py`
    refuses those the forward reads). Found by a review: an input given `.scale` after
    `remat` ran the plan traced without it, 0.32 off eager's output, silently. So is the
    tensor's class (a subclass's `__torch_function__`, a branch on `isinstance`), but for
    `nn.Parameter`, which the model's own tensors passed as arguments are (matched by
    identity: `runtimes/torch.py`, `member_arguments_differ`)."""
    return tuple(sorted(name for name in vars(tensor) if not name.startswith("__")))


def describe_layout(tensor: torch.Tensor) -> str:
    """'contiguous', 'channels_last', 'channels_last_3d' or 'strides (…)': how error
    messages and signatures name a tensor's layout. A name stands for its strides exactly,
    those of dimensions of size 1 too: kernels choose from them (`conv2d` on a
    channels-last batch of one gives a contiguous result where the batch stride is C and
    a channels-last one where it is C*H*W), so a tensor whose strides of size-1
    dimensions differ from traced is a new signature, lowered for them (a graph traced
    for the others drew a dropout's mask in another layout than eager, silently)."""
    if tensor.layout != torch.strided:
        # Its layout by name ('torch.sparse_coo'): a sparse input where a dense one was
        # lowered ran the dense plan (6e-8 off eager's output, or a kernel's error from
        # inside a segment; found by a review); lowered again, it is refused clearly.
        return str(tensor.layout)
    # `is_contiguous` ignores dimensions of size 1: without any, it says it all (the usual
    # case, a fraction of a microsecond); with some, torch.empty's strides are compared.
    exact = 1 not in tensor.shape
    if tensor.is_contiguous():
        if exact:
            return "contiguous"
        strides, step, contiguous = tuple(tensor.stride()), 1, []
        for size in reversed(tensor.shape):
            contiguous.append(step)
            step *= max(size, 1)
        if strides == tuple(reversed(contiguous)):
            return "contiguous"
    for name, memory_format, dims in (("channels_last", torch.channels_last, 4),
                                      ("channels_last_3d", torch.channels_last_3d, 5)):
        if tensor.dim() == dims and tensor.is_contiguous(memory_format=memory_format) and (
                exact or tensor.stride() == torch.empty(tensor.shape, device="meta",
                                                        memory_format=memory_format).stride()):
            return name
    return f"strides {tuple(tensor.stride())}"


def same_layout(tensor: torch.Tensor, shape, stride) -> bool:
    """Whether `tensor` (of `shape`) has strides `stride`, where dimensions of size 1 have
    any stride: they never change which element an index reads (but kernels may choose
    from them: `describe_layout`)."""
    if tensor.layout != torch.strided:
        return True
    actual = tensor.stride()
    return all(a == s for a, s, n in zip(actual, stride, shape) if n > 1)


def storage_id(tensor: torch.Tensor) -> int | None:
    """The identity of `tensor`'s storage, shared by its views and detached aliases (None
    for a tensor without storage, or a lazy module's parameter not made yet)."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, ValueError):   # ValueError: UninitializedParameter
        return None


def overlaps(shape, stride) -> bool:
    """Whether a layout may map two indices to one element (`Tensor.unfold` with a step
    below its size, `as_strided`, `expand`): a tensor laid out so cannot hold arbitrary
    values. Conservative: a layout whose dimensions interleave counts as overlapping."""
    extent = 0
    for n, s in sorted(((n, s) for n, s in zip(shape, stride) if n > 1), key=lambda d: d[1]):
        if s <= extent:
            return True
        extent += (n - 1) * s
    return False


def overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two of `tensor`'s elements are one element of memory (`x.unfold(-1, 8, 4)`,
    overlapping `as_strided` windows, `expand`), exactly: the conservative `overlaps`
    first, then, where its dimensions interleave, each element's offset counted (PyTorch's
    own check gives up there, so eager writes such a tensor in place without an error)."""
    if tensor.layout != torch.strided or not overlaps(tensor.shape, tensor.stride()):
        return False
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(tensor.shape, tensor.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return offsets.unique().numel() < offsets.numel()


def argument_name(path) -> str:
    """The caller's name for the leaf at pytree key `path` of (args, kwargs): 'input_ids',
    'pixel_values[0]', or 'args[1]' for positional argument 1. Signatures name arguments
    with it, and the frontend writes it into the IR (`GraphInput.argument_name`)."""
    (top, *rest) = path[1:]  # path[0] picks args or kwargs
    head = f"args[{top.idx}]" if path[0].idx == 0 else top.key
    return head + "".join(pytree.keystr((k,)) for k in rest)


def argument_names(spec: pytree.TreeSpec) -> list[str]:
    """The name of each flat leaf of (args, kwargs) structured as `spec`, in flat order."""
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    with_paths, _ = pytree.tree_flatten_with_path(tree)
    return [argument_name(path) for path, _ in with_paths]


#: PyTorch's CUDA caching allocator rounds every block up to a multiple of 512 bytes
#: (`kMinBlockSize`); `torch.cuda.memory_allocated` counts the rounded sizes. Measured on
#: an H100: the tiny CNN with BatchNorm, compiled, 41% above its unrounded plan and
#: within 5% of the rounded one; the offloaded tiny GPT-2 9.9% above, then 6.4%.
CUDA_ALLOCATION_GRANULARITY = 512


def record_device(provenance, device: torch.device | str) -> None:
    """Record in a graph's `Provenance` the device it is described for: `cost_device`,
    the bytes a random node's replay holds there for a moment (`rng_replay_bytes`:
    setting the CPU generator's state goes through a state tensor made for the call,
    `runtimes/codegen.py`, `_rng_functions`; a CUDA generator's state is a host tensor,
    which takes no device memory), what its allocator rounds allocations up to
    (`allocation_granularity_bytes`; the CPU allocator's sizes are exact), and that the
    runtime makes the output gradients as the backward starts
    (`runtime_makes_gradient_seeds`: `runtimes/torch.py`'s `_Step.begin`)."""
    device = torch.device(device)
    provenance.cost_device = str(device)
    provenance.rng_replay_bytes = torch.default_generator.get_state().nbytes if device.type == "cpu" else 0
    provenance.allocation_granularity_bytes = CUDA_ALLOCATION_GRANULARITY if device.type == "cuda" else 0
    provenance.runtime_makes_gradient_seeds = True


def input_aliases(with_paths) -> tuple[tuple[str, ...], ...]:
    """Groups of the names of tensor leaves (`tree_flatten_with_path`'s) that are one
    tensor object (`Signature.aliases`), each sorted, in order."""
    groups: dict[int, list[str]] = {}
    for path, leaf in with_paths:
        if isinstance(leaf, torch.Tensor):
            groups.setdefault(id(leaf), []).append(argument_name(path))
    return tuple(sorted(tuple(sorted(names)) for names in groups.values() if len(names) > 1))
