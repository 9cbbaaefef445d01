"""python-mip plumbing shared by the ILP solvers (Checkmate, HiRemate's H-ILP).

HiGHS is used when its Python package is installed, CBC (bundled with mip)
otherwise; $REMAT_IR_MILP=cbc|highs chooses. `optimize` runs the search with a time limit, reports progress
every second from a watcher thread (CBC does not call back while it
searches), and says whether the answer is proven optimal, merely feasible
(limit hit) or absent.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from dataclasses import dataclass

import mip

from .base import BadRequest, Progress


#: Environment variable naming the MILP backend ("cbc" or "highs"), e.g. to time CBC.
BACKEND_VARIABLE = "REMAT_IR_MILP"


def solver_name() -> str:
    """$REMAT_IR_MILP if set; else HiGHS where installed (usually faster), CBC otherwise."""
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if chosen in ("cbc", "highs"):
        return mip.CBC if chosen == "cbc" else mip.HIGHS
    if chosen:
        raise BadRequest(f"${BACKEND_VARIABLE} must be 'cbc' or 'highs', not {chosen!r}")
    return mip.HIGHS if _highs_loads() else mip.CBC


@functools.cache
def _highs_loads() -> bool:
    """Whether mip can drive the installed HiGHS (mip 2.0 cannot load it from highspy
    1.16, and says so only when a model is created)."""
    if importlib.util.find_spec("highspy") is None:
        return False
    try:
        probe = mip.Model(solver_name=mip.HIGHS)
    except Exception:  # noqa: BLE001 - any failure to load means: use CBC
        return False
    _bind_finalizers(probe)
    return True


#: The C functions mip's solver objects call in `__del__`, by backend module.
FINALIZERS = {"highs": ("highslib", ("Highs_destroy",)),
              "cbc": ("cbclib", ("Cbc_deleteModel", "Osi_deleteSolver"))}


def _bind_finalizers(model: mip.Model) -> None:
    """Looks up, now, the C functions that `model`'s backend calls when a model is freed.

    mip frees a model's C side in `__del__` through a cffi library attribute, which cffi
    binds on first use under a lock it also holds while it parses a C type, and mip parses
    types as it builds a model (`ffi.new("int*")`). A model is freed by the garbage
    collector (mip's objects refer to each other), which can run during such a parse: the
    `__del__` then waits, in the same thread, for the lock its own thread holds, and the
    process hangs. `remat()` of a 2-layer MLP hung that way, in the first model freed
    (`tests/test_milp.py`). Bound in advance, the attribute is read without the lock."""
    backend = model.solver_name.lower()
    if backend not in FINALIZERS:
        return
    library, names = FINALIZERS[backend]
    try:
        lib = getattr(importlib.import_module(f"mip.{backend}"), library)
    except (ImportError, AttributeError):   # another mip: nothing known to bind
        return
    for name in names:
        getattr(lib, name, None)


def new_model(name: str) -> mip.Model:
    model = mip.Model(name=name, sense=mip.MINIMIZE, solver_name=solver_name())
    _bind_finalizers(model)
    model.verbose = 0
    model.threads = max(1, min(4, os.cpu_count() or 1))
    # Plans within 0.1% of the best bound are as good as proven: costs are estimates.
    model.max_mip_gap = 1e-3
    if model.solver_name.upper() == "CBC":
        # CBC's clique strengthening (before the root LP) aborts the whole process on some
        # programs: SIGABRT in CglCliqueStrengthening::strengthenCliques on keep-set MILPs
        # of small random graphs (tests/test_keepset.py::..._under_cbc_too). Off, as mip
        # itself sets it for lazy constraints.
        from mip.cbc import cbc_set_parameter
        cbc_set_parameter(model.solver, "clqstr", "off")
    return model


@dataclass
class Outcome:
    #: "optimal", "feasible" (time limit hit with a solution), "infeasible" (proven), "none".
    status: str
    objective: float | None
    seconds: float


def optimize(model: mip.Model, seconds: float, progress: Progress, label: str,
             relax: bool = False) -> Outcome:
    """Solve `model` within `seconds`, telling `progress` how long it has been running.
    A model without variables (every decision fixed, as in a small cluster cut out for a
    leaf solver) has nothing to search: "none", without mip's warning on stderr."""
    if model.num_cols == 0:
        return Outcome("none", None, 0.0)
    started = time.monotonic()
    done = threading.Event()

    def watch():
        while not done.wait(1.0):
            progress(f"{label}: {time.monotonic() - started:.0f} s of at most {seconds:.0f} s")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        status = model.optimize(max_seconds=max(1.0, seconds), relax=relax)
    finally:
        done.set()
        watcher.join()
    elapsed = time.monotonic() - started
    S = mip.OptimizationStatus
    if status == S.OPTIMAL:
        return Outcome("optimal", model.objective_value, elapsed)
    if status == S.FEASIBLE:
        return Outcome("feasible", model.objective_value, elapsed)
    if status in (S.INFEASIBLE, S.INT_INFEASIBLE):
        return Outcome("infeasible", None, elapsed)
    return Outcome("none", None, elapsed)
