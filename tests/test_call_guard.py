"""The generated per-call guard (`runtimes/call_guard.py`) against the full checks it
short-cuts: searched over sequences of changes a user makes to a model between steps,
the guard must never pass a model the full checks refuse, must hand over the very tensors
they bind, and must pass again once a call has passed them."""

import copy
import enum
import functools
import types

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import remat_ir
from remat_ir.runtimes.torch import RuntimeInputError, ScheduledModule, _Submodules

#: Read by the model's forward as globals of this module.
FACTOR = 2.0
SETTINGS = {"scale": 1.0}


def _shift(h):
    return h + 0.25


class _Kind(enum.Enum):
    A = 1
    B = 2


class _Str(str):
    """A flag that is equal to, and hashes as, the `str` it holds."""


class _Block(torch.nn.Module):
    K = 1.0   # read as type(self).K

    def __init__(self):
        super().__init__()
        self.lin, self.bn = torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6)
        self.cfg = {"scale": 1.0, "on": True}
        self.steps = [1.0, 2.0]
        self.ns = types.SimpleNamespace(shift=0.5)
        self.act = torch.sigmoid
        self.leaky = functools.partial(F.leaky_relu, negative_slope=0.1)
        self.flag, self.eps = True, 1e-3
        self.kind, self.temperature = _Kind.A, np.float32(1.0)
        self.by_kind = {_Kind.A: 1.0, _Kind.B: 2.0}
        self.nested = {"inner": {"t": 1.0}, "rows": [[1.0], [2.0, 3.0]]}
        self.register_buffer("gain", None)   # optional, set later
        self.flags = {"boost"}
        self.fns = {"clip": torch.tanh}

    def forward(self, x):
        h = F.hardtanh(self.bn(self.lin(x)), -50.0, 50.0) + self.fns["clip"](x) * 0.5
        if self.gain is not None:
            h = h * self.gain
        if self.flag and self.cfg["on"]:
            h = self.act(h)
        h = self.leaky(h) * self.cfg["scale"] + self.steps[1] * self.ns.shift * type(self).K
        if self.kind is _Kind.B:
            h = h * 2.0
        if "boost" in self.flags:
            h = h * 1.5
        for row in self.nested["rows"]:
            h = h * sum(row) * self.nested["inner"]["t"]
        return _shift(h) * self.temperature * self.by_kind[_Kind.A] + self.eps


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.head = torch.nn.Linear(6, 6)
        self.head.weight = self.blocks[0].lin.weight   # tied
        self.act = torch.nn.LeakyReLU(0.2)
        self.act_again = self.act   # one module at two paths

    def forward(self, x):
        for block in self.blocks:
            x = self.act_again(block(self.act(x)))
        return (self.head(x) * FACTOR * SETTINGS["scale"]).square().mean()


_BLOCK_FORWARD, _BLOCK_FORWARD_CODE = _Block.forward, _Block.forward.__code__


def _other_block_forward(self, x):
    return self.bn(self.lin(x))


_HARDTANH = F.hardtanh


def _wide_hardtanh(h, low=-1.0, high=1.0, inplace=False):
    """What a kernel-patching library puts in `F.hardtanh`'s place."""
    return _HARDTANH(h, low * 2, high * 2, inplace)


def _set_global(name, value):
    globals()[name] = value


def _changes(m: _Net) -> dict:
    """Changes between steps, by name: those that change nothing the graph computes with
    (an equal value, a key the forward never reads) next to those that do."""
    b0, b1 = m.blocks[0], m.blocks[-1]
    return {
        "nothing": lambda: None,
        "flag to an equal value": lambda: setattr(b0, "flag", True),
        "flag off": lambda: setattr(b0, "flag", False),
        "eps equal, a new float": lambda: setattr(b0, "eps", float("1e-3")),
        "eps changed": lambda: setattr(b1, "eps", 2e-3),
        "eps as an int": lambda: setattr(b1, "eps", 0),
        "eps removed": lambda: b1.__dict__.pop("eps", None),
        "enum changed": lambda: setattr(b0, "kind", _Kind.B),
        "enum set again": lambda: setattr(b1, "kind", _Kind.A),
        "enum class defined again": lambda: _set_global(
            "_Kind", enum.Enum("_Kind", {"A": 1, "B": 2}, module=__name__, qualname="_Kind")),
        "numpy scalar equal, a new object": lambda: setattr(b0, "temperature", np.float32(1.0)),
        "numpy scalar changed": lambda: setattr(b1, "temperature", np.float32(0.5)),
        "numpy scalar to an equal float": lambda: setattr(b1, "temperature", 1.0),
        "item of an enum key changed": lambda: b0.by_kind.__setitem__(_Kind.A, 4.0),
        "item of another enum key changed": lambda: b1.by_kind.__setitem__(_Kind.B, 4.0),
        "set equal, a new set": lambda: setattr(b0, "flags", {"boost"}),
        "set emptied": lambda: b0.flags.clear(),
        "set grown": lambda: b1.flags.add("other"),
        "set to an equal frozenset": lambda: setattr(b1, "flags", frozenset({"boost"})),
        "set holding a str subclass": lambda: setattr(b0, "flags", {_Str("boost")}),
        "buffer made non-persistent": lambda: b0.bn._non_persistent_buffers_set.add("running_mean"),
        "dict item changed": lambda: b0.cfg.__setitem__("scale", 3.0),
        "dict item removed": lambda: b1.cfg.pop("on", None),
        "dict key added": lambda: b1.cfg.__setitem__("unread", 1),
        "dict re-ordered": lambda: b0.cfg.__setitem__("scale", b0.cfg.pop("scale")),
        "nested dict re-ordered": lambda: b1.nested.__setitem__("inner", b1.nested.pop("inner")),
        "dict replaced by a list": lambda: setattr(b0, "cfg", [1.0, 2.0]),
        "list item changed": lambda: b0.steps.__setitem__(1, 5.0),
        "list appended to": lambda: b1.steps.append(7.0),
        "nested item changed": lambda: b0.nested["inner"].__setitem__("t", 2.0),
        "nested item set equal": lambda: b1.nested["inner"].__setitem__("t", 1.0),
        "nested row appended to": lambda: b1.nested["rows"][0].append(1.0),
        "nested row added": lambda: b0.nested["rows"].append([0.5]),
        "nested key added": lambda: b1.nested["inner"].__setitem__("u", 0.0),
        "nested dict replaced by a list": lambda: b0.nested.__setitem__("inner", [1.0]),
        "list shortened": lambda: b1.steps[1:] and b1.steps.pop(),
        "namespace attribute": lambda: setattr(b1.ns, "shift", 0.75),
        "activation swapped": lambda: setattr(b0, "act", torch.tanh),
        "function of a dict swapped": lambda: b1.fns.__setitem__("clip", torch.sigmoid),
        "function of a dict set again": lambda: b0.fns.__setitem__("clip", torch.tanh),
        "function of an imported module rebound": lambda: setattr(F, "hardtanh", _wide_hardtanh),
        "activation set again": lambda: setattr(b0, "act", torch.sigmoid),
        "partial keyword": lambda: b1.leaky.keywords.__setitem__("negative_slope", 0.3),
        "forward on the instance": lambda: setattr(b1, "forward", lambda x: x),
        "forward of the class replaced": lambda: setattr(_Block, "forward", _other_block_forward),
        "forward of the class replaced by itself": lambda: setattr(_Block, "forward", _BLOCK_FORWARD),
        "forward of the class patched": lambda: setattr(_Block.forward, "__code__",
                                                        _other_block_forward.__code__),
        "class attribute": lambda: setattr(_Block, "K", 2.0),
        "global number": lambda: _set_global("FACTOR", 3.0),
        "global dict item": lambda: SETTINGS.__setitem__("scale", 0.5),
        "global function": lambda: _set_global("_shift", lambda h: h - 0.25),
        "submodule of another class": lambda: setattr(b1, "bn", torch.nn.LayerNorm(6)),
        "submodule of the same class": lambda: setattr(b1, "bn", torch.nn.BatchNorm1d(6)),
        "parameter replaced": lambda: setattr(b1.lin, "weight", torch.nn.Parameter(torch.randn(6, 6))),
        "tie broken": lambda: setattr(m.head, "weight", torch.nn.Parameter(torch.randn(6, 6))),
        "parameters tied": lambda: setattr(b1.lin, "bias", b0.lin.bias),
        "buffers tied": lambda: setattr(b1.bn, "running_mean", b0.bn.running_mean),
        "buffers tied within a module": lambda: setattr(b0.bn, "running_var", b0.bn.running_mean),
        "parameter resized through .data": lambda: setattr(b1.lin.bias, "data", torch.randn(1)),
        "parameter transposed through .data": lambda: setattr(
            b1.lin.weight, "data", torch.randn(6, 6).t()),
        "parameter converted through .data": lambda: setattr(
            b0.lin.bias, "data", b0.lin.bias.data.double()),
        "parameter frozen": lambda: b1.lin.bias.requires_grad_(False),
        "parameter unfrozen": lambda: b1.lin.bias.requires_grad_(True),
        "buffer replaced": lambda: setattr(b0.bn, "running_var", torch.ones(6)),
        "buffer converted": lambda: setattr(b0.bn, "running_mean", torch.zeros(6, dtype=torch.float64)),
        "buffer written in place": lambda: b0.bn.running_mean.add_(1.0),
        "optional buffer set": lambda: setattr(b0, "gain", torch.full((6,), 2.0)),
        "optional buffer set to None again": lambda: setattr(b0, "gain", None),
        "hook added": lambda: b0.lin.register_forward_hook(lambda *a: None),
        "block appended": lambda: m.blocks.append(_Block()),
        "last block removed": lambda: len(m.blocks) > 2 and m.blocks.__delitem__(-1),
        "submodule added": lambda: setattr(b1, "extra", torch.nn.Linear(6, 6)),
        "submodules re-ordered": lambda: b0._modules.__setitem__("lin", b0._modules.pop("lin")),
        "parameters re-ordered": lambda: b1.lin._parameters.__setitem__("weight", b1.lin._parameters.pop("weight")),
        "parameter registered": lambda: b0.lin.register_parameter("extra", torch.nn.Parameter(torch.ones(1))),
        "buffer registered": lambda: b1.bn.register_buffer("extra", torch.ones(1)),
        "shared module's slope": lambda: setattr(m.act, "negative_slope", 0.3),
        "second path of a shared module replaced": lambda: setattr(m, "act_again", torch.nn.LeakyReLU(0.2)),
        "shared module replaced at both paths": lambda: (setattr(m, "act", torch.nn.LeakyReLU(0.2)),
                                                         setattr(m, "act_again", m.act)),
    }


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(5, 6)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    return model, x, scheduled.graph, scheduled.schedule


def _full_checks(plan, model, x):
    """The model's tensors by slot where every check a call makes passes (those of a call
    without a planner, and `model_difference`, which a planner compares), else None."""
    modules = _Submodules(model)
    try:
        plan.check_hooks(model)
        plan.check_modules(modules)
        if plan.tied_difference(modules) is not None:
            return None
        plan.check_attributes(modules)
        if plan.model_difference(modules) is not None:
            return None
        leaves = plan.flat_inputs((x,), {})
        return plan.resident(model, leaves, x.device, modules)
    except RuntimeInputError:
        return None


@pytest.mark.parametrize("name", sorted(_changes(_Net())))
def test_each_change_alone_passes_the_guard_only_where_the_full_checks_pass(lowered, name):
    _guard_against_full_checks(lowered, [name])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(sorted(_changes(_Net()))), min_size=2, max_size=5))
def test_the_guard_passes_only_models_the_full_checks_pass_with_their_tensors(lowered, names):
    _guard_against_full_checks(lowered, names)


def _guard_against_full_checks(lowered, names):
    """Apply the changes `names` in turn to a copy of the lowered model, comparing the
    guard with the full checks after each."""
    original, x, graph, schedule = lowered
    saved = (FACTOR, dict(SETTINGS), _shift, _Block.K, _Kind)
    model = copy.deepcopy(original)
    plan = next(iter(ScheduledModule(model, graph, schedule)._plans.values()))
    try:
        first = _full_checks(plan, model, x)
        assert first is not None
        plan.guard.passed(first, x.device)
        for name in names:
            try:   # a change that does not apply after an earlier one (an item of a
                _changes(model)[name]()   # dict replaced by a list) leaves the model as is
            except (TypeError, AttributeError, KeyError, IndexError):
                pass
            fast, full = plan.guard.model_tensors(model), _full_checks(plan, model, x)
            if fast is not None:
                assert full is not None, f"the guard passed a model the checks refuse after {names}"
                slots = [i for i, (kind, _) in enumerate(plan.bindings) if kind in ("param", "buffer")]
                assert all(fast[i] is full[i] for i in slots)
            if full is not None:   # a call passed: the guard is armed again, and passes
                plan.guard.passed(full, x.device)
                assert plan.guard.model_tensors(model) is not None, f"after {names}"
    finally:
        globals().update(FACTOR=saved[0], _shift=saved[2], _Kind=saved[4])
        F.hardtanh = _HARDTANH
        SETTINGS.clear()
        SETTINGS.update(saved[1])
        _Block.K = saved[3]
        _Block.forward = _BLOCK_FORWARD
        _BLOCK_FORWARD.__code__ = _BLOCK_FORWARD_CODE


def test_the_guard_reads_every_kind_of_recorded_value(lowered):
    """The model above records each kind of read the guard writes a test for, and an
    unchanged model passes it: a guard that never passed would make the search above
    pass without testing anything."""
    model, x, graph, schedule = lowered
    plan = next(iter(ScheduledModule(model, graph, schedule)._plans.values()))
    reads = plan.traced_reads
    assert reads.modules and reads.containers and reads.objects and reads.callables and reads.globals
    assert plan.tied["param"] and plan.module_aliases and any(kind == "buffer" for kind, _ in plan.bindings)
    assert ("act", "negative_slope") in {row[:2] for row in reads.modules}   # read through export's proxy
    assert {type(items[0][0]) for _, _, items in reads.containers} == {str, int, dict}   # dict: an enum key
    assert {where[0] for _, _, where, _ in reads.globals if where} >= {"function", "item", "attr function"}
    assert plan.guard.model_tensors(model) is None   # not armed before a call passed
    plan.guard.passed(_full_checks(plan, model, x), x.device)
    assert plan.guard.model_tensors(model) is not None


def test_a_training_call_takes_the_guard_and_trains_as_eager(lowered):
    """Calls after the first run through the guard (the full checks are not made again),
    with eager's gradients bitwise; a change between calls is still planned for."""
    original, x, graph, schedule = lowered
    model = copy.deepcopy(original)
    eager = copy.deepcopy(original)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    plan = next(iter(scheduled._plans.values()))
    full, step = [], 0
    checks = plan.model_difference
    plan.model_difference = lambda modules: full.append(step) or checks(modules)
    for step in range(3):
        if step == 2:
            model.blocks[0].cfg["scale"] = eager.blocks[0].cfg["scale"] = 0.5
        scheduled(x).backward()
        eager(x).backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), (step, name)
    # The first call armed the guard, the second took it, the third found the change.
    assert full == [0, 2]
    assert len(scheduled.plans) == 2


class _LookAlikeNames(torch.nn.Module):
    """Attributes named "\ufb01" (one letter) and "fi": Python reads `m.\ufb01` written in
    code as `m.fi` (names are NFKC-normalized), so a generated `m.<name>` read the other one."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        setattr(self, "\ufb01", 2.0)
        self.fi = 1.0

    def forward(self, x):
        return (self.lin(x) * getattr(self, "\ufb01") * self.fi).sum()


def test_the_guard_reads_a_non_ascii_attribute_by_its_own_name():
    model, x = _LookAlikeNames(), torch.randn(3, 4)
    scheduled = remat_ir.remat(model, (x,), cost_model="flops", solver="recompute-all")
    plan = next(iter(scheduled._plans.values()))
    scheduled(x).backward()
    assert plan.guard.model_tensors(model) is not None
    setattr(model, "\ufb01", 5.0)
    assert plan.guard.model_tensors(model) is None
    assert _full_checks(plan, model, x) is None


def _as(kind, tensor: torch.Tensor, grad: bool) -> torch.Tensor:
    """`tensor` as a `kind` (Parameter or plain tensor) requiring a gradient or not."""
    grad = grad and tensor.is_floating_point()
    if kind is torch.nn.Parameter:
        return torch.nn.Parameter(tensor, requires_grad=grad)
    return tensor.requires_grad_(grad)


#: Changes to a tensor between calls, each keeping what its name does not say it changes.
_TENSOR_CHANGES = {
    "none": lambda t: t,
    "same properties, another tensor": lambda t: _as(type(t), t.detach().clone(), t.requires_grad),
    "resized": lambda t: _as(type(t), torch.randn(3), t.requires_grad),
    "transposed": lambda t: _as(type(t), torch.randn(t.shape[::-1]).t(), t.requires_grad)
    if t.dim() == 2 else t,
    "converted": lambda t: _as(type(t), t.detach().double(), t.requires_grad),
    "frozen or unfrozen": lambda t: _as(type(t), t.detach().clone(), not t.requires_grad),
    "other class": lambda t: _as(torch.Tensor if type(t) is torch.nn.Parameter else torch.nn.Parameter,
                                 t.detach().clone(), t.requires_grad),
    "not a tensor": lambda t: 1.0,
}


def _changes_something(before, after) -> bool:
    return not (isinstance(after, torch.Tensor) and type(after) is type(before) and after.shape == before.shape
                and after.dtype == before.dtype and after.stride() == before.stride()
                and after.requires_grad == before.requires_grad and after.device == before.device)


@settings(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.sampled_from(sorted(_TENSOR_CHANGES)), st.integers(0, 3)),
                        min_size=1, max_size=4),
       compiled=st.booleans())
@example(changes=[("transposed", 1)], compiled=True)
@example(changes=[("resized", 2)], compiled=True)
def test_the_tensor_check_passes_exactly_the_tensors_of_the_same_class_and_properties(changes, compiled):
    """`call_guard.same_tensors`, Dynamo's C++ `TensorGuards` or the Python comparisons
    where torch has none: it passes a list of tensors exactly where each has the class,
    shape, dtype, strides, `requires_grad` and device it had."""
    import torch._C._dynamo.guards as guards
    from remat_ir.runtimes import call_guard

    with pytest.MonkeyPatch.context() as patch:
        if not compiled:   # as in a torch without TensorGuards
            patch.delattr(guards, "TensorGuards")
        _check_tensor_changes(call_guard.same_tensors, changes)


def _check_tensor_changes(same_tensors, changes):
    tensors = [torch.nn.Parameter(torch.randn(4, 6)), torch.randn(4, 6), torch.nn.Parameter(torch.randn(6)),
               torch.zeros(3, dtype=torch.int64)]
    same = same_tensors(tensors)
    assert same(list(tensors))
    tied = tensors + [tensors[0]]   # one tensor at two positions (tied weights) passes too
    assert same_tensors(tied)(list(tied))
    now = list(tensors)
    for change, slot in changes:
        if isinstance(now[slot], torch.Tensor):
            now[slot] = _TENSOR_CHANGES[change](now[slot])
    expected = not any(_changes_something(a, b) for a, b in zip(tensors, now))
    try:
        passed = same(now)
    except Exception:   # `model_tensors` takes a raise as a failed test
        passed = False
    assert passed == expected, (changes, passed)
