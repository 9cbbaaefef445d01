"""The `remat-ir` command: reports on good files, one clear line and exit 2 on bad ones."""

import subprocess
import sys
from pathlib import Path

import pytest

from remat_ir import ir
from remat_ir.ir import pb
from remat_ir.ir.examples import mlp
from builders import chain

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp.rir"


def remat_ir(*args):
    """Run the installed console script, as a user would."""
    script = Path(sys.executable).parent / "remat-ir"
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True)


def test_inspect_shipped_example():
    result = remat_ir("inspect", EXAMPLE)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    major, minor = ir.FORMAT_VERSION
    assert f"graph 'mlp4x128', IR format {major}.{minor}" in out
    assert "nodes: 37 (15 forward, 22 backward); 3 random" in out
    assert "aten.addmm.default                          4         0" in out
    assert "biggest tensors (top 10):" in out
    assert "hierarchy: 5 clusters, 4 at level 0, 1 at level 1" in out
    assert "store_all" in out and "recompute_all" in out


def test_output_read_by_a_reader_that_stops_early_ends_quietly():
    """`remat-ir inspect big.rir | head`: the pipe closes before the output is written.
    The command printed a BrokenPipeError traceback; it now stops quietly."""
    script = Path(sys.executable).parent / "remat-ir"
    process = subprocess.Popen([str(script), "inspect", EXAMPLE, "--top", "1000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()          # the reader has gone before the command writes
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert stderr == ""


def test_validate_shipped_example():
    result = remat_ir("validate", EXAMPLE)
    assert result.returncode == 0, result.stderr
    g = ir.load(EXAMPLE)
    peak = ir.simulate(g, g.schedules[0]).peak_bytes
    assert "examples/mlp.rir: structure ok (37 nodes, 51 values, 2 schedules)" in result.stdout.replace(str(ROOT) + "/", "")
    assert f"schedule 'store_all': valid, peak {peak / 2**20:.2f} MiB" in result.stdout
    assert "schedule 'recompute_all': valid" in result.stdout and "14 recomputations" in result.stdout


def _bad(tmp_path, data: bytes, name="bad.rir") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command", ["inspect", "validate"])
def test_bad_files_give_one_clear_error(tmp_path, command):
    data = ir.dumps(mlp(layers=2, batch=4, width=4))
    newer = pb.Graph.FromString(data[20:])
    newer.version.major, newer.version.minor = 3, 0
    cases = {
        "truncated": (data[:-3], "is truncated: the header announces"),
        "corrupt": (data[:30] + bytes([data[30] ^ 0xFF]) + data[31:], "is corrupt: its checksum"),
        "newer": (ir.dumps(newer), "uses IR format 3.0, newer than the 1.x this remat-ir reads; upgrade"),
        "not-ir": (b"hello world, this is not an IR file", "is not a remat IR file"),
    }
    for name, (payload, message) in cases.items():
        result = remat_ir(command, _bad(tmp_path, payload, f"{name}.rir"))
        assert result.returncode == 2, (name, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
    result = remat_ir(command, tmp_path / "nope.rir")
    assert result.returncode == 2 and "cannot read" in result.stderr and "No such file" in result.stderr


def test_cyclic_and_dangling_graphs(tmp_path):
    g, ids = chain(3)
    g.node(ids["f1"]).inputs.append(ids["a2"])
    g.node(ids["f1"]).args.add(tensor=ids["a2"])
    result = remat_ir("validate", ir.save(g, tmp_path / "cyclic.json"))
    assert result.returncode == 2
    assert "invalid graph, 1 problem(s):" in result.stderr
    assert "the graph has a cycle: node 'f_" in result.stderr
    g, ids = chain(3)
    g.node(ids["b1"]).inputs.append(4242)
    g.node(ids["b1"]).args.add(tensor=4242)
    result = remat_ir("inspect", ir.save(g, tmp_path / "dangling.rir"))
    assert result.returncode == 2
    assert "node 'b_5' (test.b, id 5) has input value id 4242, which does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_schedule_using_freed_value(tmp_path):
    g, ids = chain(3)
    s = g.add_schedule(ir.store_all(g))
    s.steps.insert(1, pb.Step(free=ids["a1"]))
    s.backward_start += 1
    result = remat_ir("validate", ir.save(g, tmp_path / "freed.rir"))
    assert result.returncode == 2
    assert ("schedule 'store_all': INVALID at step 2: node 'f_1' (test.f, id 1) reads value 'a1' "
            "(id 1), which is not live") in result.stdout


def test_wrong_prediction_is_flagged(tmp_path):
    g, _ = chain(3)
    s = g.add_schedule(ir.store_all(g))
    s.predicted_peak_bytes += 1
    result = remat_ir("validate", ir.save(g, tmp_path / "pred.rir"))
    assert result.returncode == 2
    assert "INCONSISTENT" in result.stdout and "predicted peak 4001 bytes but the simulator gives 4000" in result.stdout


def test_ops_the_pytorch_runtime_would_refuse_are_invalid(tmp_path):
    """A graph of PyTorch ops with an op PyTorch does not have, or whose random and
    mutating flags deny the op's schema: `validate` said it was valid, and the runtime
    refused it at the first call (the flags: trained otherwise than eager before that)."""
    g = mlp()
    assert remat_ir("validate", ir.save(g, tmp_path / "mlp.rir")).returncode == 0
    relu = next(n for n in g.proto.nodes if n.op == "aten.relu.default")
    relu.op = "aten.relu_twice.default"
    dropout = next(n for n in g.proto.nodes if n.random)
    dropout.random = False
    result = remat_ir("validate", ir.save(g, tmp_path / "edited.rir"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    found = [line for line in result.stdout.splitlines() if "ops INVALID" in line]
    assert len(found) == 2, result.stdout
    assert "PyTorch has no op 'aten.relu_twice.default'" in found[0]
    assert f"aten.native_dropout.default draws random numbers but node {dropout.name!r}" in found[1]


def test_usage_errors():
    assert remat_ir().returncode == 2
    assert remat_ir("frobnicate", "x").returncode == 2
    result = remat_ir("--version")
    assert result.returncode == 0 and result.stdout.startswith("remat-ir ")


def test_convert_a_torch_model(tmp_path):
    out = tmp_path / "mlp.rir"
    result = subprocess.run([str(Path(sys.executable).parent / "remat-ir"), "convert", "--torch",
                             "torch_models:mlp_for_cli", "-o", str(out), "--cost-model", "flops"],
                            capture_output=True, text=True, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert "lowering MLPWithLoss" in result.stderr
    g = ir.load(out)
    assert g.proto.provenance.frontend == "torch"
    assert [s.name for s in g.schedules] == ["autograd", "recompute-all"]
    for s in g.schedules:
        assert ir.simulate(g, s).valid
    assert remat_ir("validate", out).returncode == 0


def test_convert_a_torch_model_returning_its_loss_alone(tmp_path, capsys):
    """`--outputs loss`: the step's one user output is the loss (the logits an intermediate,
    None where the step returned them); a name the model does not return is one error.
    In process (`cli.main`): the console script is `test_convert_a_torch_model`'s."""
    from remat_ir import cli

    command = ["convert", "--torch", "torch_models:gpt2_for_cli", "--cost-model", "flops", "-o"]
    graphs = {}
    for outputs in (None, "loss"):
        out = tmp_path / f"gpt2-{outputs}.rir"
        assert cli.main(command + [str(out)] + (["--outputs", outputs] if outputs else [])) == 0
        graphs[outputs] = ir.load(out)
    user_outputs = {k: [o.name for o in g.proto.outputs if o.role == ir.pb.USER_OUTPUT] for k, g in graphs.items()}
    assert user_outputs == {None: ["output0", "output1"], "loss": ["output0"]}
    capsys.readouterr()
    assert cli.main(command + [str(tmp_path / "x.rir"), "--outputs", "loss,hidden"]) == 2
    said = capsys.readouterr().err
    assert "no output named 'hidden'" in said and "Traceback" not in said


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected package.module:factory"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("torch_models:missing", "torch_models has no callable 'missing'"),
    ("torch_models:not_a_factory_result", "the factory must return (model, example_inputs), got int"),
    ("torch_models:a_factory_that_raises", "the factory raised RuntimeError at "),
])
def test_convert_bad_factory(tmp_path, spec, message):
    result = subprocess.run([str(Path(sys.executable).parent / "remat-ir"), "convert", "--torch", spec,
                             "-o", str(tmp_path / "x.rir")], capture_output=True, text=True,
                            cwd=Path(__file__).parent)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("source, message", [
    ("def make(:\n", "importing 'factories' raised SyntaxError: "),
    ("raise RuntimeError('no GPU here')\n", "importing 'factories' raised RuntimeError: no GPU here"),
])
def test_convert_names_a_factory_module_failing_as_it_is_imported(tmp_path, source, message):
    """Found by hunt68: a traceback and exit status 1."""
    (tmp_path / "factories.py").write_text(source)
    result = subprocess.run([str(Path(sys.executable).parent / "remat-ir"), "convert", "--torch", "factories:make",
                             "-o", str(tmp_path / "x.rir")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_one_default_solver_for_solve_remat_and_the_command():
    """`solvers.solve()`, `remat()` and `remat-ir solve` plan a budget with the same solver
    when none is named, and `remat-ir partition` has hiremate's own limits as defaults."""
    import inspect

    from remat_ir import api, cli, solvers
    from remat_ir.solvers.partition import MAX_CLUSTER, MAX_TOP

    assert inspect.signature(solvers.solve).parameters["solver"].default == solvers.DEFAULT_SOLVER
    planner = api.Planner("50%", None, cost_model="flops", time_limit_s=None, progress=None, options={})
    assert planner.solver == solvers.DEFAULT_SOLVER
    parser = cli.build_parser()
    assert parser.parse_args(["solve", "in.rir", "-o", "out.rir"]).solver == solvers.DEFAULT_SOLVER
    partition = parser.parse_args(["partition", "in.rir", "-o", "out.rir"])
    assert (partition.max_cluster, partition.max_top) == (MAX_CLUSTER, MAX_TOP)


def test_solver_options_read_booleans_numbers_and_words():
    from remat_ir.cli import _option

    assert _option("anneal=false") == ("anneal", False)
    assert _option("repartition=True") == ("repartition", True)
    assert _option("iterations=2000") == ("iterations", 2000)
    assert _option("weight=1.5") == ("weight", 1.5)
    assert _option("start=hiremate") == ("start", "hiremate")


def test_solve_with_offloading(tmp_path):
    """`remat-ir solve --offload` needs a link, plans over the given one (transfers of
    1000 bytes are nothing next to 1 s ops: the store-everything order offloaded beats
    recomputing), says what moves, and stores the link."""
    graph, _ = chain(6)
    path = ir.save(graph, tmp_path / "chain.rir")
    out = remat_ir("solve", path, "--budget", "30%", "--offload", "-o", tmp_path / "x.rir")
    assert out.returncode == 2 and "host link's bandwidth" in out.stderr
    out = remat_ir("solve", path, "--budget", "60%", "--offload", "--host-bandwidth", "1MB/s",
                   "-o", tmp_path / "moved.rir")
    assert out.returncode == 0, out.stderr
    assert "over the host link" in out.stdout and "host memory" in out.stdout
    moved = ir.load(tmp_path / "moved.rir")
    assert moved.proto.provenance.host_link.bandwidth_bytes_per_s == 1e6
    schedule = moved.proto.schedules[-1]
    assert any(s.HasField("offload") for s in schedule.steps)
    assert ir.check(moved, schedule).peak_bytes <= 0.6 * ir.store_all(moved).predicted_peak_bytes
    assert "host link (given)" in remat_ir("inspect", tmp_path / "moved.rir").stdout


def test_deeply_nested_json_is_one_clear_error(tmp_path):
    """Python's JSON reader recurses per level: a file nested 200,000 deep is refused like
    any other undecodable file, not with a RecursionError traceback."""
    path = tmp_path / "deep.json"
    path.write_text('{"version": {"major": 1, "minor": 11}, "metadata": '
                    + "[" * 200_000 + "]" * 200_000 + "}")
    result = remat_ir("validate", path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"remat-ir: error: {path} is not a remat IR file: its JSON is nested "
                             "deeper than Python can read (an IR file nests a few levels)\n")


def test_unwritable_outputs_are_refused_before_the_work(tmp_path):
    """Each command names the output it cannot write, and why, before it plans or lowers
    (nothing printed on stdout: no summary of work that would be lost)."""
    missing = tmp_path / "no" / "such"
    cases = [
        (("solve", EXAMPLE, "--budget", "80%", "--solver", "sqrt", "-o", missing / "o.rir"),
         f"-o {missing / 'o.rir'}: cannot write there: no such directory {missing}; create it first"),
        (("solve", EXAMPLE, "--budget", "80%", "--solver", "sqrt", "-o", tmp_path),
         f"-o {tmp_path}: cannot write there: it is a directory; name a file"),
        (("solve", EXAMPLE, "--solver", "sqrt", "-o", tmp_path / "o.rir", "--plot", missing / "p.png"),
         f"--plot {missing / 'p.png'}: cannot write there: no such directory {missing}"),
        (("partition", EXAMPLE, "-o", missing / "o.rir"),
         f"-o {missing / 'o.rir'}: cannot write there: no such directory {missing}"),
        (("plot", EXAMPLE, "-o", missing / "p"),
         f"-o {missing / 'p'}-memory.png: cannot write there: no such directory {missing}"),
        (("convert", "--torch", "torch_models:mlp_for_cli", "-o", EXAMPLE / "x.rir"),
         f"-o {EXAMPLE / 'x.rir'}: cannot write there: {EXAMPLE} is not a directory"),
    ]
    for args, message in cases:
        result = remat_ir(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(f"remat-ir: error: {message}"), (args, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stdout == "", (args, result.stdout)
    assert not (tmp_path / "o.rir").exists()


def test_a_failed_write_is_one_clear_error(tmp_path, monkeypatch, capsys):
    """A write that fails after the checks (a full disk) names the file and the reason."""
    import errno
    import pathlib

    import matplotlib.figure

    from remat_ir import cli

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_bytes", full)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    out = tmp_path / "o.rir"
    assert cli.main(["partition", str(EXAMPLE), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"remat-ir: error: cannot write {out}: No space left on device\n"
    assert cli.main(["plot", str(EXAMPLE), "-o", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (f"remat-ir: error: cannot write {tmp_path / 'p'}-memory.png: "
                                       "No space left on device\n")


def test_plot_refuses_a_schedule_the_simulator_refuses(tmp_path):
    g, ids = chain(3)
    s = g.add_schedule(ir.store_all(g))
    s.steps.insert(1, pb.Step(free=ids["a1"]))
    s.backward_start += 1
    path = ir.save(g, tmp_path / "freed.rir")
    result = remat_ir("plot", path, "--schedule", "store_all", "-o", tmp_path / "p")
    assert result.returncode == 2
    assert result.stderr == (f"remat-ir: error: {path}: schedule 'store_all' is invalid: step 2: node "
                             "'f_1' (test.f, id 1) reads value 'a1' (id 1), which is not live; not "
                             f"plotted (`remat-ir validate {path}` checks every schedule)\n")
    assert not (tmp_path / "p-memory.png").exists()


@pytest.mark.parametrize("top", ["-3", "0"])
def test_inspect_refuses_a_count_below_one(top):
    result = remat_ir("inspect", EXAMPLE, "--top", top)
    assert result.returncode == 2
    assert f"remat-ir inspect: error: argument --top: must be at least 1, got {top}" in result.stderr


@pytest.mark.parametrize("budget, message", [("-50%", "budget must be a positive finite share, got '-50%'"),
                                             ("-1GiB", "budget must be positive, got '-1GiB'")])
def test_a_negative_budget_is_refused_as_negative(tmp_path, budget, message):
    """`--budget -50%` was read by argparse as an option: "expected one argument", naming
    nothing wrong with the value (found by a review)."""
    result = remat_ir("solve", EXAMPLE, "--budget", budget, "-o", tmp_path / "out.rir")
    assert result.returncode == 2
    assert f"remat-ir: error: {message}" in result.stderr
    assert not (tmp_path / "out.rir").exists()


def test_convert_refuses_an_input_too_big_to_hold(tmp_path, monkeypatch):
    """--shape with a huge dimension is refused by input name and size, whether the machine's
    memory is known (checked before allocating) or not (the allocator's refusal)."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    import torch
    from onnx import TensorProto, helper, numpy_helper

    from remat_ir import cli
    from remat_ir.ir import RematIRError

    weight = numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[weight])
    model = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    result = remat_ir("convert", model, "--shape", "x=100000000000x8", "-o", tmp_path / "x.rir",
                      "--cost-model", "flops")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("remat-ir: error: --shape x=100000000000x8: the input takes "
                                    "2.91 TiB (torch.float32), more than this machine's ")
    assert result.stderr.count("\n") == 1
    monkeypatch.setattr(cli, "_physical_memory", lambda: None)
    with pytest.raises(RematIRError, match=r"^--shape x=100000000000x8: the input takes 2.91 TiB "
                                           r"\(torch.float32\), which cannot be allocated \("):
        cli._example_input("x", [100_000_000_000, 8], torch.float32)


def test_solve_replaces_a_schedule_of_the_same_name(tmp_path):
    """Solving a file twice with one solver, or with a solver that names its schedule like
    one in the file, stored both side by side under one name (`plot --schedule NAME`
    then drew both). The new schedule replaces the old one, said in one line on stderr."""
    first, second = tmp_path / "first.rir", tmp_path / "second.rir"
    done = remat_ir("solve", EXAMPLE, "--solver", "sqrt", "--budget", "80%", "-o", first)
    assert done.returncode == 0, done.stderr
    done = remat_ir("solve", first, "--solver", "sqrt", "--budget", "90%", "-o", second)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"remat-ir: replaced the schedule 'sqrt' of {first} (solver sqrt, "
                           "budget 896.00 KiB, peak 672.00 KiB) with the new one\n")
    assert f"wrote {second} (schedule 'sqrt' replaced, 3 in the file)" in done.stdout
    planned = ir.load(second)
    assert [s.name for s in planned.schedules] == ["store_all", "recompute_all", "sqrt"]
    assert planned.schedules[-1].budget_bytes == int(0.9 * ir.store_all(planned).predicted_peak_bytes)
    # An external solver naming its plan 'store_all', like the file's reference schedule.
    program = tmp_path / "named_store_all.py"
    program.write_text("import sys\nfrom remat_ir import ir\n"
                       "graph = ir.loads(sys.stdin.buffer.read())\n"
                       "sys.stdout.buffer.write(ir.store_all(graph).SerializeToString())\n")
    third = tmp_path / "third.rir"
    done = remat_ir("solve", second, "--solver", f"exec:{sys.executable} {program}", "-o", third)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"remat-ir: replaced the schedule 'store_all' of {second} (solver "
                           "store_all, peak 1.09 MiB) with the new one\n")
    planned = ir.load(third)
    assert [s.name for s in planned.schedules] == ["recompute_all", "sqrt", "store_all"]
    assert planned.schedules[-1].solver == f"exec:{sys.executable} {program}"


def test_solve_does_not_carry_over_a_schedule_the_simulator_refuses(tmp_path):
    """A file holding a schedule the simulator refuses (`validate` says INVALID): `solve`
    copied it into its output unchecked. It is left out, in `validate`'s words."""
    g, ids = chain(3)
    g.add_schedule(ir.recompute_all(g))
    s = g.add_schedule(ir.store_all(g))
    s.steps.insert(1, pb.Step(free=ids["a1"]))
    s.backward_start += 1
    path, out = ir.save(g, tmp_path / "freed.rir"), tmp_path / "out.rir"
    done = remat_ir("solve", path, "--solver", "autograd", "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"remat-ir: {path}: schedule 'store_all': INVALID at step 2: node 'f_1' "
                           "(test.f, id 1) reads value 'a1' (id 1), which is not live; not copied "
                           f"into {out} (`remat-ir validate {path}` checks every schedule)\n")
    assert [s.name for s in ir.load(out).schedules] == ["recompute_all", "autograd"]
    assert remat_ir("validate", out).returncode == 0
