"""Outputs that share storage with an input or a parameter (refused at lowering), or with
another output (taken again on it by the runtime, `runtimes/output_views.py`; where it
cannot be, refused once a backward reaches them: `output_aliases`).

AOTAutograd returns such an output from its compiled function and rebuilds it, in its
runtime wrapper, as a view of its base outside the function, so that autograd sends
the view's gradient into the base's. The joint graph therefore has no tangent for it,
and a step run from the graph alone hands it over without a gradient path: the model
`return y, y.t()` trained with a loss on both gave parameter gradients 500x off
eager's, silently (now taken again, as AOTAutograd's wrapper does); returning a
parameter or a view of an input crashed at the first call. Two or more views of one
tensor the forward does not return (a Linear's 3-d result and its first token, as
AltCLIP's text model returns) were refused at lowering: AOTAutograd returns that tensor
as an extra output, which the frontend now keeps as a hidden user output for the runtime
to take the views again on. What each output is comes from AOTAutograd's own analysis
(`output_info`). Outputs that alias nothing, and views of intermediates AOTAutograd
turns into copies (`unsafe_view_alias`), lower as before.
"""

from __future__ import annotations

from remat_ir.torchlib.output_names import output_names

from .fx_nodes import node_module_path
from .model_lines import node_line

#: AOTAutograd's output kinds that the joint graph computes as an output of its own.
_OWN = {"non_alias", "unsafe_view_alias"}


def _what(info, names: list[str]) -> str:
    kind = info.output_type.name
    if kind == "is_input":
        return "is an input of the step (a parameter, buffer or input returned as it is)"
    if kind == "alias_of_input":
        return "is a view of an input of the step (a parameter, buffer or input)"
    if kind == "alias_of_intermediate_base_is_user_output" and info.base_idx is not None:
        base = names[info.base_idx] if info.base_idx < len(names) else f"output {info.base_idx}"
        return f"is a view of {base}, another output"
    return f"is a view of a tensor the forward computed ({kind})"


#: Output kinds that share storage with an input of the step: refused at lowering (the
#: runtime cannot hand such an output over: a returned parameter crashed at the first call).
_OF_INPUTS = {"is_input", "alias_of_input"}
#: Output kinds of two or more views of one tensor the forward computes and does not return
#: (`return y[:, :4], y[:, 4:]`; a Linear's 3-d result and a slice of it, as AltCLIP's text
#: model returns): AOTAutograd returns that tensor as an extra output of the graph, for its
#: runtime wrapper to take the views again on; so does the runtime (a hidden user output).
_OF_ONE_INTERMEDIATE = {"alias_of_intermediate_save_as_output", "alias_of_intermediate"}


def output_aliases(joint, out_spec, model: str,
                   stored: list[str] = ()) -> tuple[str | None, dict[int, str], dict[int, int]]:
    """(What is wrong with the first output of `joint`, AOTAutograd's joint graph with
    descriptors, that is an input or a view of one, or None; {flat output position: what
    to say if a gradient reaches it} for the outputs that are views of another output or
    of a tensor the forward computed; {flat output position: its base's} for the views of
    another output, where the base of views of a tensor the forward does not return
    counts after the model's own outputs, as the frontend adds it: a hidden user output.)
    The frontend raises the first as its LoweringError and keeps the others in the
    graph's metadata. The runtime takes a view of another output again on
    the output it hands over, as AOTAutograd's wrapper does, so that autograd sends the
    view's gradient into the base's (CLIP's `logits_per_image`, the transpose of
    `logits_per_text`, both read by the usual symmetric contrastive loss); a view it cannot
    take so is refused only once a loss uses it, since the graph gives it no gradient.
    `stored`: where the forward stores each tensor the graph returns after the model's
    outputs (`stored_tensors`), 'attribute 'x' of inner at file:line'."""
    metadata = getattr(getattr(joint, "_aot_state", None), "fw_metadata", None)
    infos = getattr(metadata, "output_info", None)
    if not infos:
        return None, {}, {}
    names = output_names(out_spec, len(infos))
    problem, views, bases = None, {}, {}
    shared: dict[int, list[int]] = {}   # intermediate base: the outputs viewing it
    for i, info in enumerate(infos):
        if info.output_type.name in _OWN:
            continue
        if info.output_type.name in _OF_ONE_INTERMEDIATE:
            shared.setdefault(info.base_idx, []).append(i)
            continue
        said = (f"{model} returns {names[i]}, which {_what(info, names)}. remat-ir runs the "
                f"step as one graph, whose outputs cannot share storage with each other or "
                f"with its inputs and still pass their gradients on the way eager does. Return "
                f"a copy (`.clone()`) or take the view outside the model")
        first_stored = len(infos) - len(stored)
        if i >= first_stored and info.output_type.name in _OF_INPUTS:
            said = (f"{model}'s forward stores on {stored[i - first_stored]} a tensor that "
                    f"{_what(info, names)}: the graph returns what the forward stores, for the "
                    f"runtime to store after every call, and a graph's outputs cannot share "
                    f"storage with its inputs. Store a copy there (`.clone()`), or keep it "
                    f"outside the forward")
        if info.output_type.name == "is_input" and i < len(infos) - len(stored):
            continue   # handed over as it is (`frontends/torch.py` `_returned_input`)
        if info.output_type.name in _OF_INPUTS:
            problem = problem or said
        else:
            views[i] = said
            if info.output_type.name == "alias_of_intermediate_base_is_user_output" and info.base_idx is not None:
                bases[i] = info.base_idx
    for base, outputs in shared.items():   # the base is a user output after the model's own
        said = _views_of_one_tensor(joint, names, model, outputs)
        views.update((i, said) for i in outputs)
        bases.update((i, len(infos) + base) for i in outputs)
    return problem, views, bases


def _views_of_one_tensor(joint, names: list[str], model: str, outputs: list[int]) -> str:
    """What to say of `outputs`, views of one tensor the forward computed and does not
    return (two slices of it; one taken before an in-place op on it), where the runtime
    cannot take them again on that tensor (`runtimes/output_views.py`: the forward reads
    it otherwise after making them, or reads them otherwise) and a loss reads one."""
    many = len(outputs) > 1   # one, where the tensor's other aliases take no gradient (`detach`)
    listed = (f"{', '.join(names[i] for i in outputs[:-1])} and {names[outputs[-1]]}, views of one tensor"
              if many else f"{names[outputs[0]]}, a view of a tensor")
    nodes = _output_nodes(joint)
    base = nodes.get(("base", outputs[0]))
    found = node_module_path(base) if base is not None else None
    module = found and found[0] and f"module {found[0]!r} ({found[1]})"
    made = " ".join(p for p in (module and f"by {module}",
                                node_line(base) and f"at {node_line(base)}") if p)
    # Views of a tensor written in place after them are replayed by tracing, with no line.
    taken = next((line for i in outputs if (line := node_line(nodes.get(("output", i))))), None)
    where = "; ".join(p for p in (made and f"the tensor is last computed {made}",
                                  taken and f"the view{'s are' if many else ' is'} taken at {taken}") if p)
    copies = ("a copy of all of them but one (`y[:, :4], y[:, 4:].clone()`), split the tensor "
              "with torch.split or torch.chunk (`return torch.split(y, 4, dim=1)`: each part "
              "then trains like eager)" if many else "a copy of it (`.clone()`)")
    return (f"{model} returns {listed} that its forward computes, does not return, and reads "
            f"otherwise too{f' ({where})' if where else ''}: after making the "
            f"view{'s' if many else ''}, or through {'them' if many else 'it'}. remat-ir takes such "
            f"views again on the tensor, as eager's autograd sees them, where the forward's other "
            f"reads of the tensor come before the views and read none of them, or where a loss "
            f"reads the views alone or the forward's other results alone: here its gradient's "
            f"parts would add up in another order than eager's. Return {copies}, or "
            f"return the tensor itself and take the view{'s' if many else ''} outside the model")


def _output_nodes(joint) -> dict:
    """{("output", i): the joint graph's node of user output i, ("base", i): the node of
    the tensor AOTAutograd returns as the base of output i's views}."""
    found: dict = {}
    for node in joint.graph_module.graph.nodes:
        if node.op != "output":
            continue
        for result, desc in zip(node.args[0], node.meta.get("desc") or ()):
            kind = type(desc).__name__
            if kind == "PlainAOTOutput":
                found[("output", desc.idx)] = result
            elif kind == "IntermediateBaseAOTOutput":
                found[("base", getattr(desc.base_of, "idx", None))] = result
    return found
