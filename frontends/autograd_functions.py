"""Custom `torch.autograd.Function`s keep their own backward through lowering.

`torch.export` inlines a Function's forward ops and drops its `backward`, so
AOTAutograd would differentiate the forward ops instead: a straight-through
estimator (forward rounds, backward passes the gradient on) would train with
round's derivative, zero. While the frontend traces, `preserving_functions()`
routes every call of a user-defined Function through a custom op of its own
(`remat_ir_fn::<name>_<digest>`), opaque to export, whose registered autograd
formula runs the Function's `backward`; AOTAutograd then traces that backward
into the joint graph, so what the Function's `backward` computes is what runs. Its
gradients follow eager's conventions: outputs it marks non-differentiable get none; an
output no gradient reached reaches the backward as None where the Function calls
`set_materialize_grads(False)`, else as zeros; an input it returns None for gets none (a
parameter's `.grad` stays None, which an optimizer skips). Until 2026-12-05 these were
zeros or a gradient, silently (found by a review).

How: the op runs `Function.forward` once, with a stand-in context, and returns its
outputs, then what it saved for the backward that is neither an input nor an output
(`_Returns`); the autograd formula's `setup_context` builds the backward's context from
the op's inputs and results. A forward that draws random numbers makes its op a random
node of the graph, whose draw a recomputation replays (`random_ops`). (Until 2026-11-30
`setup_context` ran the forward again, traced, for what it saves: a Function saving an
intermediate computed it twice, and a drawing one drew twice, so its saved mask was not
its output's, silently.) Refused with a `LoweringError` naming the Function: keyword
arguments to `apply`, `mark_dirty` (in-place outputs), outputs other than tensors,
tensors in containers among its arguments (`_unfollowed_argument`), tensors in a
container attribute of its context, and, in its forward, writes into its arguments or
into any other tensor it did not make (a 0-dimensional class attribute counting calls
passed for a constant while tracing, and counted recomputations too, silently), values
read from tensors, and parameters or buffers read from a module passed as an
argument (`_refusing_effects`). Functions defined in torch itself are left to torch, but
for the reentrant `torch.utils.checkpoint` (`use_reentrant=True`), refused: its forward
runs under `no_grad` and its gradients come from a backward of its own, so the traced
step lost every gradient through it, silently where another path reached the loss
(2026-11-29 sweep: the parameters after it got none). An output that is an input or a
view of one is returned as a copy; one tensor returned twice is eager's last of the two
outputs (its gradient comes to the backward there, zeros in the other place).

The ops are registered in this process only: a graph that uses one runs in a
process that lowered the same model.

An op's name is a digest of what it computes (the Function's qualified name, its
methods' code, which arguments are tensors, the other arguments' values), so that
lowering the same model in another process names the same ops (the plan cache finds
its entry, a saved module runs there), and a graph never runs another Function's op
under its name: a second class of the same qualified name in one process (a notebook
cell run again) gets ops of its own, and so does a Function edited between processes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import traceback
import types

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointFunction

from remat_ir.torchlib.callables import code_digest
from remat_ir.torchlib.types import FUNCTION_NAMESPACE, autocast_state, entered_autocast, overlaps

from .model_lines import is_users_file, model_line
from .outside_tensors import OP_NOTE, outside_tensors_refused, traced
from .random_ops import draws_random, note_function_op, opaque_custom_op
from .traced_reads import own_methods

#: Ops registered in this process: name -> (Function class, arguments other than
#: tensors, op, facts).
_registered: dict[str, tuple[type, list, object, dict]] = {}
#: Argument types whose equal values compute the same (others must be the same object).
_VALUE_TYPES = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)


def function_class(op: torch._ops.OpOverload | str) -> type | None:
    """The Function class `op` (an op of `FUNCTION_NAMESPACE`, or its IR name
    "namespace.name.overload") stands for in this process, or None (another op)."""
    namespace, _, name = op.partition(".") if isinstance(op, str) else op._schema.name.partition("::")
    found = _registered.get(name.split(".")[0]) if namespace == FUNCTION_NAMESPACE else None
    return found[0] if found is not None else None


class FunctionError(Exception):
    """A custom Function that cannot be preserved (the frontend turns it into a LoweringError)."""


class _Context:
    """Stands in for the `ctx` a Function's forward and backward receive."""

    def __init__(self, needs_input_grad: tuple[bool, ...], function: str):
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self._saved: tuple = ()
        self._non_differentiable: tuple = ()
        self._function = function

    def save_for_backward(self, *tensors) -> None:
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        return self._saved

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    def save_for_forward(self, *tensors) -> None:
        """What eager keeps for the Function's `jvp` (forward-mode AD), which a training
        step never runs: kept nowhere. (Missing, the forward failed as another path taken
        while tracing, found by a review.)"""

    def mark_dirty(self, *tensors) -> None:
        raise FunctionError(f"autograd.Function {self._function} marks inputs dirty (modifies them "
                            "in place); remat-ir cannot preserve it: return new tensors instead")


def _uses_setup_context(cls) -> bool:
    return cls.setup_context is not torch.autograd.function._SingleLevelFunction.setup_context


def _run_forward(cls, ctx: _Context, args: list):
    if _uses_setup_context(cls):
        output = cls.forward(*args)
        cls.setup_context(ctx, tuple(args), output)
        return output
    return cls.forward(ctx, *args)


def _as_list(output, name: str) -> list[torch.Tensor]:
    outputs = list(output) if isinstance(output, (tuple, list)) else [output]
    if not all(isinstance(o, torch.Tensor) for o in outputs):
        raise FunctionError(f"autograd.Function {name} returns {type(output).__name__} with "
                            "non-tensor items; remat-ir preserves Functions that return tensors")
    return outputs


def _same_constant(a, b) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(_same_constant, a, b))
    return isinstance(a, _VALUE_TYPES) and a == b


#: The methods of a Function whose code decides what its op computes and keeps.
_METHODS = ("forward", "setup_context", "backward", "jvp")


def _methods_code(cls) -> list[str]:
    """A digest of the code the Function runs (`callables.code_digest`): its class's
    functions (`own_methods`: `forward`, `backward`, the helpers they call as
    `Scale._helper(x)`) and, transitively, the functions of the user's files that code
    names as globals. A Function edited between two processes (a temporary added to its
    forward, or to a helper it calls) kept its op's name, so a plan cache handed the
    second process the graph profiled for the first, and a plan 13.8x (7.4x through a
    helper) over its byte budget (found by a review)."""
    todo = [function for function in own_methods(cls) if is_users_file(function.__code__.co_filename)]
    todo += [function for name in _METHODS if (function := getattr(cls, name, None)) is not None
             and isinstance(getattr(function, "__code__", None), types.CodeType)]
    seen: dict[types.CodeType, str] = {}
    while todo and len(seen) < _MAX_FUNCTIONS:
        function = todo.pop()
        code = function.__code__
        if code in seen:
            continue
        seen[code] = f"{function.__module__}.{function.__qualname__}:{code_digest(code)}"
        for name in _global_names(code):
            called = function.__globals__.get(name)
            if isinstance(called, types.FunctionType) and is_users_file(called.__code__.co_filename):
                todo.append(called)
    return sorted(seen.values())


#: How many functions a Function's digest follows at most (a helper calling into a large
#: user library stops there; the op's name is then that of the first ones).
_MAX_FUNCTIONS = 64


def _global_names(code: types.CodeType) -> set[str]:
    """The names `code` (and the code it nests) loads as globals (among `co_names`, which
    also holds attribute names: looked up in the globals, an attribute is found only where
    a global has its name, a harmless extra)."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _op_name(cls, positions: list[int], constants: list) -> str:
    """`<class name>_<digest of what the op computes>`, with `_<k>` where an op of this
    process already holds that name for another class or other arguments (a digest of
    their `repr`, which may elide: numpy abbreviates long arrays)."""
    described = repr((cls.__module__, cls.__qualname__, _methods_code(cls), positions, constants))
    digest = hashlib.sha256(described.encode()).hexdigest()[:16]
    base = f"{re.sub(r'[^0-9a-zA-Z]+', '_', cls.__name__).lower()}_{digest}"
    name, k = base, 0
    while name in _registered and not (_registered[name][0] is cls
                                       and _same_constant(_registered[name][1], constants)):
        k += 1
        name = f"{base}_{k}"
    return name


def _wrap(cls, args: tuple, autocast: tuple[tuple[str, str], ...] = ()):
    """(custom op, tensor positions, facts) for one call. The op runs the Function's
    forward once and returns its outputs, then what it saved for the backward that is
    neither an input nor an output (`_Returns`); `facts["outputs"]`, set when the op runs,
    says how many of its results are the Function's outputs, `facts["sequence"]` whether
    the Function returned a tuple or list rather than one tensor, `facts["draws"]` whether
    its forward draws from the generator (the graph's node is then random, replayed where
    recomputed: `random_ops.draws_random`). A call computing what an earlier one did (same
    class, same constants, same autocast state, the same inputs needing a gradient) shares
    its op.

    `autocast`: the autocast state the Function was called under, which its forward runs
    under, as eager's does (the runtime runs segments without autocast, the casts being
    in the graph; a Function's forward is opaque to tracing, so its casts are not):
    under bf16 autocast its matmul ran in float32 (gradients 3e-3 off eager's), and
    `torch.amp.custom_fwd(cast_inputs=...)` cast nothing, so mixed dtypes crashed.

    Why one run: the op ran the forward for its outputs, and the autograd formula's
    `setup_context` ran it again, traced, for what it saves. A Function that saved an
    intermediate or its output computed it twice, and one that drew random numbers drew
    twice: the mask it saved was not the one its output used (gradients off eager's, the
    generator advanced twice, silently: 2026-11-30)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    needs = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    others = [None if i in positions else a for i, a in enumerate(args)] + [autocast, needs]
    op_name = _op_name(cls, positions, others)
    if op_name in _registered:
        _, _, op, facts = _registered[op_name]
        return op, positions, facts
    name = f"{cls.__module__}.{cls.__qualname__}"
    constants = list(args)
    facts = {"sequence": False, "outputs": 0, "same": [], "draws": False, "returns": None, "last": None,
             "modules": {}}
    autocasting = functools.partial(entered_autocast, autocast)

    def full_args(tensors):
        full = list(constants)
        for i, t in zip(positions, tensors):
            full[i] = t
        return full

    def as_called(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """`tensors` as eager's forward gets them: each needing a gradient where the call's
        did. The graph's tensors need none: a quantizer rounding only `if x.requires_grad`
        took the other branch (outputs 0.156 off), and a backward returning None where
        `ctx.needs = x.requires_grad` was False left every parameter before it untrained,
        silently (found by a review). (`x.is_leaf` and `x.grad_fn` stay a leaf's: inside a
        custom op's kernel autograd records nothing.)"""
        return [t.detach().requires_grad_() if needs[i] and (t.is_floating_point() or t.is_complex()) else t
                for i, t in zip(positions, tensors)]

    def forward(tensors: list[torch.Tensor]) -> _Returns:
        ctx = _Context(needs, name)
        called = as_called(tensors)
        with torch.no_grad(), autocasting():
            output = _run_forward(cls, ctx, full_args(called))
            facts["sequence"] = isinstance(output, (tuple, list))
            outputs = _as_list(output, name)
            # A tensor returned twice (`return y, y`) is eager's last output of the two: every
            # gradient reaching it comes to the backward in that place, zeros in the other.
            facts["same"] = [max(j for j, t in enumerate(outputs) if t is o) for o in outputs]
            returns = _Returns(name, called, outputs, ctx)
        if facts["returns"] is None:
            facts["returns"], facts["outputs"] = returns, len(outputs)
        elif not returns.same_layout(facts["returns"]):
            raise RuntimeError(f"autograd.Function {name} saved other tensors for its backward "
                               f"than when it was lowered ({returns.describe()}, lowered: "
                               f"{facts['returns'].describe()}); lower the model again")
        return returns

    def run(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return forward(tensors).take()

    def traced_forward(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        with _refusing_effects(name, dict(zip(positions, tensors)), facts["modules"]) as effects:
            try:
                returns = facts["last"] = forward(tensors)
            except Exception as exc:   # said as the Function's by the frontend (`forward_of`)
                exc.add_note(f"{_FORWARD_NOTE}{name}")
                raise
        facts["draws"] = facts["draws"] or effects.drew
        facts["opaque"] = facts.get("opaque", False) or effects.opaque   # never recomputed (`opaque_custom_op`)
        return returns.take()

    op = torch.library.custom_op(f"{FUNCTION_NAMESPACE}::{op_name}", run, mutates_args=())
    op.register_fake(traced_forward)

    def setup_context(ctx, inputs, output):
        (tensors,) = inputs
        # The run that made `output`, just before: the op is shared by lowerings of other
        # shapes, and a `ctx.shape = x.shape` kept from the first one's run reshaped the
        # next one's gradient to the first's shape.
        returns: _Returns = facts["last"]
        ctx.function_context = returns.context(needs, list(tensors), list(output))
        ctx.input_meta = [(t.shape, t.dtype, t.device) for t in tensors]
        ctx.output_meta = [(t.shape, t.dtype, t.device) for t in output[:facts["outputs"]]]
        # As eager's Function: outputs it marked get no gradient (the loss reading one sent
        # its gradient into the backward, found by a review); the backward gets None for an
        # output no gradient reached and materializes it itself where the Function's
        # context asks (`set_materialize_grads(False)` got zeros where eager passes None).
        ctx.mark_non_differentiable(*(output[j] for j in returns.non_differentiable))
        ctx.set_materialize_grads(False)

    def backward(ctx, grads):
        fctx = ctx.function_context
        grads = list(grads[:len(ctx.output_meta)])   # none flows to what was saved
        if fctx.materialize_grads:
            grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                     for g, (shape, dtype, device) in zip(grads, ctx.output_meta)]
        try:
            with outside_tensors_refused() if any(map(traced, grads)) else contextlib.nullcontext():
                result = cls.backward(fctx, *grads)
        except Exception as exc:   # said as the Function's by the frontend (`backward_of`)
            exc.add_note(f"{_BACKWARD_NOTE}{name}")
            raise
        result = list(result) if isinstance(result, (tuple, list)) else [result]
        refused = _gradients_refused(cls, result, len(constants), positions)
        if refused is not None:
            refused.add_note(f"{_BACKWARD_NOTE}{name}")
            raise refused
        # None where the Function's backward gives none, as eager leaves a parameter's
        # `.grad` None there (zeros made AdamW decay a weight eager's step skips).
        return [result[i] if i < len(result) else None for i in positions]

    op.register_autograd(backward, setup_context=setup_context)
    _registered[op_name] = (cls, others, op, facts)
    note_function_op(f"{FUNCTION_NAMESPACE}::{op_name}", facts)
    return op, positions, facts


def _gradients_refused(cls, result: list, arguments: int, positions: list[int]) -> RuntimeError | None:
    """Eager's error for gradients a Function's backward returns that eager refuses: too
    few, more than its arguments (but for trailing Nones), or one for an argument that is
    no tensor; else None. A review found them trained: the missing gradients None, the
    others dropped."""
    if len(result) < arguments or any(r is not None for r in result[arguments:]):
        return RuntimeError(f"function {cls.__name__}Backward returned an incorrect number of gradients "
                            f"(expected {arguments}, got {len(result)})")
    for i, r in enumerate(result[:arguments]):
        if r is not None and i not in positions:
            return RuntimeError(f"function {cls.__name__}Backward returned a gradient different than None at "
                                f"position {i + 1}, but the corresponding forward input was not a Variable")
    return None


#: The notes a Function's backward and forward add to an error they raised while traced
#: (`backward_of`, `forward_of`).
_BACKWARD_NOTE = "raised in the backward of autograd.Function "
_FORWARD_NOTE = "raised in the forward of autograd.Function "


def backward_of(exc: BaseException) -> str | None:
    """The qualified name of the custom Function whose backward raised `exc` (or the
    error it caused) while AOTAutograd traced it, or None. The frontend's messages named
    the model's forward for a global tensor the backward read, and passed on torch's
    internal assertion for one it wrote into (found by a review)."""
    return _noted(exc, _BACKWARD_NOTE)


def forward_of(exc: BaseException) -> str | None:
    """The qualified name of the custom Function whose forward raised `exc` (or the error
    it caused) while traced, or None. A forward reading a tensor through its closure (a
    buffer, an activation of the same call) failed as "Mixing fake modes NYI", naming
    neither the Function nor a way out (found by a review)."""
    return _noted(exc, _FORWARD_NOTE)


def op_backward_of(exc: BaseException) -> str | None:
    """The custom op (namespace::name) whose registered backward computed on a tensor from
    outside the trace (`outside_tensors.custom_op_backwards_watched`), or None."""
    return _noted(exc, OP_NOTE)


def _noted(exc: BaseException, prefix: str) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for note in getattr(exc, "__notes__", ()):
            if note.startswith(prefix):
                return note[len(prefix):]
        exc = exc.__cause__ or exc.__context__
    return None


#: Attributes of the stand-in context that are its own, not the Function's.
_OWN = frozenset(vars(_Context((), "")))


class _Returns:
    """What one run of a Function's forward hands the graph: its outputs (a copy of one
    that is an input or a view of one: a custom op's results may not alias its inputs),
    then each tensor it saved for the backward (`save_for_backward`, or assigned to the
    context) that is neither an input, an output nor a view of either. `saved` and
    `tensor_attributes` say where each saved tensor is found among the op's inputs and
    results: ("input", i), ("output", j), ("none",), or ("view", base, shape, strides,
    offset from the base's), so that `context` builds the backward's context from the
    graph's tensors. A view is made again from its base, in its own layout: copied out,
    a slice of the input was contiguous where eager's is not, and a reduction over it in
    the backward summed in another order (weight gradients 2e-7 off eager's)."""

    def __init__(self, name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], ctx: _Context):
        # An output sharing memory with an input or an earlier output (`return y, y`) is a
        # copy: a custom op's results may alias neither (the first training call failed
        # inside torch's custom-op code: found by a review).
        storages = {StorageWeakRef(t.untyped_storage()) for t in inputs}
        self.tensors = []
        for o in outputs:
            storage = StorageWeakRef(o.untyped_storage())
            self.tensors.append(_copied(o) if storage in storages else o)
            storages.add(storage)
        found = {**{id(t): ("output", j) for j, t in enumerate(outputs)},
                 **{id(t): ("input", i) for i, t in enumerate(inputs)}}
        bases = {StorageWeakRef(t.untyped_storage()): (("input", i), t) for i, t in enumerate(inputs)}
        for j, t in enumerate(self.tensors):
            bases.setdefault(StorageWeakRef(t.untyped_storage()), (("output", j), t))

        def place(tensor):
            if tensor is None:
                return ("none",)
            if not isinstance(tensor, torch.Tensor):
                raise FunctionError(f"autograd.Function {name} saves a {type(tensor).__name__} "
                                    f"with save_for_backward; remat-ir preserves Functions that "
                                    f"save tensors (keep other values as attributes of ctx)")
            if id(tensor) in found:
                return found[id(tensor)]
            storage = StorageWeakRef(tensor.untyped_storage())
            base = bases.get(storage)
            # A view of another dtype (`x.view(torch.int32)`, `view_as_real`) is saved as a
            # tensor of its own: made again from its base, it had the base's dtype (a
            # gradient 6.1e-3 off eager's, silently; found by a review).
            if (base is not None and tensor.storage_offset() >= base[1].storage_offset()
                    and tensor.dtype == base[1].dtype):
                found[id(tensor)] = ("view", base[0], tuple(tensor.shape), tuple(tensor.stride()),
                                     tensor.storage_offset() - base[1].storage_offset())
            else:
                found[id(tensor)] = ("output", len(self.tensors))
                self.tensors.append(tensor.clone() if base is not None else tensor)
                bases.setdefault(StorageWeakRef(self.tensors[-1].untyped_storage()),
                                 (found[id(tensor)], self.tensors[-1]))
            return found[id(tensor)]

        self.saved = [place(t) for t in ctx.saved_tensors]
        self.attributes, self.tensor_attributes = {}, {}
        for key, value in sorted(vars(ctx).items()):
            if key in _OWN:
                continue
            if isinstance(value, torch.Tensor):
                self.tensor_attributes[key] = place(value)
            elif any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value)):
                raise FunctionError(f"autograd.Function {name} keeps tensors inside ctx.{key}; "
                                    f"remat-ir preserves tensors the forward saves with "
                                    f"save_for_backward or assigns to ctx one by one")
            else:
                self.attributes[key] = value
        self.materialize_grads = ctx.materialize_grads
        #: The outputs the forward marked non-differentiable, by index.
        self.non_differentiable = [j for j, o in enumerate(outputs)
                                   if any(o is t for t in ctx._non_differentiable)]
        self.count = len(self.tensors)

    def take(self) -> list[torch.Tensor]:
        """The op's results, handed over once: kept facts hold no tensor of a step."""
        tensors, self.tensors = self.tensors, None
        return tensors

    def same_layout(self, other: _Returns) -> bool:
        """Whether both runs found their saved tensors in the same places (a view's shape,
        strides and offset are each lowering's own)."""
        return self._places() == other._places()

    def _places(self) -> tuple:
        def kind(place):
            return place[:2] if place[0] == "view" else place
        return ([kind(p) for p in self.saved], {k: kind(p) for k, p in self.tensor_attributes.items()},
                self.count)

    def describe(self) -> str:
        return f"{len(self.saved)} saved, {self.count} results"

    def context(self, needs: tuple[bool, ...], inputs: list, results: list) -> _Context:
        """The backward's context: this run's other attributes, the saved tensors found
        among the graph's `inputs` and `results` of the op."""
        def tensor(place):
            if place[0] == "view":
                base = tensor(place[1])
                return base.as_strided(place[2], place[3], base.storage_offset() + place[4])
            return None if place[0] == "none" else (inputs if place[0] == "input" else results)[place[1]]

        ctx = _Context(needs, "")
        ctx.__dict__.update(self.attributes)
        ctx._saved = tuple(tensor(p) for p in self.saved)
        for key, place in self.tensor_attributes.items():
            setattr(ctx, key, tensor(place))
        ctx.materialize_grads = self.materialize_grads
        return ctx


def _copied(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` (an output aliasing an input or an earlier output) in its own
    strides, also where they leave gaps: a strided slice copied contiguously was summed
    after the Function in another order than eager's view (outputs 7.6e-6 off, found by a
    review). Strides that overlap (`expand`) cannot be written into: copied contiguously."""
    if tensor.layout != torch.strided or overlaps(tensor.shape, tensor.stride()):
        return tensor.clone()
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                               device=tensor.device).copy_(tensor)


#: Why a Function's forward may not write into a tensor it did not make.
_AGAIN = ("remat-ir runs a Function's forward again wherever its plan recomputes it, so the "
          "write would be done more than once per step")


class _refusing_effects(TorchDispatchMode):
    """Notes in `drew` whether an op of the block draws from the generator; raises
    `FunctionError` at the first that writes into one of the Function's arguments (without
    `mark_dirty`, refused apart) or into any tensor its forward did not make, reads a
    tensor's value, or reads a parameter or buffer of a module passed as an argument (a
    checkpoint Function as latent diffusion's and guided diffusion's `checkpoint` write
    it: it failed as "a tensor read from a global"). Entered only while tracing (the op's
    fake kernel). The op runs again wherever the plan recomputes it: a running
    statistic the forward updated was updated 2-3 times per step (0.47 off eager's after
    one step, silently, 2026-11-30, when `setup_context` also ran it). A value read from a
    tensor (`.item()`): export failed on it with "pending unbacked symbols", naming no
    line."""

    def __init__(self, function: str, arguments: dict[int, torch.Tensor], modules: dict):
        super().__init__()
        self.function, self.drew, self.modules, self.opaque = function, False, modules, False
        self.arguments = {StorageWeakRef(t.untyped_storage()): i for i, t in arguments.items()}
        # Storages the forward's own ops made: the only ones it may write into. A write
        # into any other (a class attribute, a tensor a closure holds) is done again by
        # each recomputation, as a write into an argument is.
        self.made: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for tensor in pytree.tree_leaves((args, kwargs)):
            reached = self.modules.get(StorageWeakRef(tensor.untyped_storage())) \
                if isinstance(tensor, torch.Tensor) else None
            if reached is not None:
                self._refuse(
                    f"is passed module {reached[1]} (argument {reached[0]}) and its forward reads "
                    f"the module's parameters or buffers ({func.name()}{self._where()})",
                    "remat-ir gives a Function's backward only its tensor arguments. If it is a "
                    "checkpoint or a reversible layer's memory-saving backward (its backward runs "
                    "the module again under autograd: latent diffusion's checkpoint, Reformer's "
                    "reversible layers), turn it off where the model has a switch (latent "
                    "diffusion, guided diffusion: use_checkpoint=False); a model without one "
                    "(Reformer) cannot be trained through remat-ir, which plans recomputation itself")
        self.opaque = self.opaque or opaque_custom_op(func)
        if draws_random(func, args, kwargs):
            self.drew = True
            if any(isinstance(g, torch.Generator) and not _default_generator(g)
                   for g in pytree.tree_leaves((args, kwargs))):
                self._refuse(f"draws from a torch.Generator of its own in its forward "
                             f"({func.name()}{self._where()})",
                             "remat-ir replays the default generator's draws only, so a "
                             "recomputation could draw other numbers from it. Draw "
                             "from the default generator (seeded with torch.manual_seed), or "
                             "draw outside the Function and pass the numbers as an argument")
        if func in (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default):
            self._refuse(f"reads a tensor's value in its forward (`.item()`, `float(t)` or a "
                         f"branch on a tensor{self._where()})",
                         "a traced graph holds no value read from a tensor's data. Compute with "
                         "the tensor instead (`x / x.abs().amax()`)")
        if func._schema.is_mutable:
            for i, argument in enumerate(func._schema.arguments):
                value = args[i] if i < len(args) else kwargs.get(argument.name)
                if (argument.alias_info is not None and argument.alias_info.is_write
                        and isinstance(value, torch.Tensor)
                        and StorageWeakRef(value.untyped_storage()) not in self.made):
                    position = self.arguments.get(StorageWeakRef(value.untyped_storage()))
                    self._refuse(
                        (f"writes into its argument {position}" if position is not None else
                         "writes into a tensor it did not make (a global, a class attribute, "
                         "a closure's)") + f" in its forward ({func.name()}{self._where()})",
                        f"{_AGAIN}. Return the new value and update the tensor outside the "
                        f"Function (a buffer: in the module's forward, under torch.no_grad)")
        result = func(*args, **kwargs)
        # A result on a storage none of the op's tensors had is new (a view's or an in-place
        # op's is not); a constant made in the forward (`torch.tensor([...])`) is lifted.
        read = {StorageWeakRef(t.untyped_storage()) for t in pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)}
        fresh = func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
        for tensor in pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor) and (
                    fresh or StorageWeakRef(tensor.untyped_storage()) not in read):
                self.made.add(StorageWeakRef(tensor.untyped_storage()))
        return result

    @staticmethod
    def _where() -> str:
        where = model_line(traceback.extract_stack())
        return f" at {where}" if where else ""

    def _refuse(self, what: str, why: str):
        raise FunctionError(f"autograd.Function {self.function} {what}: {why}")


def _default_generator(generator: torch.Generator) -> bool:
    """Whether `generator` is its device's default generator, which remat-ir replays."""
    if generator is torch.default_generator:
        return True
    return (generator.device.type == "cuda" and torch.cuda.is_initialized()
            and generator is torch.cuda.default_generators[generator.device.index or 0])


def _unfollowed_argument(name: str, args: tuple) -> str | None:
    """Why a call of Function `name` cannot be preserved, or None: tensors inside a
    container argument (`apply(x, [w0, w1])`), which failed as "Mixing fake modes NYI".
    Only tensor arguments are the custom op's inputs; others are constants of the graph."""
    for i, argument in enumerate(args):
        if not isinstance(argument, torch.Tensor) and any(
                isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(argument)):
            return (f"autograd.Function {name} is passed tensors inside a "
                    f"{type(argument).__name__} (argument {i}); remat-ir preserves Functions "
                    f"whose tensors are arguments of apply() themselves: pass them one by one "
                    f"(apply(x, *weights))")
    return None


def _module_tensors(args: tuple) -> dict:
    """Storage -> (argument position, module class) of the parameters and buffers of the
    modules among `args` (or of the module a bound method argument belongs to), which a
    Function's forward reaches other than through its tensor arguments."""
    found = {}
    for i, argument in enumerate(args):
        owner = argument.__self__ if isinstance(argument, types.MethodType) else argument
        if isinstance(owner, torch.nn.Module):
            for tensor in (*owner.parameters(), *owner.buffers()):
                found.setdefault(StorageWeakRef(tensor.untyped_storage()), (i, type(owner).__name__))
    return found


def _reentrant_checkpoint(frames: list[traceback.FrameSummary]) -> str:
    where = model_line(frames)
    return (f"torch.utils.checkpoint with use_reentrant=True (torch's default where it is not "
            f"passed){f' at {where}' if where else ''}: "
            "its forward runs under no_grad and its gradients come from a backward of its own, "
            "which a traced graph does not keep, so the step would train without the gradients "
            "through it. remat-ir plans recomputation itself: remove the checkpoint (Hugging "
            "Face: skip gradient_checkpointing_enable()), or pass use_reentrant=False, which "
            "remat-ir traces as plain ops")


#: torch's own Functions whose backward tracing cannot derive, preserved as a user's are:
#: Dirichlet's and Beta's `rsample` draws with `_sample_dirichlet`, which has no derivative
#: of its own (AOTAutograd refused it: "derivative for aten::_sample_dirichlet is not
#: implemented", found by a review); its Function's backward computes `_dirichlet_grad`.
_TORCHS_OWN_PRESERVED = frozenset({torch.distributions.dirichlet._Dirichlet})


#: torch's `Function.apply` (the function its classmethod wraps) and its code as torch
#: defines it: `preserving_functions` swaps the code for `_ROUTED_CODE` while it traces.
_APPLY = torch.autograd.Function.__dict__["apply"].__func__
_APPLY_CODE = _APPLY.__code__
#: Where `_ROUTED_CODE` finds the routing `apply` of the innermost `preserving_functions`.
_ROUTE = "_remat_ir_route"


def _routed_code() -> types.CodeType:
    """Code for `_APPLY` calling the `apply` that `preserving_functions` set, with as many
    free variables as `_APPLY`'s closure has cells (one: the `__class__` of its `super()`,
    `Function`, which this code reads the route from). The code runs with `_APPLY`'s
    globals (torch's module), so it reaches the route through that cell only."""
    holder = None

    def apply(cls, *args, **kwargs):
        return getattr(holder, "_remat_ir_route")(cls, *args, **kwargs)
    return apply.__code__


_ROUTED_CODE = _routed_code()


@contextlib.contextmanager
def preserving_functions(errors: list, applied: set):
    """Route user-defined `autograd.Function.apply` calls through custom ops (see module
    docstring) while the block traces, adding their classes to `applied`. A Function that
    cannot be preserved appends its `FunctionError` to `errors` and runs as torch would
    (the caller then refuses).

    The code of torch's `Function.apply` is swapped, not the class attribute: an alias
    taken before tracing (`grad_reverse = GradReverse.apply` at import, `self.fn =
    Scale.apply`, a `functools.partial` of it) holds the bound method of torch's function,
    and ran the Function as torch does, its forward's ops traced and differentiated by
    autograd's formulas: its own backward was lost, gradients 0.4 off eager's, silently
    (found by a review)."""
    function_class = torch.autograd.Function
    if len(_APPLY.__closure__ or ()) != len(_ROUTED_CODE.co_freevars):
        raise RuntimeError("torch's autograd.Function.apply has changed: remat-ir cannot route "
                           "custom Functions through it (report this with your torch version)")
    # torch's own apply, as a function of its own (the swapped one runs `_ROUTED_CODE`).
    torchs = types.FunctionType(_APPLY_CODE, _APPLY.__globals__, _APPLY.__name__, _APPLY.__defaults__,
                                _APPLY.__closure__)

    def apply(cls, *args, **kwargs):
        if cls is CheckpointFunction:
            errors.append(FunctionError(_reentrant_checkpoint(traceback.extract_stack())))
            return torchs(cls, *args, **kwargs)
        if (cls.__module__.startswith("torch.") or cls.__module__ == "torch") and cls not in _TORCHS_OWN_PRESERVED:
            return torchs(cls, *args, **kwargs)
        name = f"{cls.__module__}.{cls.__qualname__}"
        applied.add(cls)
        if kwargs:
            errors.append(FunctionError(f"autograd.Function {name} is called with keyword "
                                        "arguments; remat-ir preserves positional calls only"))
            return torchs(cls, *args, **kwargs)
        unfollowed = _unfollowed_argument(name, args)
        if unfollowed:
            raise FunctionError(unfollowed)
        try:
            op, positions, facts = _wrap(cls, args, autocast_state())
            # For this call's traced forward only: a later trace of the op (AOTAutograd's,
            # from export's program) is not this call, and storages once freed are reused.
            facts["modules"] = _module_tensors(args)
            try:
                outputs = op([args[i] for i in positions])
            finally:
                facts["modules"] = {}
        except FunctionError as exc:
            errors.append(exc)
            return torchs(cls, *args, **kwargs)
        outputs = [outputs[j] for j in facts["same"]]   # then what the forward saved
        return tuple(outputs) if facts["sequence"] else outputs[0]

    outer = function_class.__dict__.get(_ROUTE)   # a trace inside a trace: restored after
    setattr(function_class, _ROUTE, apply)
    _APPLY.__code__ = _ROUTED_CODE
    try:
        yield
    finally:
        if outer is None:
            _APPLY.__code__ = _APPLY_CODE
            delattr(function_class, _ROUTE)
        else:
            setattr(function_class, _ROUTE, outer)

