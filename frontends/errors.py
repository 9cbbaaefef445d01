"""The frontends' error: a model that cannot be lowered."""

from __future__ import annotations

from remat_ir.ir import RematIRError


class LoweringError(RematIRError):
    """The model cannot be lowered: the message names the op or construct and where."""
