"""The shapes of the metadata a frontend writes for its runtime (`Graph.metadata`).

The torch frontend records facts its runtime reads back (docs/ir.md,
*Metadata*) as JSON in string entries. A graph read from a file may have had them edited
or written by another tool; the runtime then parsed them where it needed them and died
with a raw `JSONDecodeError`, `TypeError` or `KeyError` from deep inside, naming neither
the key nor what to do (hunt68: 16 raw errors of 21 tries). Validation checks each entry
here against the shape its runtime reads, so a graph with a malformed one is refused at
`ir.load`, by `remat-ir validate` and before it runs, with the key named.

A shape is a small tree of `Shape`s (no torch here: `ir` stands below the frontends).
Keys not listed are left alone: a newer frontend may add some, and text entries (a
pytree spec, a dtype's name) are read as text by their runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """What a JSON value must be: `kind` "text", "count" (an integer >= 0), "flag" (a
    boolean), "any", "list" (of `item`), "row" (a list of `fields` in order), "map" (an
    object of `item` values; `keys` "count" where its keys are integers written as text),
    "object" (with `fields` named in `names`), "choice" (one of the texts in `names`) or
    "either" (of the shapes in `fields`)."""

    kind: str
    item: Shape | None = None
    fields: tuple = ()
    names: tuple = ()
    keys: str = "text"
    optional: tuple = ()

    def describe(self) -> str:
        """What the shape asks for, said for the user ("a list of texts")."""
        if self.kind == "list":
            return f"a list of {_plural(self.item)}"
        if self.kind == "row":
            return f"a list of {len(self.fields)} ({', '.join(f.describe() for f in self.fields)})"
        if self.kind == "map":
            keys = "integer keys" if self.keys == "count" else "text keys"
            return f"an object with {keys} and values each {self.item.describe()}"
        if self.kind == "object":
            return f"an object with {', '.join(repr(n) for n in self.names if n not in self.optional)}"
        if self.kind == "choice":
            return " or ".join(json.dumps(name) for name in self.names)
        if self.kind == "either":
            return " or ".join(f.describe() for f in self.fields)
        return _SINGLE[self.kind]

    def problem(self, value, where: str = "") -> str | None:
        """Where `value` first fails the shape and how, or None."""
        here = where or "it"
        if self.kind == "any":
            return None
        if self.kind == "text":
            return None if isinstance(value, str) else f"{here} is {_shown(value)}, not a text"
        if self.kind == "count":
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return None
            return f"{here} is {_shown(value)}, not an integer of 0 or more"
        if self.kind == "flag":
            return None if isinstance(value, bool) else f"{here} is {_shown(value)}, not true or false"
        if self.kind == "choice":
            return None if value in self.names and isinstance(value, str) else \
                f"{here} is {_shown(value)}, not {self.describe()}"
        if self.kind == "either":
            if any(f.problem(value) is None for f in self.fields):
                return None
            return f"{here} is {_shown(value)}, not {self.describe()}"
        if self.kind in ("list", "row"):
            if not isinstance(value, list):
                return f"{here} is {_shown(value)}, not {self.describe()}"
            if self.kind == "row" and len(value) != len(self.fields):
                return f"{here} is {_shown(value)}, not {self.describe()}"
            shapes = self.fields if self.kind == "row" else [self.item] * len(value)
            for index, (shape, item) in enumerate(zip(shapes, value)):
                if (found := shape.problem(item, f"{where}[{index}]")) is not None:
                    return found
            return None
        if not isinstance(value, dict):
            return f"{here} is {_shown(value)}, not {self.describe()}"
        if self.kind == "object":
            for name, shape in zip(self.names, self.fields):
                if name not in value:
                    if name in self.optional:
                        continue
                    return f"{here} has no {name!r} ({self.describe()})"
                if (found := shape.problem(value[name], f"{where}[{name!r}]")) is not None:
                    return found
            return None
        for key, item in value.items():
            if self.keys == "count" and not (key.isdigit() and key.isascii()):
                return f"{here} has the key {key!r}, not an integer"
            if (found := self.item.problem(item, f"{where}[{key!r}]")) is not None:
                return found
        return None


_SINGLE = {"text": "a text", "count": "an integer of 0 or more", "flag": "true or false",
           "any": "any JSON value"}


def _plural(shape: Shape) -> str:
    said = shape.describe()
    return {"a text": "texts", "an integer of 0 or more": "integers of 0 or more"}.get(said, said)


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


TEXT, COUNT, FLAG, ANY = Shape("text"), Shape("count"), Shape("flag"), Shape("any")


def list_of(item: Shape) -> Shape:
    return Shape("list", item=item)


def row(*fields: Shape) -> Shape:
    return Shape("row", fields=fields)


def map_of(item: Shape, keys: str = "text") -> Shape:
    return Shape("map", item=item, keys=keys)


def choice(*names: str) -> Shape:
    return Shape("choice", names=names)


def either(*shapes: Shape) -> Shape:
    return Shape("either", fields=shapes)


def object_with(optional: tuple = (), **fields: Shape) -> Shape:
    """An object with `fields`, those named in `optional` perhaps absent."""
    return Shape("object", fields=tuple(fields.values()), names=tuple(fields), optional=optional)


NAMES = list_of(TEXT)
#: Each module of the model: path, class, then the names of its submodules, parameters
#: and buffers and of those it holds as None (`torchlib/model_structure.structure`).
_MODULE_ROW = row(TEXT, TEXT, *[NAMES] * 6)
#: A held tensor: where it lives (module path or Python module, attribute, key or
#: place), and its digest.
_TENSOR_ROW = row(TEXT, TEXT, ANY, TEXT)

#: The JSON entries each runtime reads, by key, with their shapes (docs/ir.md, *Metadata*).
SHAPES: dict[str, Shape] = {
    "torch.inputs": NAMES,
    "torch.input_aliases": list_of(NAMES),
    "torch.input_members": list_of(row(TEXT, TEXT)),
    "torch.value_guards": list_of(object_with(decision=TEXT, inputs=list_of(COUNT),
                                              ops=list_of(row(TEXT, list_of(ANY), map_of(ANY))),
                                              args=list_of(ANY), kwargs=map_of(ANY), answer=ANY)),
    "torch.stored_attributes": list_of(row(TEXT, TEXT)),
    "torch.assigned_after": list_of(row(TEXT, TEXT, ANY)),
    "torch.constant_outputs": map_of(ANY, keys="count"),
    "torch.member_outputs": map_of(either(row(choice("param", "buffer"), TEXT), row(choice("input"), COUNT)),
                                   keys="count"),
    "torch.aliased_outputs": map_of(TEXT),
    "torch.output_view_bases": map_of(COUNT),
    "torch.hidden_outputs": COUNT,
    "torch.python_draws": COUNT,
    "torch.frozen_parameters": NAMES,
    "torch.tied_parameters": list_of(NAMES),
    "torch.tied_buffers": list_of(NAMES),
    "torch.model_structure": object_with(modules=list_of(_MODULE_ROW), aliases=list_of(NAMES),
                                         hooks=NAMES, forwards_hooks=NAMES, optional=("forwards_hooks",)),
    "torch.held_tensors": list_of(_TENSOR_ROW),
    "torch.global_tensors": list_of(_TENSOR_ROW),
    "torch.module_attributes": list_of(row(TEXT, TEXT, ANY)),
    "torch.module_containers": list_of(row(TEXT, TEXT, list_of(list_of(ANY)))),
    "torch.object_attributes": list_of(row(TEXT, TEXT, TEXT, ANY)),
    "torch.global_reads": list_of(row(TEXT, TEXT, ANY, ANY)),
    "torch.module_callables": list_of(row(TEXT, TEXT, ANY)),
    "torch.autocast": map_of(TEXT),
    "torch.autocast_cache": FLAG,
    "torch.autocast_cast_and_read": NAMES,
    "torch.autocast_blocks": object_with(nested=FLAG, per_reader=NAMES),
    "torch.deterministic": FLAG,
}


def metadata_problems(metadata, frontend: str) -> list[str]:
    """A sentence per entry of `metadata` (a graph's map) that is not JSON of its shape."""
    problems = []
    for key in sorted(metadata):
        shape = SHAPES.get(key)
        if shape is None:
            continue
        text = metadata[key]
        try:
            value = json.loads(text)
        except ValueError as error:
            found = f"it is not JSON ({error.msg} at character {error.pos}: {text[:40]!r})"
        else:
            found = shape.problem(value)
        if found is not None:
            problems.append(f"metadata {key!r} must be {shape.describe()}, but {found}; the "
                            f"{frontend or 'its'} frontend writes it for its runtime (docs/ir.md, "
                            "*Metadata*): lower the model again rather than edit it")
    return problems
