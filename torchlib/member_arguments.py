"""Arguments of a call that are, or view, one of the model's parameters or buffers.

A call may pass the model's own tensor as an argument (`model(x, model.bn.running_mean)`).
The frontend traces the member and the argument as one tensor, so the graph reads it
once, as eager does; a graph lowered with another tensor there reads two, and a call
passing the member to it computed with the buffer as it was before the forward's update
(a loss of 0.41989 where eager gives 0.42018) or summed a parameter's gradient in another
order, silently (found by a review). A view of a member cannot be traced as one with it,
and is refused by name at lowering and at a call."""

from __future__ import annotations

import torch

from .types import storage_id


def view_of_member(named_leaves, members: dict, storages: dict | None = None) -> str | None:
    """What to say of the first of `named_leaves` ((argument name, leaf) pairs) that views
    a tensor of `members` (id -> qualified name), or None. With `storages` (storage id ->
    qualified name, `member_storages`), one sharing a member's memory otherwise too (a view
    of `weight.detach()`, `.data`: found by a review, AOTAutograd failed on one written in
    place with "list index out of range")."""
    for name, leaf in named_leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        base = leaf._base
        member = members.get(id(base)) if base is not None else None
        if member is None and storages and id(leaf) not in members:
            member = storages.get(storage_id(leaf))
        if member is not None:
            return (f"argument {name} is a view of the model's {member}, which remat-ir would read "
                    f"as a tensor of its own, where eager's view follows it (updated in place by the "
                    f"forward, or trained). Pass {member} itself, or read it inside the forward, or "
                    f"pass a copy (`.clone()`) if the forward should not see it change")
    return None


def member_arguments(named_leaves, members: dict) -> dict[int, str]:
    """{position: qualified name} of the leaves of `named_leaves` that are tensors of
    `members` (id -> qualified name)."""
    return {i: members[id(leaf)] for i, (_, leaf) in enumerate(named_leaves)
            if isinstance(leaf, torch.Tensor) and id(leaf) in members}


def member_storages(named_members) -> dict[int, str]:
    """{storage id: qualified name} of the (name, tensor) pairs `named_members`."""
    return {key: name for name, tensor in named_members if (key := storage_id(tensor)) is not None}
