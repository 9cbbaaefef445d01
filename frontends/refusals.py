"""What lowering refuses because the trace would lose it silently, each error saying what
to do: backward hooks, gradient hooks put on in the forward, what a forward does besides
computing tensors, in-place writes into parameters or inputs, outputs that are not
tensors and cannot be kept (the checks themselves live where they look: `tensor_hooks`,
`trace_effects`, `output_aliases`, `torchlib/hooks.py`, the lowering's output node)."""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch.utils import _pytree as pytree

from remat_ir.torchlib.hooks import backward_hooks
from remat_ir.torchlib.member_arguments import member_storages, view_of_member
from remat_ir.torchlib.types import argument_name

from .errors import LoweringError
from .model_lines import is_model_file


def _first_of(found: list[str]) -> str:
    """The first of the distinct findings, and the next two of the others (export runs the
    forward more than once, so the same one may be noted twice). "(and 1 more)" alone
    left a user to find the other call (a search, 2026-12-03)."""
    distinct = list(dict.fromkeys(found))
    if len(distinct) == 1:
        return distinct[0]
    rest = distinct[1:]
    return (f"{distinct[0]} (and {len(rest)} more: {'; '.join(rest[:2])}"
            f"{'; ...' if len(rest) > 2 else ''})")


def check_backward_hooks(model: torch.nn.Module) -> None:
    """LoweringError naming the model's module backward hooks, which torch.export does not
    record (`torchlib/hooks.py`)."""
    found = backward_hooks(model)
    if found:
        raise LoweringError(
            f"{type(model).__name__} has a {_first_of(found)}: torch.export records no backward "
            f"hook, so the traced step would train as if it were not there. Remove it, or apply "
            f"it inside the forward in a torch.autograd.Function's backward (remat-ir keeps "
            f"those); a hook on the module remat_ir.remat returns runs as on any module")


def check_script_modules(model: torch.nn.Module) -> None:
    """LoweringError naming a TorchScript module in the model (`torch.jit.script`,
    `torch.jit.trace`), which torch.export cannot trace: a scripted `nn.Sequential` failed
    with "Sequential.forward() takes 2 positional arguments but 3 were given", named as an
    error of the model's own forward taking another path while traced."""
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            where = f"module {path!r} of {type(model).__name__}" if path else type(model).__name__
            raise LoweringError(
                f"{where} is a TorchScript module (torch.jit.script or torch.jit.trace), which "
                f"torch.export cannot trace. Train the Python module it was made from (script or "
                f"trace a copy after training, for deployment)")


def check_lazy_modules(model: torch.nn.Module) -> None:
    """LoweringError naming a lazy module (`nn.LazyLinear`) whose parameters are not made
    yet: eager makes them at its first call, drawing their initial values from the
    generator, which a trace cannot do. Export failed on the uninitialized parameter,
    named as a construct of the model's own."""
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params():
            where = f"module {path!r} of {type(model).__name__}" if path else type(model).__name__
            raise LoweringError(
                f"{where} is a lazy {type(module).__name__} whose parameters are not made yet: "
                f"they are made at its first call. Call the model once on an example batch "
                f"(under torch.no_grad()) before remat_ir.remat, as before building an optimizer")


def check_buffers_needing_gradients(model: torch.nn.Module) -> None:
    """LoweringError naming a buffer that requires a gradient. Eager gives it one (in
    `.grad`, which no optimizer given `model.parameters()` reads); the lowering crashed
    from inside on it ("'BufferAOTInput' object has no attribute 'idx'")."""
    for name, buffer in model.named_buffers():
        if buffer.requires_grad:
            raise LoweringError(
                f"buffer {name!r} of {type(model).__name__} requires a gradient, which "
                f"remat-ir hands over to parameters only. Make it an nn.Parameter if it is "
                f"trained (optimizers see parameters only), or register it without "
                f"requires_grad (`register_buffer(name, tensor.detach())`)")


def check_member_views(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """LoweringError naming an argument that views one of the model's parameters or
    buffers (`model(x, model.bn.running_mean[:])`, `model.l1.weight[:3]`): the graph
    would read it as a tensor of its own, where eager's view follows the member (a buffer
    the forward updates in place, a parameter's gradient). AOTAutograd failed on it from
    inside ("'NoneType' object has no attribute 'size'", found by a review). The member
    itself may be passed: the trace reads it as one tensor with the model's."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    members = {id(t): name for name, t in named}
    found = view_of_member(((argument_name(path), leaf) for path, leaf
                            in pytree.tree_flatten_with_path((args, kwargs))[0]), members, member_storages(named))
    if found is not None:
        raise LoweringError(f"{type(model).__name__}: {found}")


@contextlib.contextmanager
def refusing_autograd_calls(model: str):
    """While the block traces `model`, `torch.autograd.grad` or `torch.autograd.backward`
    called with the model's code on the stack (directly, through `Tensor.backward`, or
    through torch's helpers such as `torch.autograd.functional.vjp`) raises one
    LoweringError naming the model's innermost line. A gradient penalty (WGAN-GP, R1)
    differentiates inside the forward, which one graph of a forward and its backward
    cannot hold; export failed with its own words ("We found a fake tensor in the
    exported program constant's list ... Please file an issue on github"), no line,
    nothing to do. Not caught: a name bound before tracing (`from torch.autograd import
    grad`), which export's error then names as before."""
    originals = [(torch.autograd, "grad"), (torch.autograd, "backward")]
    saved = [getattr(owner, name) for owner, name in originals]

    def refusing(name, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            frame, through = sys._getframe(1), None
            while frame is not None and not is_model_file(frame.f_code.co_filename):
                if "_functorch" in frame.f_code.co_filename:   # `torch.func.grad`, `jacrev`, `vjp`
                    through = "a torch.func transform (grad, jacrev, vjp, ...)"
                frame = frame.f_back
            if frame is None:
                return function(*args, **kwargs)
            raise LoweringError(
                f"{model}'s forward calls {through or f'torch.autograd.{name}'} at {frame.f_code.co_filename}:"
                f"{frame.f_lineno} in {frame.f_code.co_name} (a gradient penalty?): remat-ir "
                f"lowers one graph of a forward and its backward, and a gradient taken inside "
                f"the forward is a second backward it cannot hold. Compute that term outside "
                f"the module remat-ir runs (a penalty on a gradient through it: train that "
                f"model without remat-ir)")
        return call

    for (owner, name), function in zip(originals, saved):
        setattr(owner, name, refusing(name, function))
    try:
        yield
    finally:
        for (owner, name), function in zip(originals, saved):
            setattr(owner, name, function)


def tensor_hook_error(model: str, calls: list[str], root_hooks: bool = False) -> LoweringError:
    """`root_hooks`: the model has forward hooks or pre-hooks of its own, which may hook its
    output or its input (a gradient monitor): those run on the module `remat` returns as
    eager's do (hunt71 F7: refused, with no word of that)."""
    root = (" If a forward hook or pre-hook of the model itself puts it on the model's output or input, "
            "register that hook on the module remat_ir.remat returns instead, where it runs as with eager"
            if root_hooks else "")
    return LoweringError(
        f"{model}'s forward puts a gradient hook on a tensor ({_first_of(calls)}): torch.export "
        f"does not record it, so the traced step would train as if it were not there. Apply it "
        f"in a torch.autograd.Function whose forward returns its input and whose backward "
        f"changes the gradient (remat-ir keeps those); for retain_grad, return the tensor as an "
        f"output and take its gradient with torch.autograd.grad.{root}")


def trace_effects_error(model: str, effects: list[str]) -> LoweringError:
    return LoweringError(
        f"{model}'s forward does what tracing runs once and the graph does not keep: "
        f"{_first_of(effects)}. Every step would repeat what tracing saw (a number drawn, a "
        f"seed set, an attribute's value). Draw random numbers with torch's random ops on the "
        f"default generator, keep counters and logs outside the forward, and return tensors "
        f"(an auxiliary loss) as outputs")


def backward_effects_error(model: str, effects: list[str]) -> LoweringError:
    """The error for a custom autograd Function's backward that changes Python state (a
    count of backward calls, a log of gradient norms): traced once into the graph, it ran
    at lowering only, and no step of the graph does it again."""
    return LoweringError(
        f"the backward of a custom autograd Function {model} applies does what tracing runs "
        f"once and the graph does not keep: {_first_of(effects)}. The graph computes the "
        f"gradients the backward returns at every step, and nothing else it does: count or "
        f"log outside it (after `backward()`, or in a hook on a tensor the forward returns)")


def backward_draws_error(model: str, generators: list[str], functions: list[str],
                         fresh: list[str] = ()) -> LoweringError:
    """The error for a custom backward (an autograd Function's, a custom op's registered
    one), or a Function's forward run while AOTAutograd traces (hunt65: said as a
    backward's), drawing from Python's or NumPy's generator, or from one it makes without
    a seed (`fresh`, `fresh_generators`): traced once, its numbers are constants of the
    graph, so every step added the same noise and the generator never moved (hunt63:
    gradients 1.35 off eager's over two steps, silently). Torch's random ops there are
    traced as draws, which the graph makes at every step."""
    which = f"; the Functions it applies: {', '.join(functions)}" if functions else ""
    source = " and ".join([f"{' and '.join(generators)} random generator"] if generators else []) or \
        f"a generator it makes without a seed ({fresh[0]})"
    if generators and fresh:
        source += f", and makes a generator without a seed ({fresh[0]})"
    return LoweringError(
        f"code {model} runs while its step is traced (a custom autograd Function's forward or "
        f"backward, or the backward a custom op registers{which}) draws from {source}: the numbers "
        f"become constants of the graph, so every step would use the same ones, where eager "
        f"draws anew. Draw with torch's random ops on the default generator (`torch.randn_like(g)`), "
        f"which the graph draws at every step as eager does")


def data_error(model: str, uses: list[tuple[str, int, str]]) -> LoweringError:
    """The error for a forward that uses `.data` (`trace_effects.data_uses`), which
    torch.export failed on with "a fake tensor in the exported program constant's list
    ... please file an issue", naming neither `.data` nor the line. The ways out given
    train bitwise like eager's `.data` (tests/test_trust.py)."""
    import linecache

    file, line, function = uses[0]
    code = linecache.getline(file, line).strip()
    more = f" (and {len(uses) - 1} more)" if len(uses) > 1 else ""
    return LoweringError(
        f"{model}'s forward uses `.data` at {file}:{line} in {function}"
        f"{f' (`{code}`)' if code else ''}{more}: `.data` hands out a tensor that tracing does "
        f"not follow, so torch.export cannot trace the step. Use `.detach()` instead: "
        f"`t.detach()` to read a tensor's values without a gradient, `h.detach().mul_(2)` or "
        f"`h.detach().copy_(v)` to write into a tensor the forward computed (the same values; "
        f"autograd then refuses a write into values a backward still needs, which `.data` "
        f"hides). Write into a parameter outside the forward (before the call, under "
        f"torch.no_grad)")


def mutation_error(mutated) -> str:
    """What to say of a forward that writes into a parameter or an input in place (buffers,
    parameters written under no_grad and inputs needing no gradient are updated as eager
    does)."""
    if type(mutated).__name__ == "ParamAOTInput":
        # Under no_grad (nn.Embedding's max_norm, a clamp) the write is copied in after the
        # forward, as a buffer's update; refused where a gradient would pass through it.
        return (f"the model's forward writes into parameter {mutated.target!r}, with gradients "
                f"through the write, in place; remat-ir's step hands over only outputs, "
                f"gradients and buffer updates, so the write would be lost. Do it outside the "
                f"forward (after optimizer.step(), under torch.no_grad)")
    # A user input needing no gradient is written back after the forward; one that needs a
    # gradient would come back without the write in its history (eager's in-place op puts
    # it there, and a later use of the tensor differentiates through it).
    where = getattr(mutated, "idx", mutated)
    return (f"the model's forward writes in place into its input {where}, which requires a "
            f"gradient; remat-ir's step can copy the new values back into the caller's tensor "
            f"but not give it the gradient history eager's in-place op gives it. Write into a "
            f"copy (`x = x.clone()` before the write), or do it outside the forward")


def constant_output(value, position: int):
    """A user output that is not a tensor (`return y, None`, a dict with a count): kept
    in the graph's metadata and returned as it is at every call; LoweringError for
    values that cannot be stored."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise LoweringError(f"output {position} of the model is a {type(value).__name__} ({value!r}), "
                        f"which a lowered graph cannot return; return tensors, numbers, strings "
                        f"or None")
