"""Errors of the IR layer.

Every error a user can cause (a bad file, an invalid graph, a schedule that
breaks the rules) is a `RematIRError`, whose message names the problem and
where it is. The CLI turns these into one line and exit status 2; nothing
else should escape to the user as a traceback.
"""

from __future__ import annotations


class RematIRError(Exception):
    """Base of every user-facing error raised by remat-ir."""


class FormatError(RematIRError):
    """A file that cannot be read: corrupt, truncated, or of a newer major version."""


class InvalidGraph(RematIRError):
    """A graph that breaks a structural rule; `problems` lists every one found."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        super().__init__(f"invalid graph: {problems[0]}{more}")


class InvalidSchedule(RematIRError):
    """A schedule the simulator rejected; `violation` says where and why."""

    def __init__(self, schedule_name: str, violation):
        self.violation = violation
        super().__init__(f"schedule {schedule_name!r} is invalid: {violation}")
