"""Decisions a forward made from the values of its inputs, recorded as data so that the
runtime can make them again for every call.

transformers decides from an attention mask the caller passes whether SDPA may run
without a mask (is every token kept?), and from position ids whether several sequences
are packed in a row. Eager reads the values at every call; a graph holds one answer.
The frontend (`frontends/transformers_masks.py`) gives the trace eager's answer for the
example inputs and records here how it was reached: the ops from the inputs to the
tensor the decision reads (the mask cast to bool, a slice), the decision by name, its
other arguments and the answer. Before each call the runtime replays that (`answer`) on
the call's inputs: a call whose answer differs needs another graph (`runtimes/torch.py`
plans one, or refuses the call by name). The frontend computes its answer with the same
`answer`, so the answer recorded and the one checked come from one computation.

The forward's own branches on a tensor's truth computed from its inputs are recorded
alike (`frontends/input_branches.py`), as the decision `bool`, and the integers it reads
from such a tensor (`.item()`, `.tolist()`, `int()`: Qwen2-VL's split of its patches per
image, from the image grid the caller passes) as the decision `integers`. Only the
functions named in `DECISIONS` are ever called by name.
"""

from __future__ import annotations

import importlib
import json
import operator

import torch

from remat_ir.ir import RematIRError

_MASKING = "transformers.masking_utils"
#: The decisions that may be recorded, by qualified name, and how their result reads:
#: "skip" (True: attention runs with no mask) or "packed" (None: one sequence per row).
DECISIONS = {f"{_MASKING}._ignore_causal_mask_sdpa": "skip",
             f"{_MASKING}._ignore_bidirectional_mask_sdpa": "skip",
             f"{_MASKING}.find_packed_sequence_indices": "packed",
             # A branch of the forward on a tensor's truth (`frontends/input_branches.py`).
             "builtins.bool": "branch",
             # The integers the forward reads from a tensor (`frontends/input_branches.py`).
             f"{__name__}.integers": "integers"}
#: The recorded answer, said of the input whose values decided it.
_SAID = {("skip", True): "keeps every token (attention runs without a mask)",
         ("skip", False): "masks some token (attention runs with a mask)",
         ("packed", True): "holds one sequence per row",
         ("packed", False): "packs several sequences in a row"}


def integers(tensor: torch.Tensor):
    """The integers an integer or boolean `tensor` holds (the floats a float one holds,
    read from buffers), as Python's (nested) list, or one number for a tensor of no
    dimension: what `.tolist()` and `.item()` read."""
    return tensor.tolist()


class Unrecordable(Exception):
    """An op or argument on the way from the inputs to the decision that cannot be
    recorded as data (the decision then keeps the traced answer)."""


def encoded(value, refs: dict, device: torch.device):
    """`value`, an argument of an op, as JSON: `refs[node]` for an FX node (its recorded
    reference), and the example inputs' device as "the call's device"."""
    if isinstance(value, torch.fx.Node):
        if value not in refs:
            raise Unrecordable(value.name)
        return refs[value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [encoded(item, refs, device) for item in value]
    if isinstance(value, torch.device):
        return {"device": None if value == device else str(value)}
    for kind in (torch.dtype, torch.layout, torch.memory_format):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    raise Unrecordable(type(value).__name__)


def _decoded(value, values: list, leaves: list, device: torch.device, buffer=None):
    if isinstance(value, list):
        return [_decoded(item, values, leaves, device, buffer) for item in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:   # a tensor the forward built, by its values
        return torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"]),
                            device=device).reshape(value["shape"])
    (kind, what), = value.items()
    if kind == "input":
        return leaves[what]
    if kind == "buffer":
        return buffer(what)
    if kind == "op":
        return values[what]
    if kind == "device":
        return device if what is None else torch.device(what)
    return getattr(torch, what)


def _op(name: str):
    if name == "getitem":   # one result of an op of several
        return operator.getitem
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def decider(name: str):
    """The deciding function `name`, one of `DECISIONS` (a graph file names no other)."""
    if name not in DECISIONS:
        raise ValueError(f"{name!r} is not a decision remat-ir records")
    module, _, function = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise LookupError(f"the graph decides with {name}, which this process's transformers "
                          f"does not have (lowered with another version?): lower the model "
                          f"again") from None


def answer(guard: dict, leaves: list, decide=None, buffer=None) -> bool | int | list:
    """The decision of `guard` on a call's flat input `leaves` and the model's buffers
    (`buffer(name)`: the buffer of that qualified name, for a guard that reads one): its
    ops replayed, its function (`decide`, else the one it names) called on their result
    (outside tracing: eager's answer)."""
    tensors = [leaves[i] for i in guard["inputs"]] + [buffer(name) for name in guard.get("buffers", ())]
    device = tensors[0].device
    values: list = []
    with torch.no_grad():
        for name, args, kwargs in guard["ops"]:
            values.append(_op(name)(*_decoded(args, values, leaves, device, buffer),
                                    **{k: _decoded(v, values, leaves, device, buffer) for k, v in kwargs.items()}))
    read = _decoded(guard["reads"], values, leaves, device, buffer)
    result = (decide or decider(guard["decision"]))(read, *guard["args"], **guard["kwargs"])
    kind = DECISIONS[guard["decision"]]
    if kind == "packed":
        return result is None
    return result if kind == "integers" else bool(result)


class MalformedGuard(RematIRError):
    """A decision in a graph's `torch.value_guards` that this runtime does not know (a
    graph file edited by hand, or written otherwise): its shape is checked at load
    (`ir/frontend_metadata.py`), its decision's name here."""

    def __init__(self, index: int, guard: dict, why: str):
        super().__init__(f"the graph's decision {index} in 'torch.value_guards' ({guard.get('decision')!r}) "
                         f"{why}; the torch frontend records these, and a graph file edited by hand or "
                         "written by another version of remat-ir records them otherwise: lower the model again")


class ValueGuards:
    """The decisions recorded in a graph's metadata (`torch.value_guards`)."""

    KEY = "torch.value_guards"

    def __init__(self, metadata):
        self.guards = json.loads(metadata.get(self.KEY) or "[]")
        for index, guard in enumerate(self.guards):
            if guard["decision"] not in DECISIONS:
                raise MalformedGuard(index, guard, f"is none of the decisions remat-ir records "
                                                   f"({', '.join(DECISIONS)})")
        #: The identity of each guard with its answer: plans of one signature differ here.
        self.key = tuple(json.dumps(guard, sort_keys=True) for guard in self.guards)
        #: Each guard without its answer: what a call is asked (the same for every plan).
        self._questions = [json.dumps({k: v for k, v in guard.items() if k != "answer"}, sort_keys=True)
                           for guard in self.guards]

    def buffers(self) -> list[str]:
        """The model's buffers the decisions read, by name."""
        return sorted({name for guard in self.guards for name in guard.get("buffers", ())})

    def mismatch(self, leaves: list, names, answers: dict, buffer) -> str | None:
        """What differs for a call with flat inputs `leaves` (`names()`: their names) and
        the model's buffers (`buffer(name)`), said for the user, or None. `answers` memoises
        answers within one call, by decision."""
        for index, (guard, question) in enumerate(zip(self.guards, self._questions)):
            if question not in answers:
                try:
                    answers[question] = answer(guard, leaves, buffer=buffer)
                except Exception as error:
                    # Raised as it is: inputs eager's forward raises on too (an index out of
                    # range) raise here first (hunt72: a `MalformedGuard` blamed the file).
                    if type(error) is not LookupError:   # else `decider`'s own words
                        error.add_note(f"remat-ir: raised making again the decision {index} in the graph's "
                                       f"'torch.value_guards' ({guard['decision']}, at {_line(guard)}), "
                                       "which the forward makes from the call's inputs; a graph file edited "
                                       "by hand or written by another version of remat-ir records it "
                                       "otherwise: lower the model again")
                    raise
            # As JSON: floats read from a buffer by their bits (-0.0 is not 0.0, a NaN is
            # itself), integers as before.
            if json.dumps(answers[question]) != json.dumps(guard["answer"]):
                kind = DECISIONS[guard["decision"]]
                argument = " and ".join([names()[i] for i in guard["inputs"]] +
                                        [f"the model's buffer {name}" for name in guard.get("buffers", ())])
                if kind == "integers":
                    return (f"{_argument_values(argument, guard)} give {shown(answers[question])} "
                            f"at {_line(guard)}, where those it was lowered with gave "
                            f"{shown(guard['answer'])}: the forward reads these numbers from them, "
                            f"and a graph holds one value of each")
                if kind == "branch":
                    return (f"{_argument_values(argument, guard)} make the condition at {_line(guard)} "
                            f"{answers[question]}, where those it was lowered with made it "
                            f"{guard['answer']}: the forward branches on it, and a graph holds one branch")
                return (f"argument {argument} {_SAID[kind, answers[question]]}, where the one it "
                        f"was lowered with {_SAID[kind, guard['answer']]}: transformers decides "
                        f"this from its values ({guard['decision'].rpartition('.')[2]}), and a "
                        f"graph holds one decision")
        return None

    def integer_reads(self, answers: dict) -> list[tuple[str, str, object, object, list]]:
        """Each integer read of the forward whose answer for a call is in `answers` (as
        `mismatch` memoised it): its question, line, answer at lowering and for the call,
        and the model's buffers it reads (none where it reads the inputs alone)."""
        return [(question, _line(guard), guard["answer"], answers[question], guard.get("buffers", []))
                for guard, question in zip(self.guards, self._questions)
                if DECISIONS[guard["decision"]] == "integers" and question in answers]


def _line(guard: dict) -> str:
    """The line of the forward that made the decision (recorded for its own branches)."""
    return guard.get("line", "a line of the forward")


def _argument_values(argument: str, guard: dict) -> str:
    if not guard["inputs"]:   # buffers alone
        return f"the values of {argument}"
    plural = "s" if len(guard["inputs"]) > 1 else ""
    return f"the values of argument{plural} {argument}"


def shown(value, limit: int = 60) -> str:
    """`value` (integers), said in at most about `limit` characters."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "...]"
