"""The solver protocol: what every solver receives, returns and raises.

A solver is a callable

    solver(graph, budget_bytes, *, time_limit_s, progress, **options) -> pb.Schedule

that plans one training step of `graph` (with costs) so that the simulated
activation peak stays within `budget_bytes` (None: no limit), within about
`time_limit_s` seconds of planning (None: its own default), reporting what it
is doing through `progress(message)`. It returns a schedule or raises
`InfeasibleBudget` with the smallest budget it knows to be feasible.

Solvers may be approximate in how they model memory: `remat_ir.solvers.solve`
replays every schedule in the simulator and refuses one that breaks a rule
or the budget, so no solver has to be trusted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from remat_ir.ir import RematIRError

#: Receives one-line status messages while a solver works ("rotor: 40/120 stages").
Progress = Callable[[str], None]


class InfeasibleBudget(RematIRError):
    """No schedule fits the budget; `smallest_feasible` is the lowest peak known to work
    (None when the solver found no schedule at all); `schedule`, when the solver gives
    it, is a schedule peaking there (for a caller combining solvers)."""

    def __init__(self, budget: int, smallest_feasible: int | None, detail: str = "",
                 schedule=None):
        self.budget, self.smallest_feasible, self.schedule = budget, smallest_feasible, schedule
        self.detail = detail  # who found the floor: " (by rotor)"
        known = ("no schedule at all was found" if smallest_feasible is None else
                 f"the smallest feasible budget found is {smallest_feasible} bytes")
        super().__init__(f"no schedule fits a budget of {budget} bytes; {known}{detail}")


class BadRequest(RematIRError, ValueError):
    """A malformed budget or solver option: the caller's mistake, named in the message."""


class SolverError(RematIRError):
    """A solver failed for a reason other than the budget (crash, bad output, no time)."""


def quiet(message: str) -> None:
    """The default progress sink: says nothing."""


class Deadline:
    """A planning time limit shared by the phases of one solve."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self, default: float = float("inf")) -> float:
        """Seconds left (`default` when there is no limit), never below zero."""
        if self.seconds is None:
            return default
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds
