"""One straight-line check, generated per plan, of what every training call checks of the
model: its submodules' classes, parameter ties, the plain values and functions its
forward read while traced (`traced_reads.py`), and the parameters and buffers a step
binds (looked up afresh, with the shape, dtype, layout, device and `requires_grad` they
had when a call last passed the full checks).

Why: the full checks walk rows of metadata with a Python call per row. On the quick
ResNet (292 nodes, 178 bound tensors, about 550 recorded reads) they took about 0.5 ms of
a 14 ms CPU step, most of remat-ir's store-everything overhead over eager (x1.10); the
same checks written out as one function, with the rows' constants bound as its globals,
cost a fraction. A guard is only a fast "nothing changed": where any of its tests fails
(or raises) the call takes the full checks, which say what changed; a call that passes
them arms the guard again with the tensors' properties then. So every test here must
imply its full check's (never the reverse): each is the full check's own expression,
or stricter.

The model's hooks are compared first (`HookWatch`, already cheap). Not covered, and
checked at every call as before: the tensors the model holds outside parameters and
buffers, the call's inputs, and models sharded by FSDP2."""

from __future__ import annotations

import ast
import keyword

import torch

from remat_ir.torchlib.described_values import DESCRIBED, described
from remat_ir.torchlib.namespaces import namespace

from .traced_reads import (_ANY_OF, _MISSING, TracedReads, _is_length, _is_order, _same, _unchanged,
                           bits_matter, global_part, items_same)


def _attribute(expression: str, name: str, lowered=None) -> str:
    """`expression.name` where `name` is written so, else getattr (same lookup); with a
    default where the value recorded (`lowered`) is, or may be, that it was missing."""
    if _may_be_missing(lowered):
        return f"getattr({expression}, {name!r}, M)"
    # ASCII only: Python reads names written in code NFKC-normalized, so `m.\ufb01` (one
    # letter) would read `m.fi`, another attribute (found by a review: the guard passed a
    # changed value, 18.886 against eager's 11.216).
    if name.isascii() and name.isidentifier() and not keyword.iskeyword(name) \
            and not name.startswith("__"):
        return f"{expression}.{name}"
    return f"getattr({expression}, {name!r})"


def _may_be_missing(lowered) -> bool:
    if isinstance(lowered, dict):
        return any(_may_be_missing(value) for value in lowered.get(_ANY_OF, ()))
    return isinstance(lowered, str) and lowered == _MISSING


class _Source:
    """The generated function's lines and the constants it reads as globals."""

    def __init__(self):
        self.lines: list[str] = []
        self.names: dict[str, object] = {"M": _MISSING, "SAME": _same, "UNCHANGED": _unchanged,
                                         "NAMESPACE": namespace}
        self.modules: dict[str, str] = {"": "root"}   # path -> local name

    def constant(self, value) -> str:
        name = f"k{len(self.names)}"
        self.names[name] = value
        return name

    def line(self, text: str, depth: int = 2) -> None:
        self.lines.append("    " * depth + text)

    def module(self, path: str) -> str:
        """The local naming the submodule at `path`, looked up as `_Submodules.at` does
        (through `_modules`; a missing one raises, and the full checks run)."""
        if path not in self.modules:
            parent, _, name = path.rpartition(".")
            above = self.module(parent)
            local = f"m{len(self.modules)}"
            self.line(f"{local} = {above}._modules[{name!r}]")
            self.modules[path] = local
        return self.modules[path]

    def same(self, value: str, lowered, depth: int = 2) -> None:
        """Fail unless `value` is `lowered` by `traced_reads._same` (the type first, so
        that `!=` compares values of the recorded type only)."""
        strings = _set_of_strings(lowered)
        if strings is not None:
            # Equal sets whose items are all `str` are described alike, and no other value
            # is described as a set. `_non_persistent_buffers_set`, which every module's
            # forward reads, was half of the quick ResNet's guard through `described`.
            kind, items = strings
            if not items:
                self.line(f"if type({value}) is not {kind.__name__} or {value}: return None", depth)
            else:
                self.line(f"if type({value}) is not {kind.__name__} or {value} != {self.constant(items)} or "
                          f"not all(type(x) is str for x in {value}): return None", depth)
        elif isinstance(lowered, dict) or bits_matter(lowered):   # one of several values; -0.0, NaN
            self.line(f"if not SAME({value}, {self.constant(lowered)}): return None", depth)
        else:
            self.line(f"if type({value}) is not {self.constant(type(lowered))} or "
                      f"{value} != {self.constant(lowered)}: return None", depth)


def _set_of_strings(lowered) -> tuple[type, frozenset] | None:
    """(set or frozenset, its items) where `lowered` records such a set of `str` items by
    its description (`described`), else None; read back from the text and kept only where
    describing it again gives the very text."""
    if not (isinstance(lowered, dict) and set(lowered) == {DESCRIBED} and isinstance(lowered[DESCRIBED], str)):
        return None
    text = lowered[DESCRIBED]
    for kind in (set, frozenset):
        head = f"{kind.__qualname__}({{"
        if text.startswith(head) and text.endswith("})"):
            inside = text[len(head) - 1:-1]
            try:
                items = ast.literal_eval(inside) if inside != "{}" else set()
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
            if not isinstance(items, set) or not all(type(item) is str for item in items):
                return None
            if described(kind(items)) != text:
                return None
            return kind, frozenset(items)
    return None


def _callables(src: _Source, reads: TracedReads, kinds: dict[str, type]) -> None:
    """The functions the modules hold or run (`TracedReads.callables`, mostly each module's
    `forward`), as `plain_changed` compares them: each module's own entry, and, where it
    holds none, its class's attribute. A class's function is looked up and compared with
    its snapshot once for all the modules of that class (`kinds`: each module's class,
    which the guard checked first): one lookup and comparison per module took about half
    of the quick ResNet's guard (154 forwards of 15 classes, 0.1 ms a call)."""
    groups: dict[tuple, str] = {}   # (class, name) -> the local holding its attribute
    for path, name, _ in reads.callables:
        kind = kinds.get(path)
        if kind is not None and (kind, name) not in groups:
            local = groups[(kind, name)] = f"g{len(groups)}"
            src.line(f"{local} = getattr({src.constant(kind)}, {name!r}, None)")
            src.line(f"u{local} = None")   # a snapshot of it, from a module that holds none
    for index, (path, name, _) in enumerate(reads.callables):
        module = src.module(path)
        src.line(f"s = FUNCTIONS.get({index})")
        src.line(f"if s is None or s[0] is not {module} or {module}.__dict__.get({name!r}, M) is not s[1]: "
                 f"return None")
        local = groups.get((kinds.get(path), name))
        src.line("if s[1] is M:")
        if local is None:
            src.line(f"if getattr(type({module}), {name!r}, None) is not s[2] or not UNCHANGED(s[2], s[3]): "
                     f"return None", 3)
        else:
            src.line(f"if s[2] is not {local}: return None", 3)
            src.line(f"u{local} = s[3]", 3)
        src.line("elif not UNCHANGED(s[1], s[3]): return None")
    for local in groups.values():
        src.line(f"if u{local} is not None and not UNCHANGED({local}, u{local}): return None")


def _plain_reads(src: _Source, reads: TracedReads, kinds: dict[str, type]) -> None:
    """`TracedReads.plain_changed`'s rows, in its order, as tests."""
    for path, name, lowered in reads.modules:
        src.line(f"v = {_attribute(src.module(path), name, lowered)}")
        src.same("v", lowered)
    for path, name, items in reads.containers:
        if not items:
            continue
        owner = src.module(path)
        for part in name.split("."):
            owner = _attribute(owner, part)
        src.line(f"c = {owner}")
        if any(isinstance(key, dict) and not (_is_length(key) or _is_order(key)) for key, _ in items):
            src.line(f"if not ITEMS_SAME(c, {src.constant(items)}): return None")   # keys by
            continue                                                                # description: rare
        length = [lowered for key, lowered in items if _is_length(key)]
        order = [lowered for key, lowered in items if _is_order(key)]
        items = [(key, lowered) for key, lowered in items if not (_is_length(key) or _is_order(key))]
        src.line("if type(c) is dict:")
        for n in length:
            src.line(f"if len(c) != {n}: return None", 3)
        for keys in order:   # a dict iterated follows its keys' order (strings, integers)
            src.line(f"if not SAME(list(c), {src.constant(keys)}): return None", 3)
        for key, lowered in items:
            src.line(f"v = c.get({src.constant(key)}, M)", 3)
            src.same("v", lowered, 3)
        indices = all(type(key) is int and key >= 0 for key, _ in items) and not order
        if indices:
            src.line("elif type(c) is list or type(c) is tuple:")
            for n in length:
                src.line(f"if len(c) != {n}: return None", 3)
            for key, lowered in items:
                src.line(f"v = c[{key}] if {key} < len(c) else M", 3)
                src.same("v", lowered, 3)
        src.line("else: return None")
    _callables(src, reads, kinds)
    for path, holder, name, lowered in reads.objects:
        owner = src.module(path)
        for part in holder.split("."):
            owner = _attribute(owner, part)
        src.line(f"v = {_attribute(owner, name, lowered)}")
        src.same("v", lowered)
    for index, (module_name, name, where, lowered) in enumerate(reads.globals):
        src.line(f"g = NAMESPACE({module_name!r})")
        src.line("if g is not None:")   # not imported in this process: not compared
        src.line(f"v = g.get({name!r}, M)", 3)
        if where is None:
            src.same("v", lowered, 3)
        elif where[0] == "function":
            src.line(f"s = GLOBAL_FUNCTIONS.get({index})", 3)
            src.line("if s is None or s[0] is not v or not UNCHANGED(v, s[1]): return None", 3)
        elif where[0] == "attr function":   # `F.gelu`: the function the full check last took
            src.line(f"a = ROW_PART(v, {src.constant(('attr', where[1]))})", 3)
            src.line(f"s = GLOBAL_FUNCTIONS.get({index})", 3)
            src.line("if s is None or s[0] is not a or not UNCHANGED(a, s[1]): return None", 3)
        else:   # an item, an attribute or an attribute's item: rare, the full check's reads
            src.line(f"if not ROW_SAME(v, {src.constant(tuple(where))}, {src.constant(lowered)}): "
                     f"return None", 3)


def _global_row_same(value, where: tuple, lowered) -> bool:
    """A global's item or attribute (or an attribute's item) is `lowered`, read as
    `TracedReads.plain_changed` reads it."""
    return _same(global_part(value, where), lowered)


class CallGuard:
    """The generated check of one plan (`_Lowered`). `model_tensors(model)`: the model's
    tensor per resident slot (None for the call's inputs and constants) where the model
    is as a call last found it through the full checks, else None; `passed(resident,
    device)` arms it after a call passed them (generating the check at the
    first: plans made only to be profiled never pay for it); `device`: that call's."""

    def __init__(self, hooks, module_types, module_members, module_aliases, tied, bindings,
                 reads: TracedReads):
        self._hooks = hooks
        self._rows = (module_types, module_members, module_aliases, tied, bindings, reads)
        self._find = None
        self._slots = [slot for slot, (kind, _) in enumerate(bindings) if kind in ("param", "buffer")]
        #: Whether the model's tensors (by `_slots`) are as at the last full check; None
        #: until a call passed.
        self._same_tensors = None
        self.device: torch.device | None = None

    def model_tensors(self, model: torch.nn.Module) -> tuple | None:
        """The model's tensors by resident slot where nothing the full checks look at
        changed since a call passed them, else None."""
        if self._same_tensors is None or self._hooks.changed(model) is not None:
            return None
        found = self._find(model)
        if found is None:
            return None
        try:
            same = self._same_tensors([found[slot] for slot in self._slots])
        except Exception:   # not tensors: the full checks say what they are
            return None
        return found if same else None

    def passed(self, resident: tuple, device: torch.device) -> None:
        """Arm the guard with the tensors of a call that passed the full checks."""
        if self._find is None:
            self._find = _generate(*self._rows)
        self.device = device
        self._same_tensors = same_tensors([resident[slot] for slot in self._slots])


def same_tensors(tensors: list):
    """A test of a list of tensors: each of the class (a Parameter or a plain tensor),
    shape, dtype, strides, `requires_grad` and device of `tensors`' (or stricter).

    Dynamo's `TensorGuards` compares them in C++ (with the dispatch keys, which follow
    from those: stricter): on 176 tensors about 11 us where the same comparisons in
    Python took about 120 us, most of what was left of the guard's 0.3 ms per call of the
    quick ResNet (x1.04 of eager's step). The Python comparisons where torch has none."""
    if not all(type(t) is torch.nn.Parameter or type(t) is torch.Tensor for t in tensors):
        return lambda now: False   # another class (FSDP's, a subclass): the full checks
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        TensorGuards = None
    if TensorGuards is not None:
        # Each tensor once (`TensorGuards` fails a tensor given twice: tied weights); a
        # later position of one must hold the very tensor its first does.
        first = _aliasing(tensors)
        distinct = [i for i, j in enumerate(first) if i == j]
        again = [(i, j) for i, j in enumerate(first) if i != j]
        guards = TensorGuards(*(tensors[i] for i in distinct),
                              dynamic_dims_sizes=[list(tensors[i].shape) for i in distinct],
                              dynamic_dims_strides=[list(tensors[i].stride()) for i in distinct])
        if not again:
            return lambda now: guards.check(*now)
        return lambda now: guards.check(*[now[i] for i in distinct]) and all(now[i] is now[j] for i, j in again)
    properties = [(type(t), t.shape, t.dtype, t.stride(), t.requires_grad, t.device) for t in tensors]
    aliasing = _aliasing(tensors)

    def same(now: list) -> bool:
        for t, (kind, shape, dtype, strides, grad, where) in zip(now, properties):
            if type(t) is not kind or t.shape != shape or t.dtype is not dtype \
                    or t.requires_grad is not grad or t.stride() != strides or t.device != where:
                return False
        return _aliasing(now) == aliasing   # the same tensors one (tied), the others apart
    return same


def _aliasing(tensors: list) -> list[int]:
    """Per position, the first position holding the same tensor."""
    first: dict[int, int] = {}
    return [first.setdefault(id(t), i) for i, t in enumerate(tensors)]


def _generate(module_types, module_members, module_aliases, tied, bindings, reads: TracedReads):
    """The function `model_tensors(root)` of a plan's rows."""
    src = _Source()
    src.names.update(FUNCTIONS=reads._functions, GLOBAL_FUNCTIONS=reads._global_functions,
                     ROW_SAME=_global_row_same, ROW_PART=global_part, ITEMS_SAME=items_same)
    for path, kind in module_types:
        src.line(f"if type({src.module(path)}) is not {src.constant(kind)}: return None")
    for path, modules, parameters, buffers, nones in module_members:   # none added since
        m = src.module(path)
        # Two or more: their names in order (a ModuleDict re-ordered runs its items in
        # the new order in eager, the traced one in the graph: hunt83 F1); else the count.
        src.line("if " + " or ".join(
            f"tuple({m}.{table}) != {names!r}" if len(names) > 1 else f"len({m}.{table}) != {len(names)}"
            for table, names in (("_modules", modules), ("_parameters", parameters), ("_buffers", buffers)))
            + ": return None")
        for table, name in sorted(nones):   # still None (one set to None fails at its binding
            src.line(f"if {m}.{table}[{name!r}] is not None: return None")   # or class)
    for paths in module_aliases:   # one module at each of the paths, as at lowering
        src.line(f"if not ({' is '.join(src.module(path) for path in paths)}): return None")
    for table, group in tied:   # one tensor for every name of the group, as at lowering
        looked = [f"{src.module(name.rpartition('.')[0])}.{table}[{name.rpartition('.')[2]!r}]"
                  for name in group]
        src.line(f"if not ({' is '.join(looked)}): return None")
    _plain_reads(src, reads, dict(module_types))
    slots = []
    for slot, (kind, what) in enumerate(bindings):
        if kind in ("param", "buffer"):
            path, _, name = what.rpartition(".")
            table = "_parameters" if kind == "param" else "_buffers"
            src.line(f"t{slot} = {src.module(path)}.{table}[{name!r}]")
            slots.append(f"t{slot}")
        else:
            slots.append("None")
    body = "\n".join(src.lines) or "        pass"
    code = (f"def model_tensors(root):\n    try:\n{body}\n"
            f"    except Exception:\n        return None\n"
            f"    return ({', '.join(slots)}{',' if len(slots) == 1 else ''})\n")
    exec(compile(code, "<remat-ir call guard>", "exec"), src.names)
    return src.names["model_tensors"]
