"""Branches on tensor values that only raise, traced as checks on values.

Why: a forward may guard its computation with a branch on tensor data whose one side
raises: PyTorch's `F.gaussian_nll_loss` (`elif torch.any(var < 0): raise ValueError(...)`,
which no argument turns off), a model's NaN guard (`if torch.isnan(loss): raise
RuntimeError(...)`), an `assert (probs >= 0).all()`. A trace cannot take a branch on
values, and the tensor read there comes from the model's parameters, so no call's inputs
decide it either (`input_branches.py`): lowering refused such models. Eager takes the
raising side only on bad data; the other side is the computation.

So while tracing, where the code reading a tensor's truth is an `if` whose body is one
`raise` (an `elif` too), or an `assert`, and the tensor is its whole test (or `not` of it),
the read is answered with the computing side, and the condition is traced as a
`remat_ir.value_check` (`torchlib/value_checks.py`) that raises the same built-in
exception at every step: with eager's message where the statement gives it as a literal,
else naming where the check is and the statement eager runs there. The read must be the jump of the `if` or `assert` itself
(not `bool(t)` passed on, nor one operand of `a or b`). Anything else (a branch that computes on both sides, a test
combining the tensor with other values, an exception class of the user's) is left to
the refusals.

Raised by the check, the exception comes where the schedule runs the check, in the
forward: before any gradient is written, but possibly after ops eager had not reached
(their draws and buffer updates included), which only a failing step sees.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import linecache
import os
import sys

import torch

#: Files of remat-ir between a truth read and the code that reads it.
_OURS = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
              for name in ("input_branches.py", "raising_checks.py", "value_dependent.py"))
#: Tests whose truth Python reads once, as a whole: a call, an attribute, a name, an item,
#: one comparison (`a < b < c` reads the truth of `a < b` first).
_WHOLE = (ast.Call, ast.Attribute, ast.Name, ast.Subscript, ast.Compare)


def raising_branch(tensor: torch.Tensor, called: bool = False) -> bool | None:
    """The truth that keeps the code reading `tensor`'s truth from raising, with the
    condition traced as a check raising what it would have raised; None where that code
    is not such a guard. `called`: the truth is read by a call (`t.item()`, ProphetNet's
    `assert torch.all(ids >= 0).item()`), whose result the jump takes next."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _OURS:
        frame = frame.f_back
    if frame is None or not _jumps(frame, called):
        return None
    file = frame.f_code.co_filename
    linecache.checkcache(file)
    source = "".join(linecache.getlines(file))
    guard = _guard(source, frame.f_lineno)
    if guard is None:
        return None
    computing, error, message, statement = guard
    if message is None:   # eager's own message where the statement gives it whole
        message = (f"{frame.f_code.co_name}'s check on tensor values at {file}:{frame.f_lineno} "
                   f"failed, where eager runs `{statement}`")
    condition = tensor if computing else torch.logical_not(tensor)
    torch.ops.remat_ir.value_check(condition, message, error)
    return computing


def empty_mask_branch(tensor: torch.Tensor) -> bool | None:
    """True where the code reading `tensor`'s truth is `if mask.any():` (or
    `torch.any(mask)`) whose body, with no `else`, only writes a constant through that
    same boolean mask (`logits[mask] = float("-inf")`): taken with a mask of no True
    element, the write changes nothing, values nor gradients, so the branch is traced as
    taken. None for any other code. Why: transformers' `Wav2Vec2ForPreTraining` guards
    its contrastive loss so (`if neg_is_pos.any(): logits[1:][neg_is_pos] =
    float("-inf")`), which no argument turns off, and lowering refused it (hunt49 #7)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _OURS:
        frame = frame.f_back
    if frame is None or not _jumps(frame):
        return None
    file = frame.f_code.co_filename
    linecache.checkcache(file)
    tree = _tree("".join(linecache.getlines(file)))
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.test.lineno <= frame.f_lineno <= (node.test.end_lineno or 0):
            mask = _any_of(node.test)
            # A boolean mask only: an integer one indexes (`h[idx] = 0.0` with idx all
            # zero writes row 0 where eager, not taking the branch, writes nothing; hunt53).
            held = frame.f_locals.get(mask) if mask is not None else None
            return True if isinstance(held, torch.Tensor) and held.dtype == torch.bool and not node.orelse \
                and all(_constant_write(statement, mask) for statement in node.body) else None
    return None


def _any_of(test: ast.expr) -> str | None:
    """The name `test` asks whether any element of is True: `m.any()`, `torch.any(m)`."""
    if not isinstance(test, ast.Call) or test.keywords or not isinstance(test.func, ast.Attribute) \
            or test.func.attr != "any":
        return None
    if not test.args and isinstance(test.func.value, ast.Name):
        return test.func.value.id
    if len(test.args) == 1 and isinstance(test.args[0], ast.Name) and isinstance(test.func.value, ast.Name) \
            and test.func.value.id == "torch":
        return test.args[0].id
    return None


def _constant_write(statement: ast.stmt, mask: str) -> bool:
    """Whether `statement` is `target[mask] = constant` (a number, `float("-inf")`): not
    a call that may draw or write, nor a tensor, which the write taken would give a zero
    gradient where eager's, never written, gives none."""
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    target, value = statement.targets[0], statement.value
    if not (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Name) and target.slice.id == mask):
        return False
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
        value = value.operand
    if isinstance(value, ast.Call):   # `float("-inf")`
        return (isinstance(value.func, ast.Name) and value.func.id in ("float", "int") and not value.keywords
                and all(isinstance(argument, ast.Constant) for argument in value.args))
    return isinstance(value, ast.Constant)   # not a name: a tensor written so would get a gradient


def _jumps(frame, called: bool = False) -> bool:
    """Whether `frame` reads the truth at a conditional jump (an `if`'s or an `assert`'s
    test, `not` of it included), rather than as part of a longer expression (`bool(t)`
    passed on, `a or b`); `called`: at the call whose result the next instruction, a
    conditional jump, takes (`assert t.item()`)."""
    instructions = list(dis.get_instructions(frame.f_code))
    if called:   # the call's instruction: the last at or before `f_lasti` (inside its caches)
        index = max((n for n, i in enumerate(instructions) if i.offset <= frame.f_lasti), default=None)
        index = index + 1 if index is not None and instructions[index].opname.startswith("CALL") else None
    else:
        index = next((n for n, i in enumerate(instructions) if i.offset == frame.f_lasti), None)
    at = instructions[index] if index is not None and index < len(instructions) else None
    return at is not None and at.opname.startswith("POP_JUMP") and "NONE" not in at.opname


def _guard(source: str, line: int) -> tuple[bool, str, str | None, str] | None:
    """(the test's truth on the computing side, the exception's name, its message where
    the source gives it whole, the raising statement) of the guard whose test is at
    `line` of `source`, or None."""
    tree = _tree(source)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise):
            wanted, raised, statement = False, _raised(node.body[0]), node.body[0]
        elif isinstance(node, ast.Assert):
            message = _literal(node.msg) if node.msg is not None else ""
            wanted, raised, statement = True, ("AssertionError", message), node
        else:
            continue
        test = node.test
        if not (test.lineno <= line <= (test.end_lineno or test.lineno)) or raised is None:
            continue
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        whole = test.operand if negated else test
        if not isinstance(whole, _WHOLE) or isinstance(whole, ast.Compare) and len(whole.ops) > 1:
            return None
        error, message = raised
        return wanted != negated, error, message, _source(statement, source)
    return None


def _raised(statement: ast.Raise) -> tuple[str, str | None] | None:
    """(a built-in exception's name, its message: "" for none, None where computed) that
    `statement` raises, or None."""
    exc = statement.exc
    call = exc if isinstance(exc, ast.Call) else None
    name = call.func if call is not None else exc
    if not isinstance(name, ast.Name) or not isinstance(getattr(builtins, name.id, None), type) \
            or not issubclass(getattr(builtins, name.id), Exception):
        return None
    if call is None or not call.args:
        return name.id, ""
    return name.id, _literal(call.args[0]) if len(call.args) == 1 and not call.keywords else None


def _literal(node: ast.expr) -> str | None:
    """A string the source gives whole (constants, implicitly joined), else None."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _source(node: ast.AST, source: str) -> str:
    """The statement as written, on one line, for a message eager computes."""
    return " ".join((ast.get_source_segment(source, node) or "").split())


@functools.lru_cache(maxsize=16)
def _tree(source: str) -> ast.Module | None:
    """`source` parsed, once per text (a file edited since is parsed again)."""
    try:
        return ast.parse(source) if source else None
    except SyntaxError:
        return None
