"""How the model's own code names each flat output of a lowered module: 'output[1]',
"output['logits']", 'output.loss'.

The frontend names outputs in its lowering errors (two views of one tensor returned) and
the runtime in its run-time errors (an output modified before backward); both read the
same pytree spec, `torch.export`'s `call_spec.out_spec`, so one function words both and a
user reads one name for one output.
"""

from __future__ import annotations

from torch.utils import _pytree as pytree


def output_names(out_spec, count: int) -> list[str]:
    """The name of each of `count` flat outputs under `out_spec` ('the output' for a lone
    tensor returned bare); 'output 0', 'output 1', ... where the spec is unknown or does
    not have `count` leaves, or where a class in it was registered with torch's pytree
    without key paths (diffusers' output classes: `UNet2DOutput`; asking for its paths
    raised a ValueError out of `remat`)."""
    if out_spec is not None and out_spec.num_leaves == count:
        try:
            paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(count)),
                                                                           out_spec))
        except ValueError:   # "Did not find a flatten_with_keys_fn for type ..."
            paths = None
        if paths is not None:
            return [f"output{pytree.keystr(path)}" if path else "the output" for path, _ in paths]
    return [f"output {i}" for i in range(count)]


def top_level_names(spec) -> list[str] | None:
    """The names of `spec`'s top-level outputs (a dict's keys, a ModelOutput's or a
    namedtuple's fields), or None where they have only positions (a tuple) or neither:
    what `remat(..., outputs=[...])` selects by (`frontends/selected_outputs.py`) and the
    runtime suggests selecting."""
    context = spec.context
    if isinstance(context, type) and hasattr(context, "_fields"):   # a namedtuple
        return list(context._fields)
    if isinstance(context, (list, tuple)) and len(context) == spec.num_children \
            and all(isinstance(c, str) for c in context):
        return list(context)
    return None


def top_level_positions(spec) -> list[int]:
    """For each flat leaf of `spec` (not a lone leaf), the position of the top-level output
    it is part of."""
    positions: list[int] = []
    for i, child in enumerate(spec.children()):
        positions.extend([i] * child.num_leaves)
    return positions


def top_level_selectors(out_spec, count: int) -> list[str | int] | None:
    """For each of `count` flat outputs, the name (else the position) of the top-level
    output it is part of; None where the spec is unknown, a lone tensor, or has neither."""
    if out_spec is None or out_spec.num_leaves != count or out_spec.is_leaf():
        return None
    names = top_level_names(out_spec)
    if names is None and out_spec.type not in (tuple, list):
        return None
    return [names[i] if names is not None else i for i in top_level_positions(out_spec)]
