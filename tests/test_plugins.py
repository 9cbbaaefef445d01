"""Solvers from outside the package: entry-point plugins and external programs (`exec:`).

A plugin is a real installed distribution (a dist-info folder on sys.path);
the external solvers are a C program that decodes and encodes the protobuf
wire format by hand, and small Python scripts that misbehave on purpose.
Every schedule is checked by its simulated peak, not by the absence of errors.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remat_ir import ir, solvers
from remat_ir.ir import pb
from remat_ir.ir.examples import mlp
from remat_ir.solvers import InfeasibleBudget, SolverError
from remat_ir.solvers.external import GRACE_S
from builders import chain

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "external_solver.c"

# ---------------------------------------------------------------- plugins

PLUGIN = '''
"""A remat-ir solver plugin, installed the way pip installs one."""

from remat_ir.ir import from_compute_sequence, pb
from remat_ir.solvers import InfeasibleBudget


def _store_everything(graph):
    forward = graph.phase_order(pb.FORWARD)
    return forward + graph.phase_order(pb.BACKWARD), len(forward)


def solve(graph, budget, *, time_limit_s=None, progress=None):
    """Store what backward reads, free everything else after its last use (test plugin)."""
    sequence, forward = _store_everything(graph)
    schedule = from_compute_sequence(graph, sequence, forward, name="greedy")
    if progress is not None:
        progress(f"greedy: {len(sequence)} computations")
    if budget is not None and schedule.predicted_peak_bytes > budget:
        raise InfeasibleBudget(budget, schedule.predicted_peak_bytes)
    return schedule


def drop_step(graph, budget, *, time_limit_s=None, progress=None):
    """Forgets the first forward computation (a broken test plugin)."""
    schedule = solve(graph, None)
    del schedule.steps[0]
    schedule.backward_start -= 1
    return schedule


def floor_within(graph, budget, *, time_limit_s=None, progress=None):
    """Refuses every budget naming half of it as its floor (a broken test plugin)."""
    raise InfeasibleBudget(budget, budget // 2)


def sum_twice(graph, budget, *, time_limit_s=None, progress=None):
    """Runs a running sum of a gradient a second time (a broken test plugin)."""
    sequence, forward = _store_everything(graph)
    first = next(n for n in sequence if graph.node(n).accumulates_gradient)
    sequence.insert(sequence.index(first) + 1, first)
    return from_compute_sequence(graph, sequence, forward, name="sum-twice")


def numpy_floor(graph, budget, *, time_limit_s=None, progress=None):
    """Refuses every budget, naming store-everything's peak as a NumPy integer (a test plugin)."""
    import numpy
    sequence, forward = _store_everything(graph)
    peak = from_compute_sequence(graph, sequence, forward, name="numpy").predicted_peak_bytes
    raise InfeasibleBudget(budget, numpy.int64(peak))


class NotCallable:
    solve = 5
'''

ENTRY_POINTS = """\
[remat_ir.solvers]
greedy = greedy_plugin:solve
greedy-broken = greedy_plugin:drop_step
greedy-floor-within = greedy_plugin:floor_within
greedy-sum-twice = greedy_plugin:sum_twice
greedy-not-callable = greedy_plugin:NotCallable
greedy-numpy-floor = greedy_plugin:numpy_floor
"""


def write_plugin(folder: Path) -> Path:
    """`greedy_plugin` as an installed distribution in `folder` (module + dist-info)."""
    folder.mkdir()
    (folder / "greedy_plugin.py").write_text(PLUGIN)
    info = folder / "greedy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greedy_plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return folder


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    folder = write_plugin(tmp_path / "site")  # tmp_path itself is shared with other files
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "greedy_plugin", raising=False)
    yield folder
    sys.modules.pop("greedy_plugin", None)


@pytest.fixture
def graphs():
    return {"chain": chain(6)[0], "mlp": mlp(layers=3, batch=32, width=16)}


def test_plugin_is_listed_with_its_distribution(plugin):
    infos = {info.name: info for info in solvers.available()}
    assert infos["greedy"].origin == "plugin (greedy_plugin)"
    assert infos["greedy"].description == ("Store what backward reads, free everything else "
                                           "after its last use (test plugin).")
    assert infos["greedy-broken"].origin == "plugin (greedy_plugin)"
    assert infos["autograd"].origin == "built-in"  # built-ins stay first and unchanged
    assert [i.name for i in solvers.available()][:len(solvers.registry.BUILTINS)] == \
        list(solvers.registry.BUILTINS)


@pytest.mark.parametrize("name", ["chain", "mlp"])
def test_plugin_solves_like_store_everything(plugin, graphs, name):
    graph = graphs[name]
    reference = ir.store_all(graph).predicted_peak_bytes
    before = len(graph.schedules)
    messages = []
    schedule = solvers.solve(graph, None, "greedy", progress=messages.append)
    assert schedule.solver == "greedy" and schedule.name == "greedy"
    assert schedule.predicted_peak_bytes == reference
    assert ir.simulate(graph, schedule).peak_bytes == reference
    assert not schedule.HasField("budget_bytes")
    assert len(graph.schedules) == before + 1
    assert messages == [f"greedy: {len(graph.nodes)} computations"]
    # The plugin's own InfeasibleBudget reaches the caller untouched.
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph, reference - 1, "greedy")
    assert (info.value.budget, info.value.smallest_feasible) == (reference - 1, reference)


def test_plugin_with_an_invalid_schedule_is_refused(plugin, graphs):
    graph = graphs["chain"]
    first = graph.phase_order(pb.FORWARD)[0]
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, "greedy-broken")
    message = str(info.value)
    assert "solver 'greedy-broken' (plugin (greedy_plugin)) returned a schedule the simulator " \
           "refuses: step 0: " in message
    produced = graph.describe_value(graph.node(first).outputs[0])
    assert f"reads {produced}, which is not live" in message
    assert len(graph.schedules) == 0  # nothing refused is stored


def test_a_plugins_floor_is_checked_as_an_external_solvers(plugin, graphs):
    """Found by hunt68: a plugin's refusal naming a floor within the budget it refused
    was passed on as is (a contradiction), as were -5 and 2^70 bytes; a string floor was a
    raw TypeError. An `exec:` solver's floor was checked."""
    graph = graphs["chain"]
    budget = ir.store_all(graph).predicted_peak_bytes // 2
    with pytest.raises(SolverError, match=rf"plugin solver 'greedy-floor-within' \(plugin \(greedy_plugin\)\) "
                                          rf"refused a budget of {budget:,} bytes but names {budget // 2:,} bytes, "
                                          r"within that budget, as the smallest feasible one: a contradiction"):
        solvers.solve(graph, budget, "greedy-floor-within")


def test_a_plugins_floor_of_numpys_integer_type_is_a_number_of_bytes(plugin, graphs):
    """Found by hunt69: a floor computed with NumPy (`peaks.max()`) was refused as no whole
    number of bytes once floors were checked."""
    graph = graphs["chain"]
    peak = ir.store_all(graph).predicted_peak_bytes
    with pytest.raises(InfeasibleBudget) as refused:
        solvers.solve(graph, peak // 2, "greedy-numpy-floor")
    assert refused.value.smallest_feasible == peak and type(refused.value.smallest_feasible) is int


def test_a_plugin_whose_solve_is_not_callable_is_named(plugin, graphs):
    """Found by hunt68: `solve = 5` was a raw TypeError from `inspect`, naming no plugin."""
    with pytest.raises(ir.RematIRError, match=r"plugin solver 'greedy-not-callable' \(greedy_plugin:NotCallable, "
                                              r"from greedy_plugin\) failed to load: TypeError: .* has a `solve` "
                                              r"that is not callable \(5\)"):
        solvers.solve(graphs["chain"], None, "greedy-not-callable")


def test_a_plugins_plan_running_a_gradient_sum_twice_is_refused_when_solved(plugin, tmp_path):
    """Found by hunt68: a plan computing a running sum of a gradient twice passed `solve`,
    `remat()` and `remat-ir validate` (the simulator does not model sums handed to
    autograd), and was refused only at the first training call."""
    import torch

    from remat_ir.lowering import lower_torch
    from remat_ir.reports import validate_lines

    class _Twice(torch.nn.Module):   # one layer read twice: its weight's gradient is a sum
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.tanh(self.fc(x))).square().mean()

    graph = lower_torch(_Twice(), (torch.randn(3, 4),), cost_model="flops")
    with pytest.raises(SolverError, match=r"solver 'greedy-sum-twice' \(plugin \(greedy_plugin\)\) returned "
                                          r"a schedule no runtime can run: it recomputes value \d+ \(.*\), a "
                                          r"running sum of a gradient"):
        solvers.solve(graph, None, "greedy-sum-twice")
    import greedy_plugin

    graph.add_schedule(greedy_plugin.sum_twice(graph, None))
    lines, ok = validate_lines(graph, "twice.rir")
    assert not ok and "schedule 'sum-twice': INVALID: it recomputes value" in lines[-1]


# ---------------------------------------------------------------- the CLI

def run_cli(*args, pythonpath: Path | None = None):
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "remat_ir", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def solve_with_cli(tmp_path, graph, solver: str, pythonpath: Path | None = None) -> pb.Schedule:
    """`remat-ir solve IN --budget 100% --solver SOLVER -o OUT`; the one schedule it adds."""
    source, planned = tmp_path / "in.rir", tmp_path / "out.rir"
    ir.save(graph, source)
    result = run_cli("solve", source, "--budget", "100%", "--solver", solver, "-o", planned,
                     pythonpath=pythonpath)
    assert result.returncode == 0, result.stderr
    out = ir.load(planned)
    assert len(out.schedules) == len(graph.schedules) + 1
    added = out.schedules[-1]
    assert added.solver == solver
    assert ir.simulate(out, added).valid
    return added


def test_cli_lists_and_uses_a_plugin(tmp_path):
    folder = write_plugin(tmp_path / "site")
    listed = run_cli("solvers", pythonpath=folder)
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stdout.splitlines() if re.match(r"\W*greedy(?![\w-])", line)]
    assert lines and "plugin (greedy_plugin)" in lines[0], listed.stdout
    graph = mlp(layers=3, batch=32, width=16)
    added = solve_with_cli(tmp_path, graph, "greedy", pythonpath=folder)
    reference = ir.store_all(graph).predicted_peak_bytes
    assert added.predicted_peak_bytes == reference
    assert added.budget_bytes == reference  # 100% of the store-everything peak


# ---------------------------------------------------------------- a C solver

@pytest.fixture(scope="module")
def c_solver(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build tests/external_solver.c")
    folder = tmp_path_factory.mktemp("c_solver")
    source = folder / "external_solver.c"
    shutil.copyfile(C_SOURCE, source)
    binary = folder / "external_solver"
    built = subprocess.run([compiler, "-std=c99", "-O2", "-Wall", "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("name", ["chain", "mlp"])
def test_c_solver_plans_store_everything(c_solver, graphs, name):
    graph = graphs[name]
    reference = ir.store_all(graph)
    messages = []
    schedule = solvers.solve(graph, "100%", f"exec:{c_solver}", progress=messages.append)
    peak = reference.predicted_peak_bytes
    assert schedule.predicted_peak_bytes == peak
    assert ir.simulate(graph, schedule).peak_bytes == peak
    assert schedule.budget_bytes == peak and schedule.solver == f"exec:{c_solver}"
    assert schedule.name == "c-store-all" and schedule.status == pb.HEURISTIC
    assert schedule.backward_start == reference.backward_start
    assert list(schedule.steps) == list(reference.steps)
    forward = graph.count_nodes(pb.FORWARD)
    assert messages[0] == (f"c solver: {len(graph.nodes)} nodes ({forward} forward, "
                           f"{len(graph.nodes) - forward} backward), {len(graph.proto.inputs)} "
                           f"graph inputs, budget {peak}")
    assert messages[1] == (f"c solver: {len(reference.steps)} steps, backward starts at step "
                           f"{reference.backward_start}")


def test_c_solver_over_budget_is_refused_by_the_simulator(c_solver, graphs):
    graph = graphs["chain"]
    budget = ir.store_all(graph).predicted_peak_bytes // 2
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, budget, f"exec:{c_solver}")
    assert "returned a schedule the simulator refuses" in str(info.value)
    assert f"over the budget of {budget} bytes" in str(info.value)


def test_c_solver_through_the_cli(c_solver, tmp_path):
    graph = mlp(layers=3, batch=32, width=16)
    added = solve_with_cli(tmp_path, graph, f"exec:{c_solver}")
    assert added.predicted_peak_bytes == ir.store_all(graph).predicted_peak_bytes


# ---------------------------------------------------------------- external programs, in Python

def script(tmp_path: Path, name: str, body: str) -> str:
    """`exec:` name of a Python script run by this interpreter."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return f"exec:{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


def test_request_arrives_in_metadata_and_environment(tmp_path, graphs):
    name = script(tmp_path, "echo", """
        import os, sys
        from remat_ir import ir
        graph = ir.loads(sys.stdin.buffer.read())
        for key in ("remat_ir.solve.budget_bytes", "remat_ir.solve.time_limit_s"):
            print(key, graph.proto.metadata.get(key, "absent"), file=sys.stderr, flush=True)
        for key in ("REMAT_IR_BUDGET_BYTES", "REMAT_IR_TIME_LIMIT_S"):
            print(key, os.environ.get(key, "absent"), file=sys.stderr, flush=True)
        sys.stdout.buffer.write(ir.store_all(graph).SerializeToString())
    """)
    graph = graphs["mlp"]
    peak = ir.store_all(graph).predicted_peak_bytes
    messages = []
    schedule = solvers.solve(graph, peak + 1, name, time_limit_s=7.5, progress=messages.append)
    assert messages == [f"remat_ir.solve.budget_bytes {peak + 1}", "remat_ir.solve.time_limit_s 7.5",
                        f"REMAT_IR_BUDGET_BYTES {peak + 1}", "REMAT_IR_TIME_LIMIT_S 7.5"]
    assert schedule.predicted_peak_bytes == peak and schedule.budget_bytes == peak + 1
    assert not any(k.startswith("remat_ir.solve.") for k in graph.proto.metadata)  # a copy was sent
    messages.clear()
    solvers.solve(graph, None, name, progress=messages.append)
    assert messages == ["remat_ir.solve.budget_bytes absent", "remat_ir.solve.time_limit_s absent",
                        "REMAT_IR_BUDGET_BYTES absent", "REMAT_IR_TIME_LIMIT_S absent"]


def test_crash_quotes_exit_status_and_stderr(tmp_path, graphs):
    name = script(tmp_path, "crash", """
        import sys
        sys.stdin.buffer.read()
        print("reading the graph", file=sys.stderr)
        print("boom", file=sys.stderr)
        sys.exit(1)
    """)
    with pytest.raises(SolverError) as info:
        solvers.solve(graph := graphs["chain"], None, name)
    assert str(info.value) == (f"external solver {name[5:]!r} exited with status 1. Its stderr "
                               "begins:\n  reading the graph\n  boom")
    assert len(graph.schedules) == 0


def test_killed_by_a_signal_is_named(tmp_path, graphs):
    name = script(tmp_path, "killed", """
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    with pytest.raises(SolverError, match="was killed by signal SIGKILL. It wrote nothing on stderr"):
        solvers.solve(graphs["chain"], None, name)


def test_only_the_first_stderr_lines_are_quoted(tmp_path, graphs):
    name = script(tmp_path, "chatty", """
        import sys
        for i in range(12):
            print(f"line {i}", file=sys.stderr)
        sys.exit(2)
    """)
    messages = []
    with pytest.raises(SolverError) as info:
        solvers.solve(graphs["chain"], None, name, progress=messages.append)
    assert messages == [f"line {i}" for i in range(12)]
    assert str(info.value).endswith("exited with status 2. Its stderr begins:\n  line 0\n  line 1"
                                    "\n  line 2\n  line 3\n  line 4\n  ... (7 more lines)")


def test_a_progress_bar_drawn_over_itself_is_passed_on_as_a_terminal_shows_it(tmp_path, graphs):
    """Found by hunt68: a bar drawn with carriage returns and no newline was one line, held
    whole, shown only as the program ended and quoted whole in the error (26 MB). Lines
    a carriage return ends are drawn over (passed on once a second at most), and a line
    keeps its first 1,000 characters; a Windows line end ends a line as a newline does."""
    name = script(tmp_path, "bar", """
        import sys
        for i in range(100_000):
            sys.stderr.write(f"\\r{i:6d} |" + "#" * (i // 5000))
        sys.stderr.write("\\r\\ndone\\r\\n" + "x" * 5000 + "\\n")
        sys.exit(1)
    """)
    messages = []
    with pytest.raises(SolverError) as info:
        solvers.solve(graphs["chain"], None, name, progress=messages.append)
    assert messages[0] == "     0 |" and len(messages) < 40
    assert messages[-3:] == [" 99999 |" + "#" * 19, "done", "x" * 1000 + " ..."]
    assert len(str(info.value)) < 3000


def test_time_limit_kills_the_program(tmp_path, graphs):
    name = script(tmp_path, "sleeper", """
        import sys, time
        print("thinking hard", file=sys.stderr, flush=True)
        time.sleep(120)
    """)
    messages = []
    started = time.monotonic()
    with pytest.raises(SolverError) as info:
        solvers.solve(graphs["chain"], None, name, time_limit_s=1, progress=messages.append)
    elapsed = time.monotonic() - started
    assert str(info.value) == (f"external solver {name[5:]!r} did not finish within its time limit "
                               f"of 1 s (plus {GRACE_S:g} s grace) and was killed. Its stderr "
                               "begins:\n  thinking hard")
    assert messages == ["thinking hard"]  # streamed while it ran
    assert 1 + GRACE_S <= elapsed < 1 + GRACE_S + 5


def test_a_terminated_command_leaves_no_external_solver_running(tmp_path, graphs):
    """Found by hunt68: SIGTERM to `remat-ir solve` (a scheduler's time limit) ended it
    without killing the external solver, which leads a session of its own: it ran on as an
    orphan with no time limit. It is killed first, and the command ends as SIGTERM ends it."""
    import signal

    pid_file = tmp_path / "solver.pid"
    name = script(tmp_path, "sleeper", f"""
        import os, sys, time
        sys.stdin.buffer.read()
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    source = ir.save(graphs["chain"], tmp_path / "in.rir")
    command = subprocess.Popen([sys.executable, "-m", "remat_ir", "solve", str(source), "--solver", name,
                                "-o", str(tmp_path / "out.rir")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    solver_pid = int(pid_file.read_text())
    command.send_signal(signal.SIGTERM)
    assert command.wait(timeout=30) == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        for _ in range(50):   # killed, and reaped by the command before it ended
            os.kill(solver_pid, 0)
            time.sleep(0.1)


def test_garbage_output_is_not_a_schedule(tmp_path, graphs):
    name = script(tmp_path, "garbage", """
        import sys
        sys.stdout.write("this is not a schedule\\n")
    """)
    with pytest.raises(SolverError) as info:
        solvers.solve(graphs["chain"], None, name)
    message = str(info.value)
    assert "printed 23 bytes that are not a Schedule protobuf" in message
    assert "they begin with 74 68 69 73 20 69 73 20 6e 6f 74 20 61 20 73 63." in message


def test_empty_output_is_an_error(tmp_path, graphs):
    name = script(tmp_path, "silent", "import sys\nsys.stdin.buffer.read()\n")
    with pytest.raises(SolverError, match="exited with status 0 but printed nothing on stdout"):
        solvers.solve(graphs["chain"], None, name)


def test_schedule_missing_steps_is_refused_by_the_simulator(tmp_path, graphs):
    name = script(tmp_path, "forgetful", """
        import sys
        from remat_ir import ir
        from remat_ir.ir import pb
        graph = ir.loads(sys.stdin.buffer.read())
        schedule = ir.store_all(graph)
        first_backward = schedule.steps[schedule.backward_start]
        assert first_backward.WhichOneof("action") == "compute"
        del schedule.steps[schedule.backward_start]
        sys.stdout.buffer.write(schedule.SerializeToString())
    """)
    graph, ids = chain(4)
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, name)
    # Steps: f1..f4, (b4 dropped), free a3, b3: b4 was to make g3, which b3 reads.
    assert str(info.value) == (f"solver {name!r} (exec) returned a schedule the simulator refuses: "
                               f"step 5: node 'b_{ids['b3']}' (test.b, id {ids['b3']}) reads value "
                               f"'g3' (id {ids['g3']}), which is not live")


@pytest.mark.parametrize("smallest", [12345, None])
def test_exit_3_means_infeasible_budget(tmp_path, graphs, smallest):
    answer = b"" if smallest is None else pb.Schedule(predicted_peak_bytes=smallest).SerializeToString()
    name = script(tmp_path, "infeasible", f"""
        import sys
        sys.stdin.buffer.read()
        print("no schedule fits", file=sys.stderr)
        sys.stdout.buffer.write({answer!r})
        sys.exit(3)
    """)
    with pytest.raises(InfeasibleBudget) as info:
        solvers.solve(graph := graphs["chain"], 1000, name)
    assert (info.value.budget, info.value.smallest_feasible) == (1000, smallest)
    peak = ir.store_all(graph).predicted_peak_bytes
    known = ("no schedule at all was found" if smallest is None else
             f"the smallest feasible budget found is 12,345 bytes (12.06 KiB, {12345 / peak:.1%} "
             "of the store-everything peak)")
    assert str(info.value).startswith(
        f"no schedule fits a budget of 1,000 bytes (1000 B, {1000 / peak:.1%} of the "
        f"store-everything peak); {known} (says external solver {name[5:]!r}); of any peak, ")
    assert len(graph.schedules) == 0


def test_missing_and_unrunnable_commands_are_named(tmp_path, graphs):
    graph = graphs["chain"]
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, "exec:/nonexistent/remat-solver --fast")
    assert str(info.value) == ("external solver '/nonexistent/remat-solver --fast': cannot run "
                               "'/nonexistent/remat-solver': there is no such file")
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, "exec:remat-no-such-solver-on-path")
    assert str(info.value) == ("external solver 'remat-no-such-solver-on-path': cannot run "
                               "'remat-no-such-solver-on-path': it is not a file and not found on PATH")
    plain = tmp_path / "solver.py"
    plain.write_text("print('hi')\n")
    plain.chmod(0o644)
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, f"exec:{plain}")
    assert f"cannot run '{plain}': it is not executable (chmod +x it" in str(info.value)
    with pytest.raises(solvers.UnknownSolver, match="'exec:' must be followed by the command"):
        solvers.solve(graph, None, "exec:  ")


def test_external_solver_takes_no_options(tmp_path, graphs):
    with pytest.raises(ValueError, match="has no option 'mode'; its options: none"):
        solvers.solve(graphs["chain"], None, "exec:true", mode="fast")


def test_unbalanced_quote_in_the_command_is_named(tmp_path, graphs):
    with pytest.raises(SolverError) as info:
        solvers.solve(graphs["chain"], None, 'exec:foo "bar')
    assert str(info.value) == ("external solver 'foo \"bar': cannot split the command into "
                               "arguments as a shell would (No closing quotation); balance its quotes")
    source = ir.save(graphs["chain"], tmp_path / "in.rir")
    result = run_cli("solve", source, "--solver", 'exec:foo "bar', "-o", tmp_path / "out.rir")
    assert result.returncode == 2
    assert result.stderr == f"remat-ir: error: {info.value}\n"


@pytest.mark.parametrize("floor", [1, 1000])
def test_infeasible_with_a_floor_within_the_budget_is_a_contradiction(tmp_path, graphs, floor):
    """Exit 3 says nothing fits the budget: a smallest feasible budget at or below it is the
    program's error, not a floor to report."""
    answer = pb.Schedule(predicted_peak_bytes=floor).SerializeToString()
    name = script(tmp_path, "liar", f"""
        import sys
        sys.stdin.buffer.read()
        sys.stdout.buffer.write({answer!r})
        sys.exit(3)
    """)
    with pytest.raises(SolverError) as info:
        solvers.solve(graph := graphs["chain"], 1000, name)
    assert str(info.value) == (f"external solver {name[5:]!r} exited with status 3 (no schedule fits "
                               f"the budget of 1,000 bytes) but names {floor:,} bytes, within that "
                               "budget, as the smallest feasible one: a contradiction; its smallest "
                               "feasible budget must exceed the budget it refuses. It wrote nothing "
                               "on stderr.")
    assert len(graph.schedules) == 0


def test_output_beyond_any_schedule_stops_the_program(tmp_path, graphs):
    """stdout is read up to a size no schedule of the graph reaches; past it the program is
    killed at once (not at its time limit) and nothing more is held in memory."""
    from remat_ir.solvers.external import _stdout_limit

    graph = graphs["chain"]
    limit = _stdout_limit(graph)
    name = script(tmp_path, "flood", f"""
        import sys, time
        sys.stdout.buffer.write(bytes({limit} + (1 << 20)))
        sys.stdout.buffer.flush()
        print("flooded", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    started = time.monotonic()
    with pytest.raises(SolverError) as info:
        solvers.solve(graph, None, name, time_limit_s=10)
    assert time.monotonic() - started < 8
    assert str(info.value).startswith(
        f"external solver {name[5:]!r} printed more than {limit:,} bytes on stdout, more than any "
        f"schedule of this graph ({len(graph.nodes)} nodes) takes, and was stopped; it must print "
        "one serialized remat_ir.Schedule.")
    assert limit < 8 << 20  # a small graph gets a small cap
