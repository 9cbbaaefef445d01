"""The outputs a training step returns, where the caller trains on some of them alone
(`remat(model, batch, outputs=["loss"])`).

Why: every output a step returns is held by the caller until the step ends, so a plan may
neither free nor recompute it (docs/schedules.md). A Hugging Face model given `labels`
returns its logits beside its loss; trained as `model(**batch).loss.backward()` (the
Trainer's habit), the logits are the step's largest tensor and nothing reads them after
the loss. Left out of the step's outputs, they are an intermediate like any other, which
the plan frees once the loss is computed or recomputes in the backward.

Done on the exported module before AOTAutograd builds the joint graph: its output node
keeps the selected outputs' tensors and returns None in place of the others'
(a Hugging Face `ModelOutput` then has `logits=None`, as for the outputs a model was not
asked for; a dict or a tuple keeps its keys or positions, with None as their values). Top-level outputs only: a
model's output is a flat record of named results in practice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils import _pytree as pytree

from remat_ir.torchlib.output_names import top_level_names, top_level_positions

from .errors import LoweringError

__all__ = ["SelectionError", "check_selection", "select_outputs"]


class SelectionError(LoweringError):
    """`outputs=` selects no output of this call (a call without labels, where the loss is
    selected): `remat_ir.remat` plans a later call's signature with every output then
    (Trainer's label smoothing pops the labels and computes the loss from the logits)."""


def check_selection(outputs) -> tuple[str | int, ...] | None:
    """`outputs` as a tuple of names and positions, or None for every output; a bad
    argument fails here, before minutes of tracing."""
    if outputs is None:
        return None
    if isinstance(outputs, (str, int)) and not isinstance(outputs, bool):
        outputs = (outputs,)
    if not isinstance(outputs, Sequence) or not outputs or any(
            isinstance(o, bool) or not isinstance(o, (str, int)) for o in outputs):
        raise LoweringError(
            f"outputs must name the model's outputs the training step returns: a name or a "
            f"position, or a non-empty list of them (outputs=[\"loss\"]), not {outputs!r}")
    return tuple(outputs)


def _selected_children(spec: pytree.TreeSpec, outputs: tuple, model: str) -> list[int]:
    """The positions among `spec`'s top-level outputs that `outputs` selects."""
    if spec.is_leaf():
        raise LoweringError(f"outputs={list(outputs)!r}: {model}'s forward returns one tensor, so "
                            f"there is nothing to leave out: drop the `outputs` argument")
    names = top_level_names(spec)
    positional = spec.type in (tuple, list) or (names is not None and hasattr(spec.context, "_fields"))
    if names is None and not positional:
        raise LoweringError(f"outputs={list(outputs)!r}: {model}'s forward returns a "
                            f"{spec.type.__name__}, whose outputs have neither names nor positions "
                            f"remat-ir can select: return a dict, a tuple or a ModelOutput")
    shown = (f"its outputs are {names}" if names is not None
             else f"it returns {spec.num_children} outputs")
    chosen = []
    for o in outputs:
        if isinstance(o, str):
            if names is None or o not in names:
                raise SelectionError(f"outputs: {model}'s forward returns no output named {o!r} for "
                                    f"these inputs ({shown}): name one of them")
            chosen.append(names.index(o))
        else:
            if not positional or not -spec.num_children <= o < spec.num_children:
                raise LoweringError(f"outputs: {model}'s forward has no output at position {o} "
                                    f"({shown}): " + ("name one of them" if names is not None and not positional
                                                      else f"give a position below {spec.num_children}"))
            chosen.append(o % spec.num_children)
    return sorted(set(chosen))


def select_outputs(module: torch.fx.GraphModule, spec: pytree.TreeSpec, outputs: tuple,
                   model: str) -> pytree.TreeSpec:
    """Make `module` (an exported program's module, outputs flattened by `spec`) return
    the top-level outputs `outputs` selects, and None for each tensor of the others; the
    spec its outputs now flatten by. Refuses a selection of no tensor, which would leave
    nothing to train."""
    chosen = _selected_children(spec, outputs, model)
    kept = {leaf for leaf, i in enumerate(top_level_positions(spec)) if i in chosen}
    node = next(n for n in module.graph.nodes if n.op == "output")
    flat = node.args[0]
    kept |= set(range(spec.num_leaves, len(flat)))   # tensors the forward stores (`stored_tensors`)
    if not any(isinstance(flat[i], torch.fx.Node) for i in kept):
        # Said for the call too: one without labels has no loss where the selection is the
        # loss (found by a review: the advice was to select the loss, which it did).
        raise SelectionError(f"outputs={list(outputs)!r} selects no tensor among {model}'s outputs for "
                            f"these inputs (the output is None: a loss without labels?): select the "
                            f"loss the step trains on, or call remat_ir.remat without outputs= for "
                            f"calls that train on other outputs")
    # Tracing then drops the ops only what is left out reads, but not a draw (impure to
    # its dead-code elimination): the generator's stream stays eager's.
    node.args = (type(flat)(leaf if i in kept else None for i, leaf in enumerate(flat)),)
    module.recompile()
    # A None is a leaf of a dict or a tuple (a constant output), and no field of a
    # ModelOutput, which leaves it out of its keys: flattened again to learn which. The
    # placeholders are tensors: a ModelOutput reads its first field as a dict otherwise.
    placeholders = [torch.empty(0) if i in kept else None for i in range(spec.num_leaves)]
    return pytree.tree_flatten(pytree.tree_unflatten(placeholders, spec))[1]
