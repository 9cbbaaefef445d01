"""FSDP2 (`torch.distributed.fsdp.fully_shard`) around a scheduled module.

FSDP2 gathers a unit's parameters in the unit's forward pre-hook and frees
them in its post-hook; a scheduled module never calls its submodules (it runs
their ops), so those hooks never fire. The runtime therefore drives the units
through FSDP's public `unshard()`/`reshard()` (docs/distributed.md):

- the module `remat` returned is the FSDP root (`fully_shard(scheduled)`): its
  own hooks run as for any root, gathering the parameters no unit owns, and
  queue the end-of-backward callback that reduce-scatters every unit's
  gradients;
- the inner units are gathered before the forward segment and freed after it,
  and gathered again before the backward segment; their gradients accumulate
  into the gathered parameters (the chain of gradient groups, `torch._Step`),
  and each unit's reduce-scatter starts as soon as its last gradient group has
  been handed over (`post_backward`), overlapping the rest of the backward.

The memory model needs no change for this: the IR holds every parameter, full
size, for the whole step, which is what is gathered while a segment runs.
Recomputation never repeats a collective: gathers happen once per segment,
around it, never inside.
"""

from __future__ import annotations

import torch
import torch.distributed

from remat_ir.ir import RematIRError


class FSDPUsageError(RematIRError):
    """A scheduled module sharded with FSDP2 in a way its segments cannot run."""


def _fsdp_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a build without distributed support
        return None
    return FSDPModule


class Units:
    """The FSDP2 units inside a scheduled module (the root excluded), in module order."""

    def __init__(self, units: list[torch.nn.Module]):
        self.units = units
        self.names = [type(u).__name__ for u in units]

    @staticmethod
    def of(scheduled: torch.nn.Module, model: torch.nn.Module) -> "Units | None":
        """The units of `scheduled`, None without FSDP; raises `FSDPUsageError` where
        FSDP was applied so that the units' gradients would never be reduced."""
        fsdp = _fsdp_module_class()
        if fsdp is None or not torch.distributed.is_initialized():  # FSDP needs a process group
            return None
        if isinstance(model, fsdp):
            raise FSDPUsageError(
                f"fully_shard was applied to the model ({type(model).__name__}) that remat-ir "
                "scheduled; apply it to the module remat_ir.remat returned instead (and to its "
                "blocks), so that FSDP's root hooks run around the scheduled step")
        units = [m for m in model.modules() if isinstance(m, fsdp)]
        if not units:
            return None
        if not isinstance(scheduled, fsdp):
            raise FSDPUsageError(
                f"{len(units)} submodules of {type(model).__name__} are sharded with fully_shard "
                "but the module remat_ir.remat returned is not: call fully_shard on it too "
                "(it is the FSDP root, whose end-of-backward callback reduce-scatters the "
                "gradients)")
        return Units(units)

    def gather(self) -> None:
        """All-gather every unit's parameters (all launched, then waited for)."""
        handles = [u.unshard(async_op=True) for u in self.units]
        for handle in handles:
            if handle is not None:
                handle.wait()

    def release(self) -> None:
        """Free the gathered parameters (the sharded ones are registered again)."""
        for u in self.units:
            u.reshard()

    def reduce(self, unit: int) -> None:
        """Start the reduce-scatter of `unit`'s gradients and free its gathered
        parameters: FSDP's post-backward for the unit, which its module hooks would
        have run. Idempotent: the root's end-of-backward callback skips units done."""
        state = self.units[unit]._get_fsdp_state()
        for group in state._fsdp_param_groups:
            group.post_backward()

    def owners(self, model: torch.nn.Module, names: list[str]) -> list[int | None]:
        """For each qualified parameter name, the index of the unit that shards it
        (the innermost unit whose path prefixes the name), None for the root's own."""
        paths = {id(m): path for path, m in model.named_modules()}
        prefixes = [(paths[id(u)] + "." if paths[id(u)] else "", i) for i, u in enumerate(self.units)]
        owners = []
        for name in names:
            matching = [(len(p), i) for p, i in prefixes if name.startswith(p)]
            owners.append(max(matching)[1] if matching else None)
        return owners


def check_gathered(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """A gathered parameter must be what the graph was lowered with: FSDP's
    `MixedPrecisionPolicy(param_dtype=...)` gathers it in another dtype."""
    if tensor.dtype != dtype:
        raise FSDPUsageError(
            f"FSDP gathers parameter {name!r} as {tensor.dtype} but remat-ir lowered it as "
            f"{dtype}; drop MixedPrecisionPolicy(param_dtype=...) and train under "
            "torch.autocast instead (remat-ir plans autocast's casts)")
