"""Which autograd node of a step hands each gradient over, so that autograd reaches a
tensor from the same outputs as eager's backward does.

Eager's backward reaches a parameter only from the outputs computed from it: a head
whose output the loss leaves out is never reached, so its hooks never run (an optimizer
stepped in a post-accumulate hook, PyTorch's recipe, leaves it alone; DDP without
`find_unused_parameters` stops at the next step). A step's autograd nodes are made at
forward time, before the loss is known, so that reach must be built into them: a
tensor whose gradient every differentiable output feeds is handed over by the chain
that starts at the outputs' node (`torch._Step`); one that some outputs only feed has
an "anchor" node of its own that only those outputs reach, each of them returned by a
node of its own (`torch._Output`) that takes the anchor's token. The reach of a tensor
is the union of the outputs whose gradients its gradient reads
(`SegmentPlan.gradient_sources`); one whose gradient reads none (a derivative that is
zero everywhere, `floor`) stays on the chain, reached from every output.

Pure bookkeeping, no torch: the runtime makes the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The key of the chain node of group `i` is `("chain", i)`; of an anchor, `("anchor", j)`.
Key = tuple[str, int]


@dataclass(frozen=True)
class Anchor:
    """The node that hands over, in gradient group `group`, the entries `entries` of the
    tensors reached from the user outputs `outputs` only."""
    group: int
    outputs: frozenset[int]
    entries: tuple[int, ...]


@dataclass(frozen=True)
class Routes:
    #: Per gradient group, (node key, positions of the group's entries that node hands over).
    handers: list[list[tuple[Key, tuple[int, ...]]]]
    anchors: list[Anchor]
    #: The user outputs each returned by a node of their own (those some anchor's reach holds).
    own_nodes: tuple[int, ...]
    #: Per resident slot handed to an anchor, the outputs that reach it (chain: absent).
    #: What else stands between a slot and autograd (the node casting back autocast's
    #: cast of it) must be shared only by slots of one reach.
    reach: dict[int, frozenset[int]]


def routes(groups: list[list[int]], sources: list[list[frozenset[int]]], without_gradient: frozenset[int],
           differentiable: frozenset[int], chain_only: bool = False) -> Routes:
    """The routes of a plan's gradient entries (`groups`: per group, the resident slot of
    each entry, a slot handed over in parts appearing once per part; `sources`: per
    entry, the outputs whose gradients it reads). Entries of slots without a gradient are
    handed by no node (autograd must not reach them); `chain_only` puts every other entry
    on the chain (FSDP2's reduce-scatters follow the chain's order)."""
    reach: dict[int, frozenset[int]] = {}
    for slots, of in zip(groups, sources):
        for slot, outputs in zip(slots, of):
            reach[slot] = reach.get(slot, frozenset()) | (outputs & differentiable)
    handers: list[list[tuple[Key, tuple[int, ...]]]] = []
    anchors: list[Anchor] = []
    for i, slots in enumerate(groups):
        chain: list[int] = []
        by_reach: dict[frozenset[int], list[int]] = {}
        for k, slot in enumerate(slots):
            if slot in without_gradient:
                continue
            outputs = reach[slot]
            if chain_only or not outputs or outputs == differentiable:
                chain.append(k)
            else:
                by_reach.setdefault(outputs, []).append(k)
        here = [(("chain", i), tuple(chain))]
        for outputs, entries in sorted(by_reach.items(), key=lambda item: sorted(item[0])):
            here.append((("anchor", len(anchors)), tuple(entries)))
            anchors.append(Anchor(i, outputs, tuple(entries)))
        handers.append(here)
    own = sorted(set().union(*(a.outputs for a in anchors))) if anchors else []
    anchored = {groups[a.group][k]: a.outputs for a in anchors for k in a.entries}
    return Routes(handers, anchors, tuple(own), anchored)
