"""Which ops draw from torch's generator: what the graph records as random nodes
(`frontends.torch`), found in the ops a preserved custom Function's forward runs
(`autograd_functions`), and the ops of such Functions whose forward draws."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from remat_ir.torchlib.generators import PythonGenerators

from .outside_values import user_state_kept


#: A preserved custom Function's op (its qualified name) -> its facts; `facts["draws"]`
#: is known once the op has been traced, after the op was registered without tags.
_FUNCTION_OPS: dict[str, dict] = {}


def note_function_op(name: str, facts: dict) -> None:
    """Register a custom Function's op (`autograd_functions`), whose draws are said by
    `facts["draws"]` rather than by a tag."""
    _FUNCTION_OPS[name] = facts


def draws_random(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether the op draws from the generator: tagged nondeterministic_seeded, and not an
    attention kernel called with dropout_p=0 (the common case, which draws nothing); a
    custom Function's op whose forward drew while it was traced; a user's custom op that
    drew when run once (`custom_op_draws`). `args`/`kwargs`: the FX node's."""
    facts = _FUNCTION_OPS.get(target._schema.name)
    if facts is not None:
        return facts["draws"]
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return custom_op_draws(target, args, kwargs)
    for i, argument in enumerate(target._schema.arguments):
        if argument.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", argument.default_value)
            return p != 0
    return True


#: Namespaces whose ops say whether they draw by their tag: PyTorch's and remat-ir's own,
#: and torch.distributed's, whose collectives must not run on one rank at lowering.
_TAGGED_NAMESPACES = frozenset({"aten", "prims", "remat_ir", "_c10d_functional", "c10d", "c10d_functional",
                                "_dtensor", "profiler"})
#: A user's custom op (by its name and the shapes, dtypes and constants of one call) ->
#: what that call drew from when it ran once.
_CUSTOM_DRAWS: dict[tuple, Trial] = {}


def custom_op_draws(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether a user's custom op (`torch.library.custom_op` without the
    `nondeterministic_seeded` tag: a fused dropout written as one op) draws from the
    generator: it runs once on placeholder inputs of the traced call's shapes, and draws if
    the default generator of its inputs' device moved. Taken as deterministic, such an op
    was recomputed in the backward drawing new numbers: gradients 6e-3 off eager's and the
    generator elsewhere after the step, silently (found by a review). `args`/`kwargs`: the
    FX node's, whose tensors are nodes holding their fake value in `meta["val"]`. The
    user's generator is left as it was; a call that raises counts as drawing (then
    replayed where recomputed, which is exact either way)."""
    if target.namespace in _TAGGED_NAMESPACES or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    values = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta.get("val"))
    return custom_op_trial(target, values).torch


@dataclass(frozen=True)
class Trial:
    """What a custom op's kernel moved when it ran once (`custom_op_trial`): torch's
    generator (or it raised: `raised`), which of Python's and NumPy's
    (`PythonGenerators.moved`), and the user's own state (a generator or counter its
    globals hold: `outside_values.user_state_kept`)."""
    torch: bool
    outside: tuple[str, ...] = ()
    raised: bool = False
    own: tuple[str, ...] = ()


def custom_op_trial(target: torch._ops.OpOverload, values) -> Trial:
    """Run a custom op once on placeholder inputs like `values` (its arguments, fake
    tensors among them) and say what it drew from, each call's shapes, dtypes and
    constants once; the generators are left as they were."""
    leaves, spec = torch.utils._pytree.tree_flatten(values)
    key = (target._schema.name, target._overloadname, str(spec),
           tuple((tuple(v.shape), tuple(v.stride()), v.dtype, str(v.device)) if isinstance(v, torch.Tensor)
                 else repr(v) for v in leaves))
    if key not in _CUSTOM_DRAWS:
        # Lowering walks the graph under export's fake mode: the op must run for real.
        with torch.utils._python_dispatch._disable_current_modes():
            _CUSTOM_DRAWS[key] = _drew_once(target, leaves, spec)
    return _CUSTOM_DRAWS[key]


#: The custom ops the caller declared pure (`remat(..., pure_ops=...)`), while lowering.
_DECLARED_PURE: list[frozenset[str]] = [frozenset()]


def check_pure_ops(names) -> frozenset[str]:
    """`names` (custom ops as "namespace::name") as a set, or BadRequest-like ValueError
    saying what is wrong: a declaration naming PyTorch's own ops, or not a name, is a
    mistake the user should hear of, not an op silently taken as pure."""
    if isinstance(names, str):
        names = [names]
    found = set()
    for name in names or ():
        if not isinstance(name, str) or "::" not in name or name.split("::", 1)[0] in _TAGGED_NAMESPACES:
            raise ValueError(f"pure_ops names custom ops as 'namespace::name' (`torch.library.custom_op`'s "
                             f"name; not PyTorch's own, which remat-ir knows), not {name!r}")
        found.add(name)
    return frozenset(found)


@contextlib.contextmanager
def declared_pure(names: frozenset[str]):
    """Within: the custom ops `names` are recomputed like PyTorch's ops (`opaque_custom_op`)."""
    _DECLARED_PURE.append(frozenset(names))
    try:
        yield
    finally:
        _DECLARED_PURE.pop()


def opaque_custom_op(target) -> bool:
    """Whether `target` is a custom op of the user's or of a library (`torch.library`, not
    PyTorch's own nor a preserved custom Function's, whose forward lowering checks): its
    kernel is code remat-ir cannot see into, which may draw from NumPy's or Python's
    generator or from a generator of its own, draw only for some values of its inputs, or
    count its calls (hunt63: recomputed in the backward, each drew or counted again,
    gradients 3.5e-3 to 1.0e-1 off eager's, the generators elsewhere, silently). Such an
    op is computed once per step, as eager computes it, and never recomputed
    (`Node.non_recomputable`), as torch.compile's partitioner bans recomputing ops not in
    its allowlist. So is a preserved custom Function's op whose forward calls one
    (`facts["opaque"]`; hunt63: through the Function, recomputed, 6.8e-2 off). An op the
    caller declared pure (`remat(..., pure_ops=["mylib::gelu"])`: a kernel that draws from
    torch's generator alone, or nothing, and keeps no state) is recomputed like PyTorch's
    (hunt65: a model of custom ops reached 0.475 of eager's peak, 0.37 before)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace in _TAGGED_NAMESPACES:
        return False
    if target._schema.name in _DECLARED_PURE[-1]:   # `remat(..., pure_ops=[...])`: the user's word
        return False
    facts = _FUNCTION_OPS.get(target._schema.name)
    return facts is None or facts.get("opaque", False)


def _drew_once(target, leaves: list, spec) -> Trial:
    placeholder = torch.Generator().manual_seed(0)
    devices = {v.device for v in leaves if isinstance(v, torch.Tensor)} or {torch.device("cpu")}
    real = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="cpu")
            if t.is_floating_point() or t.is_complex():
                t.normal_(generator=placeholder)
            else:
                t.zero_()
            v = t.to(v.device)
        real.append(v)
    args, kwargs = torch.utils._pytree.tree_unflatten(real, spec)
    generators = [torch.default_generator if d.type == "cpu" else torch.cuda.default_generators[d.index or 0]
                  for d in devices if d.type in ("cpu", "cuda")]
    before = [g.get_state() for g in generators]
    python = PythonGenerators()   # and NumPy's: its kernel may draw from them (hunt63)
    outside: tuple[str, ...] = ()
    raised, own = False, []
    try:
        with torch.no_grad(), user_state_kept() as own:   # a count of its calls (hunt65)
            target(*args, **kwargs)
        moved = any(not torch.equal(g.get_state(), state) for g, state in zip(generators, before))
        outside = tuple(python.moved())
    except Exception:
        moved = raised = True
    finally:
        for g, state in zip(generators, before):
            g.set_state(state)
        python.restore()
    return Trial(moved, outside, raised, tuple(own))


@contextlib.contextmanager
def user_draws_kept():
    """While lowering: the untagged ops that may draw are impure to tracing's dead-code
    elimination, as PyTorch's tagged draws are: a custom Function's op whose forward drew
    while traced (`note_function_op`), and a user's custom op (whether it draws is found
    at lowering, `custom_op_draws`: running it inside a trace would trace it; one that
    does not is a node nothing reads, which plans skip). Taken as pure, a call that draws
    and whose result nothing reads (a statistic never used, an output left out with
    `outputs=`) was dropped from the graph while eager draws it: the generator's state
    after the step differed, and every later draw with it (found by a search). Through
    `Node.is_impure`, which asks `torch._library.utils.is_impure` at each call."""
    from torch._library import utils as library_utils

    pure = library_utils.is_impure

    def is_impure(op, *, args=None, kwargs=None, impure_random=True):
        if pure(op, args=args, kwargs=kwargs, impure_random=impure_random):
            return True
        if not (impure_random and isinstance(op, torch._ops.OpOverload)):
            return False
        facts = _FUNCTION_OPS.get(op._schema.name)
        return facts["draws"] if facts is not None else op.namespace not in _TAGGED_NAMESPACES

    library_utils.is_impure = is_impure
    try:
        yield
    finally:
        library_utils.is_impure = pure
