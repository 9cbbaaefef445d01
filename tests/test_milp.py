"""python-mip as the MILP solvers use it: a model freed by the garbage collector while
cffi holds its lock (as it does while parsing a C type, which mip does as it builds a
model) frees itself without waiting for that lock, under each backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from remat_ir.solvers import milp

#: Freed in a collection run while this thread holds cffi's lock, the way the collector
#: runs inside `ffi.new` when an allocation there crosses its threshold.
FREED_UNDER_CFFIS_LOCK = textwrap.dedent("""
    import gc, importlib, sys, weakref
    from remat_ir.solvers import milp
    gc.disable()
    model = milp.new_model("freed")
    x = model.add_var()
    model += x >= 1
    solver = weakref.ref(model.solver)
    del model, x
    assert solver() is not None, "the model is not cyclic garbage: nothing to check"
    backend = importlib.import_module("mip." + sys.argv[1])
    with backend.ffi._lock:
        gc.collect()
    assert solver() is None
    print("freed")
""")


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_a_model_freed_while_cffi_parses_does_not_hang(backend, monkeypatch):
    if backend == "highs" and not milp._highs_loads():
        pytest.skip("mip cannot drive the installed HiGHS")
    monkeypatch.setenv(milp.BACKEND_VARIABLE, backend)
    try:
        done = subprocess.run([sys.executable, "-c", FREED_UNDER_CFFIS_LOCK, backend],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{backend}: a model freed by the garbage collector under cffi's lock hung")
    assert done.returncode == 0 and done.stdout.strip() == "freed", done.stderr
