"""Autocast's cast cache, replayed in the joint graph: a parameter cast once per forward.

Why: under `torch.autocast`, eager casts a float32 leaf that needs a gradient (a
parameter) to the autocast dtype once per autocast region and reuses that cast for
every op that wants it (autocast's cache). A parameter used by several such ops (a
weight shared between layers, or read twice by one layer) then has one cast whose
gradient is the sum of its readers' gradients *in the autocast dtype*, cast to
float32 once. AOTAutograd traces with the cache off (`make_fx`), so the joint graph
casts the parameter once per reader and sums the readers' gradients in float32:
other bits than eager's (a weight read by two matrix products under bfloat16: its
gradient up to 0.06 off).

The rewrite, on the joint FX graph, for each primal whose gradient is exactly a sum
of the cast-backs of its autocast casts (nothing else reads it): the forward keeps
its first cast and every reader reads that one; the gradient becomes the same sum
(the same tree, so the same order autograd's accumulation gave) of the readers'
gradients in the autocast dtype, cast to float32 once, as eager computes it. Casts a
program writes itself (`w.to(torch.bfloat16)`), and those of a custom op's autocast
rule (`register_autocast`), are not cached by eager and stay as they are. A primal
read both through autocast casts and directly shares its casts too beside the direct
reads' parts, in the order eager's autograd adds them
(`_share_beside_direct_parts`); where that order cannot be told (several direct parts
summed in a tree that is not a chain) it is left as traced, with a warning.
So is a primal cast in several `torch.autocast` blocks inside the forward: eager's
cache ends with each block, so it casts once per block and sums those in float32 (two
blocks sharing one cast trained 2e-3 off eager's). An input that is not a leaf (`uncached`:
hidden states from a layer outside the module) is not cached by eager: it keeps a cast
per reader, as traced. Nor is a cast made under `torch.no_grad()` (autocast's cache takes
casts made with gradients only): it is left as traced and not counted among the primal's
casts (`_without_gradient`), so the casts with gradients are shared as eager's are.

Eager's cache also outlives the call: a module called twice in one block (two views of
a batch, multi-crop training) reads one cast of each parameter in both calls and sums
the two calls' gradients in the autocast dtype before the one cast back. So the cast
back of each primal with one autocast cast (shared here or traced so) is marked
(`CAST_BACK`, the IR's `Node.autocast_cast_back`): a runtime with autograd hands its
low-precision input to one node per parameter and block that casts back once, as
eager's cached cast does (`runtimes/autocast_anchors.py`).
"""

from __future__ import annotations

import warnings

import torch
import torch.fx

from remat_ir.torchlib.types import autocast_enabled

from .errors import LoweringError
from .fx_nodes import add_call, recompiled, replace

_aten = torch.ops.aten
_LOW = (torch.bfloat16, torch.float16)
#: Meta key of a cast back (the IR's `Node.autocast_cast_back`): the node casts the
#: gradient of autocast's cached cast of a primal back to the primal's dtype.
CAST_BACK = "remat_ir_autocast_cast_back"
#: The namespaces of the ops whose casts autocast makes through its cache.
_CACHING_NAMESPACES = frozenset({"aten", "prims"})
#: Origins (the exported graph's op a joint node comes from) of casts a program writes.
_EXPLICIT = ("aten.to.", "aten._to_copy", "aten.type_as", "aten.type.")


def _autocast_cast(node: torch.fx.Node, primal: torch.fx.Node) -> bool:
    """Whether `node` is a forward cast of `primal` that autocast made (not the program)."""
    if node.target is not _aten._to_copy.default or node.args[0] is not primal:
        return False
    if set(node.kwargs) != {"dtype"} or node.kwargs["dtype"] not in _LOW:
        return False
    if node.meta.get("partitioner_tag") == "is_backward":
        return False
    origin = (node.meta.get("from_node") or [None])[-1]
    target = str(getattr(origin, "target", ""))
    parts = target.split(".")   # an op's "namespace.name.overload"
    if len(parts) == 3 and all(part.isidentifier() for part in parts) and parts[0] not in _CACHING_NAMESPACES:
        # Cast by a custom op's autocast rule (`torch.library.register_autocast`), whose
        # kernel casts with a plain `.to()` that autocast's cache never sees: a weight two
        # such calls read got a gradient 3.7e-4 off eager's, summed in bfloat16 (hunt63).
        return False
    readers = [user for user in node.users if user.meta.get("partitioner_tag") != "is_backward"]
    if readers and all(_custom_op(reader) for reader in readers):
        # The same, under a `torch.autocast` block inside the forward: the origin is the
        # block (`wrap_with_autocast`), and only the readers tell (hunt65: 2.4e-4 off).
        return False
    return bool(target) and not target.startswith(_EXPLICIT)


def _custom_op(node: torch.fx.Node) -> bool:
    """Whether `node` calls an op outside the namespaces whose casts autocast caches."""
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace not in _CACHING_NAMESPACES


def _region(cast: torch.fx.Node):
    """The `torch.autocast` block inside the forward a cast was made in (the exported
    graph's `wrap_with_autocast` node), or None: the autocast the model was called under."""
    origin = (cast.meta.get("from_node") or [None])[-1]
    if "wrap_with_autocast" not in str(getattr(origin, "target", "")):
        return None
    return origin.name


def _sum_leaves(node: torch.fx.Node, leaves: list) -> bool:
    """Collect the leaves of the add tree rooted at `node` (False if it is not one)."""
    if node.target is _aten.add.Tensor and len(node.args) == 2 and not node.kwargs:
        return all(_sum_leaves(a, leaves) if isinstance(a, torch.fx.Node) else False for a in node.args)
    leaves.append(node)
    return True


def _rebuild(node: torch.fx.Node, graph: torch.fx.Graph, low: dict) -> torch.fx.Node:
    """The add tree at `node` over the low-precision gradients (`low`: leaf -> gradient)."""
    if node in low:
        return low[node]
    a, b = (_rebuild(x, graph, low) for x in node.args)
    return add_call(graph, node.meta, _aten.add.Tensor, (a, b))


def share_autocast_casts(module: torch.fx.GraphModule, uncached: frozenset[int] = frozenset(),
                         mixed: list[str] | None = None, blocks: dict[str, bool | None] | None = None,
                         nested: bool = False) -> int:
    """Rewrite `module`'s joint graph in place and mark the cast backs (module docstring);
    returns how many primals now have one autocast cast instead of several. `uncached`:
    the flat indices of user inputs that eager casts per reader (not leaves). `mixed`
    gets the graph input names of primals cast by the call's autocast and also read
    otherwise: their cast back stays in the graph, so a second call in one block sums
    otherwise than eager (the runtime warns then). `blocks`: whether eager caches casts
    in each `torch.autocast` block of the forward (`autocast_blocks.block_caches`);
    `nested`: the call runs inside a block of the caller's, whose cache every block of
    the forward shares, with the call's own casts and with its other calls."""
    graph = module.graph
    output = next(n for n in graph.nodes if n.op == "output")
    descs = output.meta.get("desc") or []
    results = output.args[0]
    primals = [n for n in graph.nodes if n.op == "placeholder"]
    # Taken once: the rewrites erase and insert nodes, which leaves the order of the
    # casts (nodes that were there before) as it was.
    order = {n: i for i, n in enumerate(graph.nodes)}
    rewritten = 0
    for position, desc in enumerate(descs):
        _refuse_cast_writes(desc, results[position] if position < len(results) else None)
        grad_of = getattr(desc, "grad_of", None)
        gradient = results[position] if position < len(results) else None
        if grad_of is None or not isinstance(gradient, torch.fx.Node):
            continue
        primal = _primal_of(primals, grad_of)
        if (primal is None or getattr(grad_of, "idx", None) in uncached
                or getattr(primal.meta.get("val"), "dtype", None) is not torch.float32):
            continue   # eager's cache keeps float32 leaves only
        casts = [u for u in primal.users if _autocast_cast(u, primal)]
        cached = {c: _cached(c, blocks or {}) for c in casts}
        if None in cached.values():
            if len(casts) > 1:
                warnings.warn(f"{_name(desc)} is cast by autocast in nested `torch.autocast` blocks "
                              "of the forward with different cache_enabled settings: its "
                              "gradient is summed as traced, which may differ from eager's by the "
                              "autocast dtype's rounding: 1e-3 relative and more in bfloat16", stacklevel=2)
            continue
        # A cast eager does not cache (its block's cache_enabled=False) is another reader
        # of the primal, as a direct read is.
        casts = [c for c in casts if cached[c]]
        # Casts no gradient flows back through (made under `torch.no_grad()`: a target
        # computed with the same weights) are not cached by eager and sum nothing: counted,
        # they kept the others from sharing one cast, 1.8e-3 relative off eager's, with a
        # warning of a use that was not there (found by a review).
        without = _without_gradient(casts, gradient)
        casts = [c for c in casts if c not in without]
        if not casts or len({c.kwargs["dtype"] for c in casts}) != 1:
            continue
        # Which cache a cast is kept in: the call's and its blocks' one where the call runs
        # inside a block of the caller's (None), else each top-level block's own.
        regions = [None if nested else _region(c) for c in casts]
        if len(set(regions)) > 1:
            # Eager's cache lives for one region: a cast per region, summed in float32 as
            # traced; readers sharing a region too would share its cast, not done here.
            if len(set(regions)) < len(regions):
                warnings.warn(f"{_name(desc)} is cast by autocast in several `torch.autocast` "
                              "blocks of the forward, more than once in one: its gradient is "
                              "summed in float32 where eager sums part of it in the autocast "
                              "dtype (it may differ from eager's by the autocast dtype's rounding: 1e-3 relative and more in bfloat16)", stacklevel=2)
            continue
        leaves: list = []
        seqs = {c.meta.get("seq_nr") for c in casts}
        matched = (_sum_leaves(gradient, leaves) and len(leaves) == len(casts)
                   and all(leaf.target is _aten._to_copy.default and leaf.kwargs.get("dtype") is torch.float32
                           and leaf.meta.get("seq_nr") in seqs for leaf in leaves)
                   and len({leaf.meta.get("seq_nr") for leaf in leaves}) == len(leaves))
        if not matched or len(primal.users) != len(casts) + len(without):
            if mixed is not None and regions[0] is None:
                mixed.append(getattr(grad_of, "target", None) or f"input{grad_of.idx}")
            if len(casts) == 1:
                continue
            if _share_beside_direct_parts(graph, gradient, casts, seqs, order):
                rewritten += 1
                continue
            warnings.warn(f"{_name(desc)} is cast by autocast for several ops and also used "
                          "otherwise: its gradient is summed in float32 where eager sums part of "
                          "it in the autocast dtype (it may differ from eager's by the autocast dtype's rounding: 1e-3 relative and more in bfloat16)", stacklevel=2)
            continue
        if len(casts) == 1:
            # Cast once already; its cast back is marked where the cache outlives the call
            # (a cast inside a block of the forward ends with that block).
            gradient.meta[CAST_BACK] = regions[0] is None
            continue
        first = min(casts, key=order.__getitem__)
        for cast in casts:
            if cast is not first:
                replace(cast, first)
        fake = gradient.meta["val"]
        with fake.fake_mode, graph.inserting_before(gradient):
            low = {leaf: leaf.args[0] for leaf in leaves}
            total = _rebuild(gradient, graph, low)
            cast_back = add_call(graph, gradient.meta, _aten._to_copy.default, (total,),
                                 dict(leaves[0].kwargs))
        cast_back.meta[CAST_BACK] = regions[0] is None
        gradient.replace_all_uses_with(cast_back)
        _erase_tree(graph, gradient)
        rewritten += 1
    return recompiled(module, rewritten)


def _cached(cast: torch.fx.Node, blocks: dict[str, bool | None]) -> bool | None:
    """Whether eager keeps `cast` in autocast's cache: the setting of its `torch.autocast`
    block of the forward (None: nested blocks of other settings), or the call's."""
    region = _region(cast)
    return torch.is_autocast_cache_enabled() if region is None else blocks.get(region, True)


def _without_gradient(casts: list, gradient: torch.fx.Node) -> list:
    """The casts among `casts` (of one primal) whose gradient no part of the primal's
    `gradient` is: none of its summed parts is a cast back of theirs (the same `seq_nr`,
    as `share_autocast_casts` pairs them). A cast made under `torch.no_grad()` has none:
    eager neither caches it (autocast's cache takes casts made with gradients only) nor
    sums a gradient of it. Where a part cannot be paired (the gradient is not a sum of
    cast backs and direct parts), none is excluded: the casts stay as traced."""
    leaves: list = []
    if not _sum_leaves(gradient, leaves):
        return []
    backs = {leaf.meta.get("seq_nr") for leaf in leaves if leaf.target is _aten._to_copy.default
             and leaf.kwargs.get("dtype") is torch.float32}
    return [c for c in casts if c.meta.get("seq_nr") is not None and c.meta["seq_nr"] not in backs]


def _refuse_cast_writes(desc, written) -> None:
    """LoweringError for a parameter written in place in the forward (under no_grad: a
    clamp, nn.Embedding's max_norm) whose new value autocast casts: eager caches the cast of
    the parameter itself and sums its readers' gradients in the autocast dtype, which the
    rewrite above does for primals only; the graph summed otherwise (bits off eager's,
    found by a search over random networks under bfloat16)."""
    mutated = getattr(desc, "mutated_input", None)
    if type(mutated).__name__ != "ParamAOTInput" or not isinstance(written, torch.fx.Node):
        return
    if any(_autocast_cast(user, written) for user in written.users):
        raise LoweringError(
            f"the forward writes into parameter {mutated.target!r} in place and autocast casts "
            f"its new value: eager sums its readers' gradients in the autocast dtype through one "
            f"cached cast, which remat-ir does not reproduce for a written parameter. Write it "
            f"outside the forward (after optimizer.step(), under torch.no_grad), or call the "
            f"model outside torch.autocast")


def _share_beside_direct_parts(graph: torch.fx.Graph, gradient: torch.fx.Node, casts: list,
                               seqs: set, order: dict) -> bool:
    """Share the casts of a primal also read directly, where its gradient is the sum of
    its casts' cast backs and of direct parts (the direct reads'): eager sums the casts'
    parts in the autocast dtype, casts back once and adds that among the direct parts.
    An input read by two products under bfloat16 and by `torch.cdist` (float32) had its
    gradient 3e-4 off eager's. Where the parts reach the primal's gradient: eager's one
    cast back runs when the trace's cast back of the first cast ran (the same autograd
    node, by sequence number), so the sum is the trace's, its cast backs taken out and
    the shared one put where the first cast's was. The runtime hands the parts over in
    this order (`runtimes/gradient_parts.py`): where a part comes from outside the
    module too (a penalty on the weight), the order shows (5e-8 relative off eager's with
    the cast back first; 3e-3 with two direct parts summed as traced: found by a search
    over random autocast blocks). With two direct parts or more the trace's sum must be
    a chain (in arrival order); else nothing is rewritten. Returns whether it rewrote."""
    leaves: list = []
    if not _sum_leaves(gradient, leaves):
        return False
    backs = [leaf for leaf in leaves if leaf.target is _aten._to_copy.default
             and leaf.kwargs.get("dtype") is torch.float32 and leaf.meta.get("seq_nr") in seqs]
    direct = [leaf for leaf in leaves if leaf not in backs]
    if (len(backs) != len(casts) or not direct
            or len({leaf.meta.get("seq_nr") for leaf in backs}) != len(backs)
            or (len(direct) > 1 and not _chain(gradient))):
        return False
    first = min(casts, key=order.__getitem__)
    arriving = next((leaf for leaf in backs if leaf.meta.get("seq_nr") == first.meta.get("seq_nr")), backs[0])
    for cast in casts:
        if cast is not first:
            replace(cast, first)
    with gradient.meta["val"].fake_mode, graph.inserting_before(gradient):
        total = backs[0].args[0]
        for back in backs[1:]:   # in the order the trace accumulated them
            total = add_call(graph, gradient.meta, _aten.add.Tensor, (total, back.args[0]))
        cast_back = add_call(graph, gradient.meta, _aten._to_copy.default, (total,),
                             dict(backs[0].kwargs))
        parts = [cast_back if leaf is arriving else leaf for leaf in leaves
                 if leaf in direct or leaf is arriving]
        whole = parts[0]
        for part in parts[1:]:
            whole = add_call(graph, gradient.meta, _aten.add.Tensor, (whole, part))
    gradient.replace_all_uses_with(whole)
    _erase_tree(graph, gradient)
    return True


#: Ops traced whole whose eager kernel calls ops autocast casts (`_trilinear`, which
#: `nn.Bilinear` runs, and `affine_grid_generator`: their products go through `bmm`):
#: under autocast eager computes those in the autocast dtype, while the graph runs the
#: op as one kernel, outside autocast. Found by an op sweep of about 70 ops under autocast.
CAST_INSIDE = {_aten._trilinear.default: "torch.nn.Bilinear (aten._trilinear)",
               _aten.affine_grid_generator.default: "F.affine_grid (aten.affine_grid_generator)"}


def check_ops_cast_inside(module: torch.fx.GraphModule, model: str) -> None:
    """LoweringError naming a forward op of `CAST_INSIDE` that runs under the call's
    autocast (call under autocast only). Why: its output and gradients were 6e-3 relative
    off eager's, silently (an op sweep under bfloat16 found `nn.Bilinear`). Nothing under
    an autocast entered disabled (`autocast_state` names it: its dtype may be read), which
    casts nothing."""
    if not autocast_enabled():
        return
    for node in module.graph.nodes:
        name = CAST_INSIDE.get(node.target)
        if (name is None or node.meta.get("partitioner_tag") == "is_backward"
                or _region(node) is not None):
            continue
        path = list((node.meta.get("nn_module_stack") or {"": ("", None)}).values())[-1][0]
        where = f" at {path}" if path else ""
        raise LoweringError(
            f"{name}{where} in {model}: under autocast, eager computes the products inside this "
            "op in the autocast dtype, and the traced graph runs it as one op outside autocast, "
            "which gives other results. Run it with autocast off "
            "(`with torch.autocast(device_type, enabled=False):` around the call, inputs cast "
            "to float32), or outside the module given to remat")


def _primal_of(primals: list[torch.fx.Node], grad_of) -> torch.fx.Node | None:
    """The placeholder that `grad_of` (a gradient output's descriptor) names: the one with
    that input descriptor."""
    return next((node for node in primals if node.meta.get("desc") == grad_of), None)


def _chain(node: torch.fx.Node) -> bool:
    """Whether the add tree at `node` is a chain ((a + b) + c): each add's second term is
    no add of the tree, so its leaves are in the order the sums took them."""
    while node.target is _aten.add.Tensor and len(node.args) == 2 and not node.kwargs:
        second = node.args[1]
        if isinstance(second, torch.fx.Node) and second.target is _aten.add.Tensor:
            return False
        node = node.args[0]
    return True


def _erase_tree(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erase the old add tree and its cast-backs, from the root down, where now unused."""
    if node.users:
        return
    inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
    graph.erase_node(node)
    for a in inputs:
        if a.target in (_aten.add.Tensor, _aten._to_copy.default) and a.meta.get("partitioner_tag") == "is_backward":
            _erase_tree(graph, a)


def _name(desc) -> str:
    target = getattr(getattr(desc, "grad_of", None), "target", None)
    return f"parameter {target!r}" if target else "an input"
