"""Ops whose result's shape or Python value depends on tensor data, refused by name.

remat-ir lowers one graph of the whole step with fixed shapes, so tracing cannot take
`x[mask]`, `masked_select`, `unique`, `bincount`, `repeat_interleave` with tensor
counts or `.item()` (the CTC loss, whose buffers are sized by the target lengths, is one
op of fixed shapes: `ctc_losses.py`). Fake
tensors refuse each with the op's name alone, and that was all the error said
("AOTAutograd could not build the joint graph of M: aten.nonzero.default"): no line of
the model, nothing to do. Here the error names the op, the model's line and what to
write instead; a boolean mask, the usual case (a loss over the tokens whose label is
not -100), has a fixed-shape form that trains alike.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import traceback

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from .errors import LoweringError
from .model_lines import model_line, node_line

#: Op name (without overload) -> what to write instead.
_INSTEAD = {
    "nonzero": "a boolean mask selects a number of elements known only from the data "
               "(x[mask], or a loss over the tokens whose label is not -100): keep every "
               "element and mask the values instead, e.g. torch.where(mask, x, 0).sum() / "
               "mask.sum() for a masked mean, or pass ignore_index= to the loss",
    "_local_scalar_dense": "a tensor's value is read as a Python number (.item(), float(), "
                           "int(), bool(), .tolist()): keep it a tensor, or pass the number "
                           "to the model as a Python argument",
    # Found by hunt61: a mixture of experts' load count, told to move out of the model.
    "bincount": "counts have as many bins as the largest value says, even with minlength=: "
                "count with a fixed number of bins, e.g. F.one_hot(idx, num_classes=n).sum(0), or "
                "torch.zeros(n, dtype=torch.long).scatter_add_(0, idx, torch.ones_like(idx))",
}
_INSTEAD["masked_select"] = _INSTEAD["nonzero"]
_OUTSIDE = ("compute it outside the module: return what it reads from the forward and call "
            "it on the result (the gradient still flows back through the module's outputs)")


def value_dependent_error(model: str, exc: BaseException,
                          graph: torch.fx.Graph | None = None) -> LoweringError | None:
    """The LoweringError for `exc` when it (or an exception it was raised from) is fake
    tensors' refusal of a data-dependent op; else None. The model's line comes from the
    traceback (a failure while exporting runs the model's code) or from the node of
    `graph` (the exported program's, while building the joint graph) that calls the op."""
    found = _refusal(exc)
    if found is None:
        return None
    failure, func = found
    where = model_line(traceback.extract_tb(failure.__traceback__))
    name = _name(func)
    if where is None and graph is not None:
        calls = [node for node in graph.nodes if _calls(node, name)]
        where = next((line for node in calls for line in [node_line(node)] if line is not None), None)
        check = next((node for node in calls if _is_value_check(node)), None)
        if check is not None:
            return LoweringError(
                f"{model}'s forward checks a condition on tensor values at "
                f"{node_line(check) or 'a line tracing did not record'} through a reference to "
                f"torch._check_tensor_all_with taken before remat was called (or by reading "
                f"`_is_all_true().item()` itself), which one graph of the step cannot run. Call "
                f"torch._check_tensor_all(cond, message) at the call site: remat-ir runs it at every "
                f"step, as eager does (`frontends/tensor_checks.py`)")
    kind = ("whose value" if isinstance(failure, DataDependentOutputException)
            else "whose result's shape")
    if name == "_local_scalar_dense" and where is not None and _reads_a_draw(where):
        return LoweringError(
            f"{model}'s forward reads a random draw as a Python number at {where} "
            f"(`torch.randint(...).item()`): the graph would hold one draw for every step. "
            f"Keep the draw a tensor (index or mask with it), or turn that randomness off in "
            f"training (peft's BOFT: boft_dropout=0.0)")
    return LoweringError(
        f"{model}'s forward calls {func} at {where or 'a line tracing did not record'}, {kind} "
        f"depends on tensor data; remat-ir lowers one graph of the whole step, with fixed "
        f"shapes. Instead, {_INSTEAD.get(name, _OUTSIDE)}")


#: A random draw on the model's line that reads a number (`torch.randint(0, N, (1,)).item()`).
_DRAW = re.compile(r"\b(randint|rand|randn|randperm|bernoulli|multinomial|normal|poisson)\(")


def _reads_a_draw(where: str) -> bool:
    """Whether the model's line `where` ('file:line in function') draws at random (its
    source text). Why: peft's BOFT dropout picks a block by `torch.randint(0, N,
    (1,)).item()`, refused as a value that depends on tensor data and told to pass the
    number as an argument, which a peft user cannot do (found by a review)."""
    place = re.match(r"(.+):(\d+) in ", where)
    text = linecache.getline(place.group(1), int(place.group(2))) if place else ""
    return _DRAW.search(text) is not None


def symbolic_number_error(model: str, exc: BaseException, where: str, read: str | None) -> LoweringError:
    """The LoweringError for a plain Python error on a number torch.export holds as a
    symbol (`len(set(lengths))` of `mask.sum(1).tolist()`: "unhashable type: non-nested
    SymInt"), which was said as the forward taking another path while traced (Lumina2's
    sequence lengths), naming where the number was read (`noting_number_reads`)."""
    text = str(exc).strip()
    return LoweringError(
        f"{model}'s forward reads a number from tensor data{f' at {read}' if read else ''}, "
        f"which torch.export holds as a symbol without a value, and uses it as a plain Python "
        f"value at {where} ({type(exc).__name__}: {text.splitlines()[0] if text else ''}); "
        f"remat-ir lowers one graph of the whole step, which cannot depend on tensor values. "
        f"Instead, {_INSTEAD['_local_scalar_dense']}")


#: What a plain Python error on a symbol torch.export holds for a number says.
SYMBOLIC = re.compile(r"\bSym(Int|Float|Bool)\b")


@contextlib.contextmanager
def noting_number_reads(found: list[str]):
    """Within (a trace): the model's line that first reads a traced tensor as Python
    numbers (`.tolist()`, `.item()`) is appended to `found`; the error a later use of
    such a number raises names it (`symbolic_number_error`)."""
    from torch._subclasses.fake_tensor import is_fake

    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item")}

    def noting(function):
        def read(self, *args, **kwargs):
            if not found and is_fake(self):
                where = model_line(traceback.extract_stack()[:-1])
                if where is not None:
                    found.append(where)
            return function(self, *args, **kwargs)
        return read

    for name, function in originals.items():
        setattr(torch.Tensor, name, noting(function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(torch.Tensor, name, function)


#: The failing op -> the ops of the exported graph that run it inside their decomposition.
_CALLED_BY = {"nonzero": {"index", "argwhere", "masked_select", "where", "nonzero_numpy"},
              "_local_scalar_dense": {"item"},
              "repeat_interleave": {"repeat_interleave"}}


def _name(func) -> str:
    """'nonzero' for aten.nonzero.default."""
    schema = getattr(func, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else str(func)


def _calls(node: torch.fx.Node, name: str) -> bool:
    """Whether exported-graph `node` calls op `name` or runs it in its decomposition (an
    index by a boolean mask)."""
    called = _name(node.target) if node.op == "call_function" else None
    if called == name:
        return True
    if called not in _CALLED_BY.get(name, ()):
        return False
    if called == "where":   # `torch.where(cond)`, one argument (a hand-written MoE's routing;
        # `nonzero(as_tuple=True)` is `nonzero_numpy`): no line was found for either before
        return len(node.args) == 1
    if called != "index":
        return True
    indices = node.args[1] if len(node.args) > 1 else ()
    return any(isinstance(i, torch.fx.Node) and getattr(i.meta.get("val"), "dtype", None) == torch.bool
               for i in indices)


def data_sized_branch_error(model: str, exc: BaseException, graph: torch.fx.Graph) -> LoweringError | None:
    """The LoweringError for AOTAutograd's refusal to branch on a size or value that an op
    of exported `graph` computed from tensor data (a symbol `u0` of torch's: the rows a
    boolean index keeps, an `.item()`), named by that op and the model's line; else None.
    It said "AOTAutograd could not build the joint graph: Could not guard on data-dependent
    expression Eq(u0, 1)" before, with no line (Idefics3 selects its real images so)."""
    if not isinstance(exc, GuardOnDataDependentSymNode):
        return None
    symbols = set(re.findall(r"\bu\d+\b", str(exc).split("\n")[0]))
    node = next((node for node in graph.nodes
                 if any(str(symbol) in symbols for symbol in node.meta.get("unbacked_bindings") or {})), None)
    if node is None:
        return None
    name = _name(node.target)
    failing = next((op for op, callers in _CALLED_BY.items() if name in callers), name)
    return LoweringError(
        f"{model}'s forward calls {node.target} at {node_line(node) or 'a line tracing did not record'}, "
        f"whose result's shape or value depends on tensor data, and later code branches on it; "
        f"remat-ir lowers one graph of the whole step, with fixed shapes. Instead, "
        f"{_INSTEAD.get(failing, _OUTSIDE)}")


def _is_value_check(node: torch.fx.Node) -> bool:
    """Whether exported-graph `node` reads a value for `torch._check_tensor_all`: an `item`
    of `_is_all_true` (torch.export asserts on the number it reads)."""
    source = node.args[0] if node.args else None
    return (isinstance(source, torch.fx.Node) and source.op == "call_function"
            and _name(source.target) == "_is_all_true")


def _refusal(exc: BaseException | None):
    """(the exception, its op) of the first data-dependent refusal in `exc`'s chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException)):
            return exc, exc.func
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def watching_data_values(model: str, number_reads: list[str]):
    """Within (a trace of `model`): packed sequences refused, numbers read from tensor data
    noted in `number_reads` (`refusing_packed_sequences`, `noting_number_reads`)."""
    with refusing_packed_sequences(model), noting_number_reads(number_reads):
        yield


@contextlib.contextmanager
def refusing_packed_sequences(model: str):
    """While the block traces `model`, making a `PackedSequence` (`pack_padded_sequence`,
    `pack_sequence`) raises one LoweringError naming the model's line: a packed batch's
    layout (`batch_sizes`) comes from the lengths' values, and an RNN fed one failed deep
    inside ("zeros(): argument 'size' ... got FakeTensor"), said as the forward taking
    another path while traced."""
    packed = torch.nn.utils.rnn.PackedSequence
    new = packed.__new__

    def refused(cls, *args, **kwargs):
        where = model_line(traceback.extract_stack())
        raise LoweringError(
            f"{model}'s forward packs sequences (torch.nn.utils.rnn.PackedSequence"
            f"{f' at {where}' if where else ''}): a packed batch's layout comes from the "
            f"lengths' values, a shape known only from the data, and remat-ir lowers one graph "
            f"of the whole step with fixed shapes. Run the RNN over the padded batch and mask "
            f"what lies past each length (a packed RNN's last hidden state and its backward "
            f"direction differ from a padded one's: take the outputs at each length with "
            f"torch.gather)")

    packed.__new__ = refused
    try:
        yield
    finally:
        packed.__new__ = new

