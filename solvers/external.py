"""External solvers: any program, in any language, as a solver (`exec:COMMAND`).

The IR is a protobuf message precisely so that solvers need not be Python: a
C++ MILP, a Rust dynamic program or a Julia prototype can be used like a
built-in one by naming it `exec:COMMAND` (`solve(graph, "50%", "exec:./my_solver
--fast")`, `remat-ir solve model.rir --solver "exec:./my_solver --fast"`).

The protocol, all of it:

- COMMAND is split like a shell would (`shlex`) and run without a shell.
- stdin: the graph as a binary IR file (20-byte header + serialized `Graph`,
  schemas/README.md). Its `metadata` carries the request:
  `remat_ir.solve.budget_bytes` (decimal bytes; absent: no budget) and
  `remat_ir.solve.time_limit_s` (decimal seconds; absent: none given). The same
  two are in the environment as REMAT_IR_BUDGET_BYTES and REMAT_IR_TIME_LIMIT_S
  (unset when absent).
- stdout: one serialized `Schedule` message, bare (no header); a program that
  prints far more than any schedule of the graph takes (`_stdout_limit`) is stopped.
- stderr: free text; every line is forwarded to the caller's `progress` as it
  arrives, and the first lines are quoted when the program fails.
- Exit status 0: success. 3: the budget is infeasible; stdout then holds a
  `Schedule` whose `predicted_peak_bytes` is the smallest budget the program
  knows to be feasible (above the budget; the rest of it is ignored), or nothing
  if it knows none; this becomes `InfeasibleBudget` (a floor within the budget, or
  beyond any peak of the graph, is the program's error). Anything else is a failure.
- Output is read until the program exits, then for as long as it keeps coming
  (`TAIL_S` of silence ends it): a process it started and left holding stdout or
  stderr is not waited for.
- A program that does not exist or is not executable is refused when the solver is
  named (`check_runnable`), before the graph is sent.
- Time: the program should finish within the time limit it was given; it is
  killed (with everything it started) `GRACE_S` seconds after the limit, or
  after `DEFAULT_TIME_LIMIT_S` when the caller gave none.

As with every solver, `remat_ir.solvers.solve` replays the returned schedule
in the simulator and refuses it if it breaks a rule or the budget, so the
program may plan with a simplified memory model.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError

from remat_ir.ir import Graph, dumps, pb

from .base import InfeasibleBudget, Progress, SolverError, quiet
from .budgets import floor_problem

#: Metadata keys (and environment variables) that carry the request to the program.
BUDGET_KEY = "remat_ir.solve.budget_bytes"
TIME_LIMIT_KEY = "remat_ir.solve.time_limit_s"
BUDGET_ENV = "REMAT_IR_BUDGET_BYTES"
TIME_LIMIT_ENV = "REMAT_IR_TIME_LIMIT_S"

#: Exit status by which a program says that no schedule fits the budget.
EXIT_INFEASIBLE = 3
#: Seconds a program may run when the caller gives no time limit.
DEFAULT_TIME_LIMIT_S = 600.0
#: Seconds a program may run past its time limit before it is killed.
GRACE_S = 2.0
#: Seconds the program's stdout and stderr are read after it exited, for what it printed
#: to reach us: a process it started and left running may hold them open (no end of file).
TAIL_S = 0.5
#: Seconds between looks at whether the program exited, while its stderr is forwarded.
POLL_S = 0.05
#: Lines of stderr quoted in error messages.
QUOTED_LINES = 5
#: The cap on a program's stdout: STDOUT_BYTES_PER_PAIR bytes times nodes x (nodes +
#: values), plus STDOUT_ALLOWANCE for names and parameters. A step encodes in at most 13
#: bytes, so a schedule that computes every node and frees every value once for each
#: node of the graph (more recomputation than recompute-everything on a chain) fits.
#: Past it, the program is stopped rather than its output read into memory without end.
STDOUT_BYTES_PER_PAIR = 16
STDOUT_ALLOWANCE = 4 << 20


def _request(graph: Graph, budget: int | None, time_limit_s: float | None) -> tuple[bytes, dict]:
    """The bytes for stdin (a copy of the graph with the request in its metadata) and the env."""
    proto = pb.Graph()
    proto.CopyFrom(graph.proto)
    env = dict(os.environ)
    for key, env_name, value in ((BUDGET_KEY, BUDGET_ENV, None if budget is None else str(int(budget))),
                                 (TIME_LIMIT_KEY, TIME_LIMIT_ENV,
                                  None if time_limit_s is None else repr(float(time_limit_s)))):
        if value is None:
            proto.metadata.pop(key, None)
            env.pop(env_name, None)
        else:
            proto.metadata[key] = value
            env[env_name] = value
    return dumps(proto), env


def _cannot_run(command: str, program: str, why: str) -> SolverError:
    return SolverError(f"external solver {command!r}: cannot run {program!r}: {why}")


def _missing(program: str) -> str:
    return ("there is no such file" if os.sep in program else
            "it is not a file and not found on PATH")


def _not_executable(program: str) -> str:
    return ("it is not executable (chmod +x it, or name its interpreter first, "
            f"e.g. 'exec:python3 {program}')")


def check_runnable(argv: list[str], command: str) -> None:
    """Refuse, before anything runs, a program that cannot start: one that does not exist
    or is not executable, in the words `_start` uses when starting it fails. A caller that
    runs the program many times (hiremate asks its leaf solvers once per cluster) would
    otherwise meet the same failure each time, after work that was in vain."""
    program = argv[0]
    if os.sep not in program:
        if shutil.which(program) is not None:  # as the exec family, the first executable one
            return
        found = shutil.which(program, mode=os.F_OK)
    else:
        found = program if os.path.exists(program) else None
    if found is None:
        raise _cannot_run(command, program, _missing(program))
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise _cannot_run(command, program, _not_executable(program))


def _start(argv: list[str], command: str, env: dict) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    except FileNotFoundError:
        raise _cannot_run(command, argv[0], _missing(argv[0])) from None
    except PermissionError:
        raise _cannot_run(command, argv[0], _not_executable(argv[0])) from None
    except OSError as error:
        raise _cannot_run(command, argv[0], str(error.strerror or error)) from None


def _kill(process: subprocess.Popen) -> None:
    """Kill the program and whatever it started and left running (it leads a session of its
    own, so its process group is its own too)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        elif process.poll() is None:  # pragma: no cover - not POSIX
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass  # the program and everything it started are gone already
    process.wait()


def _killing_on_termination(process: subprocess.Popen) -> Callable[[], None]:
    """Until the returned function is called, a SIGTERM to this process (a job scheduler's
    time limit, `timeout`, `kill`) first kills the program, then does what it did before
    (the caller's handler, or ending the process). Why: the program leads a session of its
    own, so no signal to this process reaches it, and SIGTERM ended Python without its
    `finally`: the program ran on as an orphan, with no time limit (hunt68). Only in the
    main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def terminating(signum, frame) -> None:
        _kill(process)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:   # the default: end as the signal ends a process
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, terminating)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is terminating:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return restore


def _feed(stream, data: bytes) -> None:
    """Write the graph to the program's stdin; a program may stop reading early."""
    try:
        stream.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            stream.close()
        except (BrokenPipeError, OSError):
            pass


#: The most characters of one stderr line kept (the rest is dropped, said with "...").
LINE_CHARACTERS = 1000
#: A line a carriage return ends (a progress bar drawn over itself) is passed on at most
#: this often; the one a newline ends always is.
REDRAWN_EVERY_S = 1.0


def _read_lines(stream, lines: queue.Queue) -> None:
    """Put the program's stderr lines into `lines` as a terminal shows them, then None.
    Found by hunt68: a progress bar drawn with carriage returns and no newline was one
    line, held whole (33 MB) and shown only as the program ended, forwarded and quoted
    whole. A carriage return now ends a line that the next overwrites (passed on once a
    second at most), and no line keeps more than `LINE_CHARACTERS`."""
    line, cut, drawn, carriage = bytearray(), False, -REDRAWN_EVERY_S, False

    def put() -> None:
        lines.put(line.decode("utf-8", errors="replace") + (" ..." if cut else ""))

    while chunk := stream.read1(1 << 16):
        for piece in re.split(rb"(\r|\n)", chunk):
            if piece == b"\r":
                carriage = True
                continue
            if piece == b"\n":   # after a carriage return too ("\r\n"): the line is kept
                put()
                line, cut, carriage = bytearray(), False, False
                continue
            if not piece:
                continue
            if carriage:   # text after a lone carriage return draws over the line
                if line and time.monotonic() - drawn >= REDRAWN_EVERY_S:
                    put()
                    drawn = time.monotonic()
                line, cut, carriage = bytearray(), False, False
            keep = piece[:max(0, LINE_CHARACTERS - len(line))]
            cut = cut or len(keep) < len(piece)
            line += keep
    if line:
        put()
    lines.put(None)


def _stdout_limit(graph: Graph) -> int:
    nodes, values = len(graph.proto.nodes), len(graph.proto.values)
    return STDOUT_ALLOWANCE + STDOUT_BYTES_PER_PAIR * nodes * (nodes + values)


def _read_capped(stream, chunks: list, limit: int, overflow: Callable[[], None]) -> None:
    """Read stdout into `chunks` as it arrives, up to `limit` bytes; one byte more calls
    `overflow` (which stops the program) and reads no further. Each chunk is kept as soon
    as it is read (`read1`): a program that exits leaving a process it started holding
    stdout open sends no end of file, and what it printed is taken without one (`TAIL_S`)."""
    size = 0
    while size <= limit:
        chunk = stream.read1(min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        overflow()


def _stderr_lines(lines: queue.Queue, process: subprocess.Popen, deadline: float):
    """The program's stderr lines as they arrive, until it closes, the deadline passes, or
    it stays silent for `TAIL_S` once the program exited.

    Why: waiting for stderr to close waited for every process holding it (found by a
    review: a program that printed its schedule and exited 0, leaving a detached child
    holding stdout and stderr, was waited on to its time limit, 600 s without one, and
    then said to have printed nothing)."""
    quiet_since = None   # once the program exited: when the last line came
    while True:
        now = time.monotonic()
        if quiet_since is None and process.poll() is not None:
            quiet_since = now
        end = deadline if quiet_since is None else min(deadline, quiet_since + TAIL_S)
        if now >= end:
            return
        try:
            line = lines.get(timeout=min(end - now, POLL_S))
        except queue.Empty:
            continue
        if line is None:
            return
        if quiet_since is not None:
            quiet_since = time.monotonic()
        yield line


def _quote(stderr: list[str], total: int) -> str:
    if not stderr:
        return " It wrote nothing on stderr."
    more = f"\n  ... ({total - len(stderr)} more lines)" if total > len(stderr) else ""
    return " Its stderr begins:\n  " + "\n  ".join(stderr) + more


def _not_a_schedule(command: str, data: bytes, why: str) -> SolverError:
    hint = ""
    if data.startswith(b"RMIR"):
        hint = " (that is a framed IR graph; print the bare Schedule message)"
    elif data.lstrip().startswith(b"{"):
        hint = " (that looks like JSON; print the binary Schedule message)"
    return SolverError(f"external solver {command!r} printed {len(data)} bytes that are not a "
                       f"Schedule protobuf ({why}); they begin with {data[:16].hex(' ')}{hint}. "
                       "It must print one serialized remat_ir.Schedule on stdout, and its "
                       "messages on stderr.")


def _parse(command: str, data: bytes) -> pb.Schedule:
    schedule = pb.Schedule()
    try:
        schedule.ParseFromString(data)
    except DecodeError as error:
        raise _not_a_schedule(command, data, str(error).rstrip(".")) from None
    if not schedule.ListFields():
        raise _not_a_schedule(command, data, "no Schedule field decodes from them")
    return schedule


def _smallest_feasible(command: str, output: bytes, budget: int, graph: Graph,
                       stderr: list[str], total: int) -> int | None:
    """The floor an infeasible answer names (None: none), refused where it is no floor
    (`budgets.floor_problem`)."""
    if not output:
        return None
    answer = _parse(command, output)
    if not answer.HasField("predicted_peak_bytes"):
        return None
    smallest = answer.predicted_peak_bytes
    if (problem := floor_problem(budget, smallest, graph, none="print nothing")) is not None:
        raise SolverError(f"external solver {command!r} exited with status {EXIT_INFEASIBLE} "
                          f"(no schedule fits the budget of {budget:,} bytes) {problem}."
                          f"{_quote(stderr, total)}")
    return smallest


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def external_solver(command: str) -> Callable[..., pb.Schedule]:
    """A solver (see `remat_ir.solvers.base`) that runs `command` with the module's protocol."""
    try:
        argv = shlex.split(command)
    except ValueError as error:  # an unbalanced quote
        raise SolverError(f"external solver {command!r}: cannot split the command into "
                          f"arguments as a shell would ({error}); balance its quotes") from None
    if not argv:
        raise SolverError("an external solver needs a command, e.g. exec:./my_solver")
    check_runnable(argv, command)

    def run(graph: Graph, budget: int | None, *, time_limit_s: float | None = None,
            progress: Progress = quiet) -> pb.Schedule:
        data, env = _request(graph, budget, time_limit_s)
        limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
        deadline = time.monotonic() + limit + GRACE_S
        process = _start(argv, command, env)
        lines: queue.Queue = queue.Queue()
        stdout: list[bytes] = []
        cap, overflowed = _stdout_limit(graph), threading.Event()

        def overflow() -> None:
            overflowed.set()
            _kill(process)

        threads = [threading.Thread(target=_feed, args=(process.stdin, data), daemon=True),
                   threading.Thread(target=_read_lines, args=(process.stderr, lines), daemon=True),
                   threading.Thread(target=_read_capped, args=(process.stdout, stdout, cap, overflow),
                                    daemon=True)]
        for thread in threads:
            thread.start()
        stderr: list[str] = []  # the first lines, for error messages
        total = 0
        terminated = _killing_on_termination(process)
        try:
            for line in _stderr_lines(lines, process, deadline):  # in the caller's thread
                if line.strip():
                    total += 1
                    if len(stderr) < QUOTED_LINES:
                        stderr.append(line)
                    progress(line)
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(process)
                raise SolverError(f"external solver {command!r} did not finish within its time "
                                  f"limit of {limit:g} s (plus {GRACE_S:g} s grace) and was "
                                  f"killed.{_quote(stderr, total)}") from None
        finally:
            _kill(process)  # leftovers it started; the program itself when `progress` raised
            terminated()
            until = time.monotonic() + TAIL_S   # one wait for all: a reader may be held
            for thread in threads:
                thread.join(timeout=max(0.0, until - time.monotonic()))
        if overflowed.is_set():
            raise SolverError(f"external solver {command!r} printed more than {cap:,} bytes on "
                              f"stdout, more than any schedule of this graph ({len(graph.nodes)} "
                              "nodes) takes, and was stopped; it must print one serialized "
                              f"remat_ir.Schedule.{_quote(stderr, total)}")
        output = b"".join(list(stdout))
        code = process.returncode
        if code == EXIT_INFEASIBLE:
            if budget is None:
                raise SolverError(f"external solver {command!r} exited with status "
                                  f"{EXIT_INFEASIBLE} (infeasible budget), but no budget was "
                                  f"given.{_quote(stderr, total)}")
            raise InfeasibleBudget(budget, _smallest_feasible(command, output, budget, graph,
                                                              stderr, total),
                                   f" (says external solver {command!r})")
        if code != 0:
            raise SolverError(f"external solver {command!r} {_exit_description(code)}."
                              f"{_quote(stderr, total)}")
        if not output:
            raise SolverError(f"external solver {command!r} exited with status 0 but printed "
                              "nothing on stdout; it must print one serialized "
                              f"remat_ir.Schedule.{_quote(stderr, total)}")
        return _parse(command, output)

    run.__name__ = "external_solver"
    run.__doc__ = f"External program: {command}"
    run.description = f"external program: {command}"
    return run
