"""Long-lived small views copied into their own storage, so the large one they alias dies.

Why: a view holds its whole storage. The backward of `cat` hands each input its
gradient as a slice of the concatenated gradient (autograd's `CatBackward` returns
narrow views, and the joint graph has the same `slice` ops). In a U-Net the slice
that goes to the skip connection is read only when the backward reaches the
encoder, at the other end of the step, while the rest of the storage was read at
once: the diffusers U-Net of the offload benchmark held 12 such storages from
37-73% of the step to 79-98%, two to three times the bytes it needed (slices of 4
MiB holding 8-12 MiB; 10.9% of store-everything's peak late in the backward). No
schedule can free part of a storage, and an offload of the slice moves all of it.

The rewrite, on the joint FX graph before lowering (`compact_views`): where a view
is read at least `MIN_SPAN` of the graph's ops after every other alias of its
storage was last read (the base, its other views), and covers at most half of the
storage, a `clone` of the view is inserted just after that last other read, and
the view's later readers read the clone instead. The storage then dies at the
clone, and the clone (contiguous, the view's bytes only) lives on. A clone copies
values exactly, but not a strided view's strides, and a reader that reduces may sum
in another order on another layout: only where the view is dense (the clone keeps its
strides) or every later reader computes the same bits on any layout
(`_reads_any_layout`: exact arithmetic, and convolution backwards, which make their
inputs contiguous themselves) is the copy made. Soak, 2026-11-28: a slice of a
`cat`'s gradient read by a batch-norm backward, copied, gave its weight's gradient
4e-8 off eager's, on store-everything. Pointwise is not enough either: ATen runs an
op's vectorized kernel over contiguous runs and its scalar one elsewhere (a stride
other than 1, the tail of a run), and for a transcendental op (GELU's erf, exp, tanh)
the two round differently. A probe, 2026-11-29: the real part of an FFT (a view with
stride 2) read by a GELU and its backward, copied, gave gradients 2.4e-7 off eager's
on store-everything. So the pointwise readers taken are those whose every element is
one correctly rounded operation (`EXACT_POINTWISE`: the same bits on either kernel).

Left alone: views returned by the graph (a returned tensor keeps eager's layout),
storages written in place, and graph inputs (parameters and buffers live anyway).
The order used is the joint graph's, which is the store-everything schedule's;
a plan that moves reads changes spans, not the copies.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from .fx_nodes import add_call, recompiled, views_first_argument

_aten = torch.ops.aten

#: Bumped when the rewrite changes the graphs it makes: benchmark caches of lowered graphs
#: key on it (benchmarks/solvers.py).
REVISION = 3

#: Readers that are not pointwise but compute the same bits whatever their inputs'
#: strides: convolution backwards make their gradient contiguous first.
LAYOUT_FREE_READERS = frozenset({_aten.convolution_backward.default})

#: Pointwise ops each of whose elements is one correctly rounded IEEE operation (or a
#: selection), so that ATen's vectorized and scalar kernels give the same bits: on any
#: layout, the same result. `add` and `sub` only without an `alpha` (with one, a kernel
#: may fuse the multiply and the add). The U-Net's copies are read by `add`.
EXACT_POINTWISE = frozenset({
    _aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.neg.default, _aten.relu.default,
    _aten.clone.default})

#: How far after the storage's other last read a view must be read, as a share of the
#: graph's ops, for a copy to be worth it.
MIN_SPAN = 0.05


def _storage_roots(graph: torch.fx.Graph) -> dict[torch.fx.Node, torch.fx.Node]:
    """Per node that returns a tensor view (or an item of a list of views), the node whose
    storage it aliases; per other node, itself."""
    root = {}
    for node in graph.nodes:
        if views_first_argument(node):
            root[node] = root.get(node.args[0], node.args[0])
        elif node.target is operator.getitem and node.args[0] in root and root[node.args[0]] is not node.args[0]:
            root[node] = root[node.args[0]]  # an item of split's list: a view of split's input
        else:
            root[node] = node
    return root


def _kept_by_clone(tensor: torch.Tensor) -> bool:
    """Whether `clone` gives `tensor`'s own strides: a contiguous or channels-last dense
    layout (others, which a copy may keep too, are counted out)."""
    return tensor.is_contiguous() or (tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last))


def _reads_any_layout(node: torch.fx.Node) -> bool:
    """Whether `node` computes the same bits whatever the strides of the tensors it reads:
    one of `EXACT_POINTWISE` (`add` and `sub` without an alpha) or of
    `LAYOUT_FREE_READERS`."""
    if node.op != "call_function":
        return False
    if node.target in EXACT_POINTWISE:   # `alpha` is keyword-only in add's and sub's schema
        return node.kwargs.get("alpha", 1) == 1
    return node.target in LAYOUT_FREE_READERS


def _bytes(node: torch.fx.Node) -> tuple[int, int] | None:
    """(bytes the tensor spans, bytes of its storage), None when it is not a tensor."""
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor):
        return None
    return fake.numel() * fake.element_size(), fake.untyped_storage().nbytes()


def compact_views(module: torch.fx.GraphModule) -> int:
    """Insert the copies of the module docstring into `module`'s graph in place; returns
    how many were inserted."""
    graph = module.graph
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    root = _storage_roots(graph)
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        members.setdefault(root[node], []).append(node)
    span_needed = max(1, int(MIN_SPAN * sum(1 for n in nodes if n.op == "call_function")))
    inserted = 0
    for base, aliases in members.items():
        if base.op != "call_function" or len(aliases) < 2:
            continue
        if any(u.op == "output" or (u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload)
                                    and u.target._schema.is_mutable)
               for a in aliases for u in a.users):
            continue  # returned or written in place: the storage's life is not the reads'
        alias_set = set(aliases)
        last = {a: max((position[u] for u in a.users if u not in alias_set), default=position[a])
                for a in aliases}
        # Creating a view reads its source: count it as a read of the source.
        for a in aliases:
            if a is not base and a.args[0] in last:
                last[a.args[0]] = max(last[a.args[0]], position[a])
        latest = max(aliases, key=lambda a: last[a])
        others = max(last[a] for a in aliases if a is not latest)
        sizes = _bytes(latest)
        if (latest is base or sizes is None or sizes[0] * 2 > sizes[1]
                or last[latest] - others < span_needed or any(a in latest.users for a in aliases)):
            continue
        after = nodes[others]
        late_users = [u for u in latest.users if position[u] > others]
        fake = latest.meta["val"]
        if not (_kept_by_clone(fake) or all(_reads_any_layout(u) for u in late_users)):
            continue  # the copy's layout would change what a later reader sums, and in which order
        meta = {k: v for k, v in latest.meta.items() if k != "partitioner_tag"}
        if "partitioner_tag" in after.meta:  # the copy runs where `after` runs
            meta["partitioner_tag"] = after.meta["partitioner_tag"]
        with fake.fake_mode, graph.inserting_after(after):
            copy = add_call(graph, meta, _aten.clone.default, (latest,))
        for user in late_users:
            user.replace_input_with(latest, copy)
        inserted += 1
    return recompiled(module, inserted)
