"""FSDP2 (`torch.distributed.fsdp.fully_shard`) around a scheduled module.

FSDP2 gathers a unit's parameters in the unit's forward pre-hook and frees
them in its post-hook; a scheduled module never calls its submodules (it runs
their ops), so those hooks never fire. The runtime therefore drives the units
through FSDP's public `unshard()`/`reshard()` (docs/distributed.md):

- the module `remat` returned is the FSDP root (`fully_shard(scheduled)`): its
  own hooks run as for any root, gathering the parameters no unit owns, and
  queue the end-of-backward callback that reduce-scatters every unit's
  gradients;
- inside each segment, an inner unit is gathered before the first step that
  reads its parameters' storage and, in the forward, freed after the last
  (`codegen._GatherLines`, `StepUnits`): one unit's parameters at a time, as
  FSDP's hooks would, wherever the schedule runs (or recomputes) its ops;
- gradients accumulate into the gathered parameters (the chain of gradient
  groups, `torch._Step`), and each unit's reduce-scatter, which frees it, starts
  once its last gradient group has been handed over and the backward no longer
  reads it (FSDP's `post_backward`), overlapping the rest of the backward.

Recomputation never repeats a collective: a unit is gathered once per segment,
and a recomputation inside the segment reads it gathered. The IR still counts
every parameter, full size, for the whole step: predicted peaks are an upper
bound of what runs (docs/distributed.md).
"""

from __future__ import annotations

import torch
import torch.distributed

from remat_ir.ir import RematIRError


class FSDPUsageError(RematIRError):
    """A scheduled module sharded with FSDP2 in a way its segments cannot run."""


def fsdp_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a build without distributed support
        return None
    return FSDPModule


def is_sharded_class(now: type, before: type) -> bool:
    """Whether `now` is the class FSDP2's `fully_shard` gives a module of class `before`
    (a subclass of FSDPModule and it, adding nothing a forward computes)."""
    fsdp = fsdp_module_class()
    return fsdp is not None and now.__bases__ == (fsdp, before)


class Units:
    """The FSDP2 units inside a scheduled module (the root excluded), in module order."""

    def __init__(self, units: list[torch.nn.Module]):
        self.units = units

    @staticmethod
    def of(scheduled: torch.nn.Module, model: torch.nn.Module) -> "Units | None":
        """The units of `scheduled`, None without FSDP; raises `FSDPUsageError` where
        FSDP was applied so that the units' gradients would never be reduced."""
        fsdp = fsdp_module_class()
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

    def reduce(self, unit: int) -> None:
        """Start the reduce-scatter of `unit`'s gradients and free its gathered
        parameters: FSDP's post-backward for the unit, which its module hooks would
        have run. Idempotent: the root's end-of-backward callback skips units done."""
        state = self.units[unit]._get_fsdp_state()
        for group in state._fsdp_param_groups:
            group.post_backward()

    def owners(self, model: torch.nn.Module, names: list[str | None]) -> list[int | None]:
        """For each qualified parameter name, the index of the unit that shards it
        (the innermost unit whose path prefixes the name); None for the root's own
        parameters and where the name is None (not a parameter)."""
        paths = {id(m): path for path, m in model.named_modules()}
        prefixes = [(paths[id(u)] + "." if paths[id(u)] else "", i) for i, u in enumerate(self.units)]
        owners = []
        for name in names:
            matching = [(len(p), i) for p, i in prefixes if name is not None and name.startswith(p)]
            owners.append(max(matching)[1] if matching else None)
        return owners


class StepUnits:
    """One step's units as the generated segments see them (U in `codegen`): `gather(u)`
    all-gathers unit u and returns its parameters as gathered, by resident slot (and
    records them: autograd's gradient nodes take these tensors, so that gradients
    accumulate where FSDP reduce-scatters them from), and prefetches the next unit;
    `release(u)` frees them."""

    def __init__(self, units: Units, slots: dict[int, list[tuple[int, torch.nn.Module, str, str, torch.dtype]]]):
        self.units = units
        self.slots = slots  # unit -> [(slot, owning module, name, qualified name, lowered dtype)]
        self.objects: dict[int, torch.Tensor] = {}

    def gather(self, unit: int, following: int | None = None) -> dict[int, torch.Tensor]:
        """Unit `unit` gathered (waiting for its all-gather, started here or by an earlier
        prefetch), with the all-gather of the unit the segment gathers next (`following`)
        started without waiting: it runs while this unit's ops do."""
        self.units.units[unit].unshard()
        if following is not None:
            self.units.units[following].unshard(async_op=True)
        gathered = {}
        for slot, module, name, qualified, dtype in self.slots[unit]:
            tensor = module._parameters[name]
            check_gathered(qualified, tensor, dtype)
            gathered[slot] = self.objects[slot] = tensor
        return gathered

    def release(self, unit: int) -> None:
        self.units.units[unit].reshard()

    def after_forward(self) -> None:
        """Every unit sharded again, and every gathered parameter recorded (a unit the
        forward never read is gathered once here, for its tensors)."""
        for unit, slots in self.slots.items():
            if any(slot not in self.objects for slot, *_ in slots):
                self.gather(unit)
            self.release(unit)


def check_gathered(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """A gathered parameter must be what the graph was lowered with: FSDP's
    `MixedPrecisionPolicy(param_dtype=...)` gathers it in another dtype."""
    if tensor.dtype != dtype:
        raise FSDPUsageError(
            f"FSDP gathers parameter {name!r} as {tensor.dtype} but remat-ir lowered it as "
            f"{dtype}; drop MixedPrecisionPolicy(param_dtype=...) and train under "
            "torch.autocast instead (remat-ir plans autocast's casts)")
