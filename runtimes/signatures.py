"""Input signatures: what a call must share with a lowering to run its graph.

A lowered graph is one training step for one structure of inputs (which
positional and keyword arguments), one shape, dtype and layout (strides, when
not contiguous: `types.describe_layout`) per tensor, one value
per non-tensor argument (a flag such as `use_cache=False` is baked into the
trace), one autocast state (its casts are in the graph; its dtype also where autocast is
off, `types.autocast_state`, and its cast cache's setting) and one device type
(its costs were measured there). `Signature` holds these, argument by
argument, so that a call that differs can be described in one line: the
argument that is extra, missing, or of another shape, dtype or value. That line
names a value by its description unless the description is long (a numpy array's
repr holds every element): `shown_input`; the description itself stays the
signature's identity.

Keyword arguments are compared by name, not by the order they were passed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from remat_ir.torchlib.types import (argument_name, argument_names, autocast_cache, autocast_nested,
                                     autocast_state, carried_names, cast_per_reader,
                                     cpu_kernels_flags, cpu_kernels_state, describe_input,
                                     input_aliases, sdpa_flags, sdpa_state)

#: The attention kernels torch lets a call pick unless told otherwise.
DEFAULT_SDPA = sdpa_state()

@dataclass(frozen=True)
class Signature:
    """Arguments as (name, description) in a canonical order, autocast state, device type,
    and the containers that hold the arguments (`containers`: a list where a tuple was
    lowered, or a dict's keys in another order, name the same arguments, but the forward
    may tell them apart, and the graph's inputs are flattened in the lowered order)."""
    arguments: tuple[tuple[str, str], ...]
    autocast: tuple[tuple[str, str], ...]
    device: str
    containers: str = ""
    #: `torch.get_default_dtype()`: factory ops (`arange`, `full`) and tensor literals in
    #: a forward follow it, and casts to it that were no-ops when traced are not in the graph.
    default_dtype: str = "torch.float32"
    #: `autocast_cache()`: whether a parameter read by several ops is cast once or per op.
    autocast_cache: bool = True
    #: (name, how messages show it) for the arguments whose description is too long to
    #: quote (`shown_input`); not part of the identity, which the descriptions are.
    shown: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    #: The names of tensor arguments that are one tensor (`m(a, a)`), in groups: the trace
    #: reads such a tensor once, so a graph lowered so computes with the first one where a
    #: call passes two (silently wrong before), and one lowered for two reads them apart.
    aliases: tuple[tuple[str, ...], ...] = ()
    #: `sdpa_state()`: the attention kernels a call may pick (the trace holds the one it
    #: picked); a graph that recorded none was lowered under torch's defaults.
    sdpa: str = DEFAULT_SDPA
    #: `torch.are_deterministic_algorithms_enabled()`: a forward may branch on it (a
    #: deterministic scatter instead of `index_add_`), and the trace holds the branch it
    #: took (found by a review: toggled after `remat`, trained on, silently).
    deterministic: bool = False
    #: `cpu_kernels_state()` for a call on CPU ("" elsewhere): the memory profiling
    #: measured, and so the plan's peak, holds for this oneDNN setting and thread count.
    cpu_kernels: str = ""
    #: The keywords a forward taking `**kwargs` gets there, in the order passed
    #: (`free_keywords`): it may iterate them (`torch.cat(list(feats.values()))`), and the
    #: trace holds the order it saw (found by a review: another order ran the old graph,
    #: 1.62 off eager's output, silently). Other keywords are compared by name alone.
    keyword_order: tuple[str, ...] = ()
    #: For a graph whose forward has `torch.autocast` blocks of its own: (whether the call
    #: runs inside a block of the caller's, entered enabled or not, whose cast cache the
    #: forward's blocks then share with the call's casts and its other calls; the names of
    #: the tensor arguments autocast casts per reader, not being leaves: `cast_per_reader`)
    #: (`frontends/autocast_blocks.py`). A graph without blocks holds None: any call fits
    #: it (`admits`), so a leaf example and a non-leaf batch outside autocast share a plan.
    autocast_blocks: tuple | None = None

    def admits(self, call: "Signature") -> bool:
        """Whether a call of signature `call` runs this graph: the same, but for the
        autocast-block context where this graph has no block of its own."""
        return self == call or (self.autocast_blocks is None and call.autocast_blocks is not None
                                and self == call.without_blocks)

    @functools.cached_property
    def without_blocks(self) -> "Signature":
        """This signature with no autocast-block context (made once: signatures are memoised)."""
        return dataclasses.replace(self, autocast_blocks=None)

    def difference(self, lowered: "Signature") -> str:
        """What this call has that `lowered` (a signature a graph was made for) has not:
        one phrase naming the first differing argument, or the autocast state or device."""
        mine, theirs = dict(self.arguments), dict(lowered.arguments)
        show_mine, show_theirs = self._shown(), lowered._shown()
        for name in theirs:
            if name not in mine:
                return f"argument {name} ({show_theirs[name]}) is missing"
        for name in mine:
            if name not in theirs:
                return f"argument {name} ({show_mine[name]}) was not given at lowering"
        for name in mine:
            if mine[name] != theirs[name]:
                if show_mine[name] == show_theirs[name]:  # shown alike, of other values
                    return f"argument {name} is {show_mine[name]} of another value than at lowering"
                return f"argument {name} is {show_mine[name]}, lowered for {show_theirs[name]}"
        if self.autocast != lowered.autocast:
            return (f"autocast is {_autocast_text(self.autocast)}, lowered under "
                    f"{_autocast_text(lowered.autocast)}")
        if self.device != lowered.device:
            return f"inputs are on {self.device}, lowered on {lowered.device}"
        if self.default_dtype != lowered.default_dtype:
            return (f"the default dtype is {self.default_dtype}, lowered under "
                    f"{lowered.default_dtype}")
        if self.autocast_cache != lowered.autocast_cache:
            return (f"autocast's cast cache is {'on' if self.autocast_cache else 'off'}, lowered "
                    f"with it {'on' if lowered.autocast_cache else 'off'}")
        if None not in (self.autocast_blocks, lowered.autocast_blocks) and \
                self.autocast_blocks != lowered.autocast_blocks:
            (nested, per_reader), (was_nested, was_per_reader) = self.autocast_blocks, lowered.autocast_blocks
            if nested != was_nested:
                return (f"the call is {'' if nested else 'not '}inside a `torch.autocast` block "
                        f"(enabled or not), lowered {'inside' if was_nested else 'outside'} one: the "
                        f"autocast blocks of the forward share that block's cast cache")
            return (f"the tensors needing a gradient that are not leaves (cast per reader by the "
                    f"forward's autocast blocks) are {', '.join(per_reader) or 'none'}, lowered "
                    f"where they were {', '.join(was_per_reader) or 'none'}")
        if self.sdpa != lowered.sdpa:
            return (f"scaled dot product attention may use {self.sdpa or 'no kernel'}, lowered "
                    f"where it might use {lowered.sdpa or 'none'} (`torch.nn.attention.sdpa_kernel`, "
                    f"`torch.backends.mha.set_fastpath_enabled`)")
        if self.deterministic != lowered.deterministic:
            return (f"torch.use_deterministic_algorithms is {'on' if self.deterministic else 'off'}, "
                    f"lowered with it {'on' if lowered.deterministic else 'off'}")
        if self.cpu_kernels != lowered.cpu_kernels:
            return (f"CPU kernels run with {self.cpu_kernels or 'no recorded setting'}, lowered "
                    f"and profiled with {lowered.cpu_kernels or 'no recorded setting'} (the memory "
                    f"of oneDNN's kernels depends on both)")
        if self.aliases != lowered.aliases:
            return (f"{_aliases_text(self.aliases) or 'no argument is another one'}, lowered "
                    f"where {_aliases_text(lowered.aliases) or 'none was another'}")
        if self.keyword_order != lowered.keyword_order:
            return (f"the keywords the forward takes as **kwargs come in the order "
                    f"{', '.join(self.keyword_order)}, lowered in the order {', '.join(lowered.keyword_order)}")
        if self.containers != lowered.containers:
            return ("the arguments are held in other containers than at lowering (a list for "
                    "a tuple, or a dict's keys in another order)")
        return "nothing differs"

    def same_but_where(self, other: "Signature") -> bool:
        """The same but for where the call runs: the device, and on CPU the thread count
        and NNPACK on or off (a convolution's kernel is picked when it runs, as eager's is).
        They change the memory the kernels take, not what the trace holds, so a graph
        without a planner (an IR file, a saved module's) runs there with the plan it has;
        one with a planner plans again. oneDNN on or off is compared: it changes an LSTM's
        bits."""
        if self.device != other.device:
            return dataclasses.replace(self, device=other.device, cpu_kernels=other.cpu_kernels).admits(other)
        return dataclasses.replace(self, cpu_kernels=_onednn(self.cpu_kernels)).admits(
            dataclasses.replace(other, cpu_kernels=_onednn(other.cpu_kernels)))

    def _shown(self) -> dict[str, str]:
        """How messages name each argument: `shown` where the call gave it, else the
        description, shortened (`shortened`: a signature read from a graph has no values)."""
        return {name: shortened(description) for name, description in self.arguments} | dict(self.shown)


def _onednn(cpu_kernels: str) -> str:
    """The oneDNN part of a `cpu_kernels_state()` description ("oneDNN on")."""
    return cpu_kernels.split(",")[0]


#: The longest description of a value a message quotes whole.
SHOWN_CHARACTERS = 80


def shortened(description: str) -> str:
    """`description` if it is short, else its first characters and its length: a value's
    repr can run to thousands of characters (a long string, a container of arrays)."""
    if len(description) <= SHOWN_CHARACTERS and "\n" not in description:
        return description
    head = description.splitlines()[0][:SHOWN_CHARACTERS - 20].rstrip()
    return f"{head}... ({len(description):,} characters)"


def shown_input(leaf, description: str) -> str:
    """How a message names an input leaf whose signature description is `description`
    (`describe_input`): the description itself where it is short, a flag such as
    use_cache=False, whose value is what differs. A long one is the repr of a value
    (a non-tensor leaf): a numpy array's, which holds every element and made a notice of
    a page, is named by its type, shape and dtype ('numpy.ndarray [10, 10] float64'),
    anything else `shortened`."""
    if len(description) <= SHOWN_CHARACTERS and "\n" not in description:
        return description
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if not isinstance(leaf, torch.Tensor) and isinstance(shape, tuple) and dtype is not None:
        kind = type(leaf)
        return f"{kind.__module__}.{kind.__qualname__} {list(shape)} {dtype}"
    return shortened(description)


def free_keywords(forward, kwargs: dict) -> tuple[str, ...]:
    """The names of `kwargs` that `forward` takes through its `**kwargs`, in the order
    passed (`Signature.keyword_order`); () where it has no `**kwargs`."""
    named, variable = _parameters(getattr(forward, "__func__", forward))
    return tuple(name for name in kwargs if name not in named) if variable else ()


@functools.lru_cache(maxsize=256)
def _parameters(function) -> tuple[frozenset, bool]:
    """(the names of `function`'s parameters, whether it takes `**kwargs`)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return frozenset(), False
    return (frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD),
            any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters))


def _canonical(args, kwargs) -> tuple:
    """(args, kwargs) with the keywords in name order: the order they were passed in is
    not the call's (`Signature.containers`)."""
    return tuple(args), dict(sorted(kwargs.items()))


def containers(args: tuple, kwargs: dict) -> str:
    """The containers holding a call's arguments, keywords in name order (`Signature`)."""
    return str(pytree.tree_structure(_canonical(args, kwargs)))


def _autocast_text(state: tuple[tuple[str, str], ...]) -> str:
    """'cpu bfloat16', or 'cpu off with dtype float16' for a context entered disabled
    (`autocast_state`), or 'off'."""
    return ", ".join(f"{device} off with dtype {dtype.split()[0]}" if dtype.endswith(" disabled")
                     else f"{device} {dtype}" for device, dtype in state) or "off"


def autocast_from_json(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(json.loads(text).items())) if text else ()


def _aliases_text(aliases: tuple[tuple[str, ...], ...]) -> str:
    return "; ".join(f"arguments {' and '.join(group)} are one tensor" for group in aliases)


def call_signature(args: tuple, kwargs: dict, autocast=None) -> Signature:
    """The signature of a call (under the autocast state active now, unless given)."""
    with_paths, spec = pytree.tree_flatten_with_path(_canonical(args, kwargs))
    described = [(argument_name(path), describe_input(leaf), leaf) for path, leaf in with_paths]
    arguments = tuple(sorted((name, description) for name, description, _ in described))
    shown = tuple(sorted((name, text) for name, description, leaf in described
                         if (text := shown_input(leaf, description)) != description))
    tensors = [leaf for _, leaf in with_paths if isinstance(leaf, torch.Tensor)]
    device = tensors[0].device.type if tensors else "cpu"
    return Signature(arguments, autocast_state() if autocast is None else autocast, device,
                     str(spec), str(torch.get_default_dtype()), autocast_cache(), shown,
                     input_aliases(with_paths), sdpa_state(), torch.are_deterministic_algorithms_enabled(),
                     cpu_kernels_state() if device == "cpu" else "",
                     autocast_blocks=(autocast_nested(), tuple(sorted(
                         name for name, _, leaf in described
                         if isinstance(leaf, torch.Tensor) and cast_per_reader(leaf)))))


#: Leaf types a call's arguments may have to be taken without flattening (`flat_leaf`).
_PLAIN_LEAVES = (bool, int, float, str, type(None))


def flat_leaf(value) -> bool:
    """Whether pytree takes `value` as one leaf, for the common types: a tensor (not a
    registered container) or a plain value. Anything else takes the general path."""
    if isinstance(value, torch.Tensor):
        return type(value) not in pytree.SUPPORTED_NODES
    return type(value) in _PLAIN_LEAVES


def _flat_key(args, kwargs) -> tuple | None:
    """What `call_signature(args, kwargs)` is a function of, where every argument is a
    `flat_leaf` passed as is (a batch's `input_ids` and `labels`, `use_cache=False`),
    else None. Per tensor: its class, shape, dtype, strides (which decide its layout's
    name), whether it requires a gradient, is a leaf or a view (autocast's cache,
    `cast_per_reader`), its device type and the first argument that is the same
    tensor (`input_aliases`), the Python attributes it carries (`carried_names`); per
    plain value: its class and repr (as described); and the state every call's signature
    reads: autocast, its cache and nesting, the default dtype, the attention kernels,
    deterministic algorithms."""
    if type(args) is not tuple or type(kwargs) is not dict:
        return None
    names = tuple(sorted(kwargs))
    key: list = [len(args), names, autocast_state(), torch.get_default_dtype(), autocast_cache(), autocast_nested(),
                 sdpa_flags(), torch.are_deterministic_algorithms_enabled(), cpu_kernels_flags()]
    first: dict[int, int] = {}
    for index, leaf in enumerate((*args, *(kwargs[name] for name in names))):
        if not flat_leaf(leaf):
            return None
        if isinstance(leaf, torch.Tensor):
            if leaf.layout is not torch.strided:
                return None
            key.append((type(leaf), leaf.shape, leaf.dtype, leaf.stride(), leaf.requires_grad,
                        leaf.is_leaf, leaf._is_view(), leaf.device.type,
                        first.setdefault(id(leaf), index), carried_names(leaf) if vars(leaf) else ()))
        else:
            key.append((type(leaf), repr(leaf)))
    return tuple(key)


class SignatureMemo:
    """`call_signature`, remembered for calls whose arguments are tensors and plain values
    passed flat (`_flat_key`, what such a signature is made of); other calls are
    described afresh. Why: flattening with paths, naming and describing each argument
    cost 0.14 ms of the quick CNN's 13 ms CPU step (caches are cold between steps), a
    sixth of remat-ir's store-everything overhead over eager, for the same answer at
    every step of a training loop."""

    def __init__(self, size: int = 64):
        self._known: dict[tuple, Signature] = {}
        self._size = size

    def __call__(self, args: tuple, kwargs: dict) -> Signature:
        key = _flat_key(args, kwargs)
        if key is None:
            return call_signature(args, kwargs)
        found = self._known.get(key)
        if found is None:
            if len(self._known) >= self._size:
                self._known.clear()
            found = self._known[key] = call_signature(args, kwargs)
        return found


#: The signature of a call, remembered process-wide (a pure function of `_flat_key`).
memoised_signature = SignatureMemo()
