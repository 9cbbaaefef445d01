"""A Hugging Face key/value cache among a training call's outputs: built as eager builds it,
left out of what the step returns.

Causal LMs and T5 default to `use_cache=True`, and their training call returns the cache
it built (`past_key_values`), an object torch.export cannot take apart: every user of
those models met a refusal first. `remat` then set `use_cache=False` on the config, as
transformers' gradient checkpointing does, but building the cache changes the numbers
(hunt70: GPT-2 with attention dropout attends to the cache's contiguous copies of the
keys and values, and SDPA's backward sums them in another order: `c_attn`'s gradients
7e-12 off eager's, drifting over steps). So the forward is traced as the user calls it,
the cache built as in eager, and only the returned object is left out: while
torch.export runs, transformers' cache classes flatten to nothing (`dropping_caches`),
and the program's output structure then leaves them out (`without_caches`), as a call
with `use_cache=False` returns no cache (in a tuple or a list, None in its place, so that
what follows keeps its position). A training step reads no cache, and keeping
every layer's keys and values alive as an output would hold what the plan recomputes.

Not where the call is given a cache (`past_key_values=` among the inputs): its tensors
would be taken for constants of the graph, so it is refused as before. The
registration is process-wide while torch.export runs: another thread flattening a cache
then meets none (hunt75; lowering itself is not thread-safe)."""

from __future__ import annotations

import collections
import contextlib
import sys

import torch
import torch.utils._pytree as pytree

from .errors import LoweringError


def cache_classes() -> list[type]:
    """transformers' cache classes (`Cache` and its subclasses, the models' own included).
    Empty where transformers is not imported: no model of it is traced."""
    module = sys.modules.get("transformers.cache_utils")
    if module is None:
        return []
    found, stack = [], [module.Cache]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.append(cls)
            stack.extend(cls.__subclasses__())
    return found


def _given_a_cache(args, kwargs, classes: list[type]) -> bool:
    """Whether a cache is among the call's arguments."""
    return any(isinstance(leaf, tuple(classes)) for leaf in pytree.tree_leaves((args, kwargs)))


@contextlib.contextmanager
def dropping_caches(args, kwargs):
    """While torch.export traces: transformers' cache objects among the outputs flatten to
    no tensors (their keys and values stay intermediates of the graph). Yields the classes
    so registered, for `without_caches`."""
    classes = cache_classes()
    if not classes or _given_a_cache(args, kwargs, classes):
        yield []
        return
    registered, theirs = [], {}
    try:
        for cls in classes:
            if cls in pytree.SUPPORTED_NODES:
                # Registered already (transformers' `register_dynamic_cache_export_support`):
                # its keys and values would be outputs held through the step, rebuilt into
                # a cache from remat-ir's own placeholders (hunt75: a crash inside
                # transformers). Put back after.
                theirs[cls] = _registration(cls)
                pytree._deregister_pytree_node(cls)
            pytree.register_pytree_node(
                cls, lambda cache: ([], None), lambda values, context: None,
                serialized_type_name=f"remat_ir.dropped_cache.{cls.__module__}.{cls.__qualname__}",
                flatten_with_keys_fn=lambda cache: ([], None))
            registered.append(cls)
        yield registered
    finally:
        for cls in registered:
            pytree._deregister_pytree_node(cls)
        for cls, entries in theirs.items():
            _register_again(cls, entries)


def _registration(cls: type) -> tuple:
    """What torch's pytree holds for `cls` (its node, serialized names, constant mark)."""
    serialized = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
    return (pytree.SUPPORTED_NODES[cls], serialized, cls in pytree.CONSTANT_NODES)


def _register_again(cls: type, entries: tuple) -> None:
    """Put back a registration `_registration` took."""
    node, serialized, constant = entries
    pytree.SUPPORTED_NODES[cls] = node
    if serialized is not None:
        pytree.SUPPORTED_SERIALIZED_TYPES[cls] = serialized
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[serialized.serialized_type_name] = cls
    if constant:
        pytree.CONSTANT_NODES.add(cls)


def _keyed(node: pytree.TreeSpec) -> bool:
    """Whether `node`'s context is its children's keys: a dict's, or a transformers model
    output's (not a dataclass's, whose context is its field names and its None fields',
    nor a defaultdict's: hunt75, a two-field dataclass lost a field)."""
    output = getattr(sys.modules.get("transformers.utils"), "ModelOutput", None)
    return (isinstance(node.context, list) and len(node.context) == node.num_children
            and (node.type in (dict, collections.OrderedDict)
                 or (output is not None and isinstance(node.type, type) and issubclass(node.type, output))))


def without_caches(spec: pytree.TreeSpec, classes: list[type]) -> tuple[pytree.TreeSpec, list[str], list[int]]:
    """`spec` without the caches of `classes`: left out of a model output or a dict (as a
    call with `use_cache=False` returns them), a None leaf in their place in a tuple or a
    list, so that the items after keep eager's positions (hunt75: `out[3]` read the
    attentions where eager's was the last hidden state); the caches' places
    ("output['cache']", "output[2]"); and the flat positions of those None leaves, which
    the outputs must then hold (`fill_dropped_caches`). A cache elsewhere (the output
    itself, a named tuple's or a dataclass's field) raises LoweringError."""
    places: list[str] = []
    holes: list[int] = []
    none = pytree.tree_structure(None)   # a leaf: torch's pytree takes None for one

    def rebuilt(node: pytree.TreeSpec, path: str, start: int) -> pytree.TreeSpec:
        """`node` rebuilt, its first leaf at flat position `start`."""
        if node.num_children == 0:
            return node
        keyed = _keyed(node)
        positional = node.type in (tuple, list)
        keys = list(node.context) if keyed else list(range(node.num_children))
        if not (keyed or positional) and any(child.type in classes for child in node.children()):
            raise LoweringError(
                f"the call returns a key/value cache at {path} inside a "
                f"{node.type.__name__}, which remat-ir cannot leave out. A training step needs no "
                f"cache: call the model with use_cache=False")
        kept, children = [], []
        for key, child in zip(keys, node.children()):
            if child.type in classes:
                places.append(f"{path}[{key!r}]")
                if not positional:
                    continue
                holes.append(start)
                child = none
            else:
                child = rebuilt(child, f"{path}[{key!r}]", start)
            kept.append(key)
            children.append(child)
            start += child.num_leaves
        context = kept if keyed else node.context
        return pytree.TreeSpec(node.type, context, children)

    if classes and spec.type in classes:
        raise LoweringError("the call returns a key/value cache as its output: a training step needs "
                            "none, call the model with use_cache=False")
    spec = rebuilt(spec, "output", 0) if classes else spec
    return spec, places, holes


#: The attribute of an ExportedProgram naming the places of the caches `drop_caches` left
#: out, and the flat positions of the None leaves put in their place.
_DROPPED = "_remat_ir_dropped_caches"


def drop_caches(exported: torch.export.ExportedProgram, classes: list[type]) -> None:
    """Take the caches out of `exported`'s output structure (`without_caches`), before
    torch.export's registration of the classes is undone; their places are kept on it
    (`dropped_caches`), said once tracing is over (`tell_caches`). Its module must then
    return None in the places of those in tuples and lists (`fill_dropped_caches`)."""
    signature = exported.module_call_graph[0].signature
    signature.out_spec, places, holes = without_caches(signature.out_spec, classes)
    setattr(exported, _DROPPED, (places, holes))


def dropped_caches(exported: torch.export.ExportedProgram) -> list[str]:
    """The places of the caches `drop_caches` left out of `exported`'s outputs."""
    return getattr(exported, _DROPPED, ([], []))[0]


def fill_dropped_caches(exported: torch.export.ExportedProgram, module: torch.fx.GraphModule) -> None:
    """Make `module` (`exported.module()`) return None at the flat positions
    `drop_caches` gave the caches of tuples and lists, as its output structure says."""
    holes = getattr(exported, _DROPPED, ([], []))[1]
    if not holes:
        return
    node = next(n for n in module.graph.nodes if n.op == "output")
    flat = list(node.args[0])
    for position in holes:   # ascending: each counts the ones before it
        flat.insert(position, None)
    node.args = (type(node.args[0])(flat),)
    module.recompile()


#: The (model class, places) whose cache was said to be left out, in this process.
_TOLD: set = set()


def tell_caches(model: str, places: list[str]) -> None:
    """Say once per model class and places, on stderr as remat-ir's other one-line notices
    (a UserWarning was an error under `warnings.simplefilter("error")`, hunt75), that the
    step leaves the cache out of what it returns."""
    if (model, tuple(places)) in _TOLD:
        return
    _TOLD.add((model, tuple(places)))
    print(f"remat-ir: {model}'s call returns a key/value cache ({', '.join(places)}), as a call with "
          f"use_cache=True (causal LMs' and T5's default) does: the step builds it as eager does, so "
          f"its gradients are eager's, and leaves it out of what it returns, as torch.export cannot "
          f"return it and a training step reads none. Pass use_cache=False for none to be built",
          file=sys.stderr, flush=True)
