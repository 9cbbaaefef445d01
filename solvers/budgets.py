"""Budgets as people write them, and what a refusal tells them.

- `parse_budget`: None, bytes (an int, or a float above 1), a share of the
  store-everything peak (a float in (0, 1], as torch.compile's
  `activation_memory_budget`, or "50%"), or a size with its unit ("2GiB",
  "500 MB", "40B"). A string that is a bare number is refused: "40" could mean
  bytes or percent, and guessing wrong plans for the wrong budget.
- `parse_bandwidth`: the host link's bytes per second from "25GB/s".
- `describe`: bytes with their share of the store-everything peak, for every
  message that names a budget.
- `refusal`: the `InfeasibleBudget` a user reads, naming the budget and the
  smallest feasible one in bytes and share, and how much of any peak is the
  step's own outputs (parameter gradients, model outputs), which no schedule
  can free: why the floor is where it is.
"""

from __future__ import annotations

import math
import operator
import re

from remat_ir.ir import Graph, pb
from remat_ir.ir.units import human_bytes

from .base import BadRequest, InfeasibleBudget

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}

_FORMS = ("bytes (an integer), a share of the store-everything peak (0.5 or '50%'), or a "
          "size with its unit ('500MB', '2GiB', '40B')")


def is_share(budget) -> bool:
    """Whether `budget` is relative to the store-everything peak (then each graph, each
    input shape, gets its own limit)."""
    if isinstance(budget, float):
        return 0 < budget <= 1
    return isinstance(budget, str) and budget.strip().endswith("%")


def parse_budget(budget, store_all_peak: int) -> int | None:
    """Bytes from `budget` (forms in the module docstring); BadRequest (a ValueError)
    naming the accepted forms otherwise."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
        # A dict or tuple here is most often inputs passed third (`remat(model, (), inputs)`,
        # whose budget is the third argument): named, not shown whole (it printed every tensor).
        got = f"{budget!r}" if isinstance(budget, bool) else f"a {type(budget).__name__}"
        hint = (" (keyword inputs go to example_kwargs=..., the budget is the third argument)"
                if isinstance(budget, (dict, tuple, list)) else "")
        raise BadRequest(f"budget must be {_FORMS}; got {got}{hint}")
    if isinstance(budget, (int, float)):
        if not 0 < budget < math.inf:
            raise BadRequest(f"budget must be a positive finite number, got {budget}")
        if isinstance(budget, float) and budget <= 1:
            return max(1, int(store_all_peak * budget))
        if budget != int(budget):   # 1.5 was cut to 1 byte (found by a review)
            raise BadRequest(f"budget {budget} is neither a share (a number up to 1: 0.5 for half "
                             f"of the store-everything peak) nor bytes (a whole number); write "
                             f"'{budget:g}GB' or '{budget * 100:g}%' for what you meant")
        return int(budget)
    text = budget.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise BadRequest(f"budget {budget!r} is not a percentage like '50%'") from None
        if not 0 < percent < math.inf:
            raise BadRequest(f"budget must be a positive finite share, got {budget!r}")
        return max(1, int(store_all_peak * percent / 100))
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?", text, flags=re.IGNORECASE)
    if not match and re.fullmatch(r"-\s*[0-9]*\.?[0-9]+\s*([KMGT]i?B|B)?", text, flags=re.IGNORECASE):
        raise BadRequest(f"budget must be positive, got {budget!r}")
    if not match:
        # A string: the forms a string takes (a command line's budget is one; found by a
        # review, "bytes (an integer)" was advised there, and '50' then refused).
        raise BadRequest(f"budget {budget!r} is not understood; write a share of the "
                         f"store-everything peak ('50%') or a size with its unit ('500MB', "
                         f"'2GiB', '40B')")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if not unit:
        share = f"'{number * 100:g}%' (or the number {number:g})" if number <= 1 else f"'{text}%'"
        raise BadRequest(f"budget {budget!r} has no unit: write {share} for a share of the "
                         f"store-everything peak or '{text}MB', '{text}GiB', '{text}B' for a size")
    if number <= 0:
        raise BadRequest(f"budget must be positive, got {budget!r}")
    return int(number * _UNITS[unit])


def parse_host_budget(host_budget, store_all_peak: int) -> int | None:
    """`parse_budget` for the host memory offloaded copies may take, its errors saying so."""
    try:
        return parse_budget(host_budget, store_all_peak)
    except BadRequest as error:
        raise BadRequest(f"host budget: {error}") from None


def parse_bandwidth(bandwidth) -> float:
    """Bytes per second from a number or a size per second ("25GB/s", "900 MiB/s"), for
    the host link offloading plans with; BadRequest otherwise."""
    if isinstance(bandwidth, (int, float)) and not isinstance(bandwidth, bool) and bandwidth > 0:
        return float(bandwidth)
    match = (re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)/s", bandwidth.strip(), flags=re.IGNORECASE)
             if isinstance(bandwidth, str) else None)
    if not match or float(match.group(1)) <= 0:
        raise BadRequest(f"host bandwidth must be bytes per second (a positive number) or a "
                         f"size per second like '25GB/s'; got {bandwidth!r}")
    return float(match.group(1)) * _UNITS[match.group(2).upper()]


def describe(n_bytes: int, store_all_peak: int) -> str:
    """'9,070,596 bytes (8.65 MiB, 41.3% of the store-everything peak)'."""
    share = f", {n_bytes / store_all_peak:.1%} of the store-everything peak" if store_all_peak else ""
    return f"{n_bytes:,} bytes ({human_bytes(n_bytes)}{share})"


def refusal(graph: Graph, refused: InfeasibleBudget, store_all_peak: int,
            solver: str) -> InfeasibleBudget:
    """`refused` (from `solver`) with a message in bytes and shares and the outputs' floor."""
    outputs = graph.output_bytes()
    gradients = outputs.get(pb.PARAMETER_GRADIENT, 0) + outputs.get(pb.INPUT_GRADIENT, 0)
    others = outputs.get(pb.USER_OUTPUT, 0)   # buffer updates are freed as the backward starts
    found = ("no schedule at all was found" if refused.smallest_feasible is None else
             f"the smallest feasible budget found is {describe(refused.smallest_feasible, store_all_peak)}")
    floor = (f"; of any peak, {describe(gradients + others, store_all_peak)} are the step's "
             f"outputs, which no schedule frees (gradients {human_bytes(gradients)}, "
             f"model outputs {human_bytes(others)})")
    kept = [node for node in graph.proto.nodes if node.non_recomputable and node.phase == pb.FORWARD]
    if kept:
        # Custom ops are never recomputed (`frontends/random_ops.opaque_custom_op`): said, so
        # that a floor they raise is understood (hunt65: a model of custom gelus).
        ops = sorted({node.op for node in kept})
        floor += (f"; {len(kept)} forward node{'s' if len(kept) > 1 else ''} no plan recomputes "
                  f"(custom ops among them, whose kernels may draw or count their calls: {', '.join(ops[:3])}"
                  f"{', ...' if len(ops) > 3 else ''}) keep their outputs from the forward; a custom op "
                  f"whose kernel draws from torch's generator alone, or nothing, and keeps no state may be "
                  f"declared so, remat(..., pure_ops=['namespace::name']), and is then recomputed")
    result = InfeasibleBudget(refused.budget, refused.smallest_feasible,
                              refused.detail or f" (by {solver})", schedule=refused.schedule)
    result.args = (f"no schedule fits a budget of {describe(refused.budget, store_all_peak)}; "
                   f"{found}{result.detail}{floor}",)
    result.store_all_peak = store_all_peak
    return result


def peak_ceiling(graph: Graph) -> int:
    """Bytes no schedule of `graph` can hold at once: every storage twice over (a value
    recomputed beside its old copy, a placeholder for a skipped draw) and every node's
    workspace, all together."""
    return (2 * sum(graph.allocation_bytes(s.size_bytes) for s in graph.proto.storages)
            + sum(graph.allocation_bytes(n.cost.workspace_bytes) for n in graph.proto.nodes))


def floor_problem(budget: int, smallest, graph: Graph, none: str = "name none") -> str | None:
    """Why `smallest`, the floor a solver names as it refuses `budget`, is no floor (the
    rest of a sentence naming the solver), or None. A floor within the budget refused
    contradicts the refusal: repeating it would send the caller to ask again for a budget
    the solver already said nothing fits. One beyond any peak of the graph
    (`peak_ceiling`) is no number of bytes: 2^64 - 1 was reported as 16 EiB, 10^17 % of
    the peak (found by a review of `exec:` solvers; hunt68: a plugin's went unchecked)."""
    if smallest is None or isinstance(budget, bool) or not isinstance(budget, int):
        return None
    try:   # NumPy's integers too (hunt69: a plugin's `peaks.max()`)
        smallest = operator.index(smallest) if not isinstance(smallest, bool) else None
    except TypeError:
        smallest = None
    if smallest is None:
        return ("and names no whole number of bytes as the smallest feasible budget: it must be "
                "one, or None")
    if smallest > (ceiling := peak_ceiling(graph)):
        return (f"and names {smallest:,} bytes as the smallest feasible one, more than any schedule "
                f"of this graph can hold ({ceiling:,} bytes: all its {len(graph.proto.storages)} "
                f"storages twice over and every workspace): not a peak; it must name the peak of a "
                f"schedule it found, or {none}")
    if smallest <= budget:
        return (f"but names {smallest:,} bytes, within that budget, as the smallest feasible one: a "
                f"contradiction; its smallest feasible budget must exceed the budget it refuses")
    return None

