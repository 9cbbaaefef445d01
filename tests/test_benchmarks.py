"""The training-step benchmark's pieces: its baselines compute what eager computes, and its
report shows exactly what its results file holds."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_methods  # noqa: E402
import bench_report  # noqa: E402
from bench_models import FACTORIES  # noqa: E402


def gradients_after_step(module, inputs):
    torch.manual_seed(0)
    loss = module(*inputs)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in module.named_parameters()}


def test_checkpoint_every_block_wraps_every_block_and_trains_like_eager():
    bm = FACTORIES["gpt2"]("quick")
    reference = copy.deepcopy(bm.module).train()
    method = bench_methods.checkpoint_every_block(bm)
    assert method.info["blocks_checkpointed"] == 4  # one per GPT-2 layer
    loss_e, grads_e = gradients_after_step(reference, bm.inputs)
    loss_c, grads_c = gradients_after_step(method.module, bm.inputs)
    assert torch.equal(loss_e, loss_c)  # dropout masks replayed on recomputation
    assert grads_e.keys() == grads_c.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-5, atol=1e-7, msg=name)


def test_checkpoint_every_block_refuses_a_model_without_blocks():
    bm = FACTORIES["gpt2"]("quick")
    bm.blocks = (torch.nn.Conv3d,)
    with pytest.raises(ValueError, match="no module of"):
        bench_methods.checkpoint_every_block(bm)


def test_compiled_variants_get_their_own_code_objects():
    a = bench_methods._own_code(bench_methods._call_model, "step_budget_0_5")
    b = bench_methods._own_code(bench_methods._call_model, "step_budget_0_1")
    assert a.__code__ is not b.__code__ and a.__code__ is not bench_methods._call_model.__code__
    assert a(lambda x: x + 1, 1) == b(lambda x: x + 1, 1) == 2


def _rows():
    context = {"run": "20260101-000000-quick-cpu", "mode": "quick", "device": "cpu", "commit": "abc1234",
               "commit_dirty": False, "machine": {"cpus": 2, "platform": "Linux"},
               "versions": {"torch": "2.13.0"}}
    model = {"model": "gpt2", "model_description": "GPT-2 tiny"}
    return [
        {**context, **model, "method": "eager", "family": "eager", "status": "ok", "peak_bytes": 100 * 2**20,
         "peak_ratio": 1.0, "step_time_ratio": 1.0, "setup_s": 0.0},
        {**context, **model, "method": "remat-ir hiremate 50%", "family": "remat-ir", "status": "ok",
         "peak_bytes": 48 * 2**20, "peak_ratio": 0.48, "step_time_ratio": 1.123, "setup_s": 7.5,
         "predicted_peak_bytes": 47 * 2**20, "predicted_time_ratio": 1.1, "graph_nodes": 662,
         "measured_time_ratio": 1.08, "measured_time_interval": [1.05, 1.12], "prediction_within_tolerance": True,
         "cost_model": "profile", "budget": "50%"},
        {**context, **model, "method": "remat-ir rotor 30%", "family": "remat-ir", "status": "infeasible",
         "smallest_feasible_bytes": 36, "store_all_predicted_peak_bytes": 100, "planning_s": 3.0,
         "graph_nodes": 662},
    ]


def test_report_table_and_picture_come_from_the_results_file(tmp_path):
    results = tmp_path / "run.jsonl"
    bench_report.append_jsonl(results, _rows())
    assert [json.loads(line)["method"] for line in results.read_text().splitlines()] == \
        ["eager", "remat-ir hiremate 50%", "remat-ir rotor 30%"]
    md, pictures = bench_report.write(results)
    table = md.read_text()
    assert "| remat-ir hiremate 50% | 48.0 | 48.0% | x1.123 | 7.5 | 47.0 | x1.100 | x1.080 (1.050-1.120) |" in table
    assert "Time model: 1 of 1 plans predicted within 3% of the 95% interval" in table
    assert "| remat-ir rotor 30% | infeasible; smallest feasible 36.0% of store-everything |" in table
    assert "662 IR nodes" in table and "commit `abc1234`" in table
    assert [p.name for p in pictures] == ["run-gpt2.png", "run-time-model.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pictures)


def test_a_plan_is_measured_against_store_everything_on_its_own_backend():
    """The time model's measured ratio divides a plan's step by store-everything's step
    run with the same backend (its prediction is made against that schedule)."""
    import training_step

    def method(name, family="remat-ir", backend=None, predicted=1.0, budget="50%"):
        info = {} if backend is None else {"backend": backend, "predicted_time_ratio": predicted,
                                           "budget": budget, "cost_model": "profile"}
        return bench_methods.Method(name, family, lambda: 0.0, info=info)

    built = [method("eager", "eager"),
             method("remat-ir store-everything", backend="eager", budget="store-everything"),
             method("remat-ir store-everything [inductor]", backend="inductor", budget="store-everything"),
             method("remat-ir plan", backend="eager", predicted=1.1),
             method("remat-ir plan [inductor]", backend="inductor", predicted=1.1)]
    times = {"eager": 1.0, "remat-ir store-everything": 1.0, "remat-ir store-everything [inductor]": 0.8,
             "remat-ir plan": 1.2, "remat-ir plan [inductor]": 1.0}
    figures = {name: {"times": [t] * training_step.TIMED_PER_ROUND, "peak_bytes": 1, "loss": 0.0}
               for name, t in times.items()}
    model = type("BenchModel", (), {"name": "m", "description": "a model"})()
    rows = training_step.records(model, built, [], figures, {})
    measured = {r["method"]: r.get("measured_time_ratio") for r in rows}
    assert measured["remat-ir plan"] == 1.2 and measured["remat-ir plan [inductor]"] == 1.25
    assert measured["remat-ir store-everything [inductor]"] == 1.0
    judged = {r["method"]: r.get("prediction_within_tolerance") for r in rows}
    assert judged["remat-ir plan"] is False and judged["remat-ir plan [inductor]"] is False  # 1.1 vs 1.2, 1.25
    assert [r["measured_time_interval"] for r in rows if r["method"] == "remat-ir plan"] == [[1.2, 1.2]]


def test_the_prediction_without_the_runtimes_time_per_call_is_judged_beside_it():
    """A plan priced with the runtime's time per call (`cost_model.call_overhead_s`) is also
    judged as it was priced before that term, from the same run, and the summary counts both."""
    import bench_methods
    import bench_report
    import training_step

    def method(name, predicted, without=None, budget="50%"):
        info = {"backend": "eager", "predicted_time_ratio": predicted, "budget": budget, "cost_model": "profile"}
        if without is not None:
            info.update(call_overhead_s=0.002, predicted_time_ratio_without_call=without)
        return bench_methods.Method(name, "remat-ir", lambda: 0.0, info=info)

    built = [bench_methods.Method("eager", "eager", lambda: 0.0, info={}),
             method("remat-ir store-everything", 1.0, 1.0, budget="store-everything"),
             method("remat-ir a", 1.21, 1.30), method("remat-ir b", 1.10, 1.11)]
    times = {"eager": 1.0, "remat-ir store-everything": 1.0, "remat-ir a": 1.2, "remat-ir b": 1.1}
    figures = {name: {"times": [t] * training_step.TIMED_PER_ROUND, "peak_bytes": 1, "loss": 0.0}
               for name, t in times.items()}
    model = type("BenchModel", (), {"name": "m", "description": "a model"})()
    rows = {r["method"]: r for r in training_step.records(model, built, [], figures, {})}
    assert rows["remat-ir a"]["prediction_within_tolerance"] is True       # 1.21 against 1.2
    assert rows["remat-ir a"]["prediction_without_call_within_tolerance"] is False   # 1.30 against 1.2
    assert rows["remat-ir b"]["prediction_without_call_within_tolerance"] is True
    lines = bench_report.time_model_summary([{**r, "status": "ok"} for r in rows.values()])
    assert lines[0].startswith("Time model: 2 of 2 plans predicted within 3%")
    assert lines[1] == ("Of the 2 plans priced with the runtime's time per call (2.00 ms measured at "
                        "profiling): 2 within 3% with it, 1 without it.")


def test_the_measured_ratio_interval_keeps_a_round_paired_and_shows_the_noise():
    """Rounds are resampled with both methods' steps: drift that hits a plan and its
    reference in the same round cancels (the interval closes on the true ratio), while
    noise apart from it widens the interval around that ratio."""
    import numpy as np

    import training_step

    per = training_step.TIMED_PER_ROUND
    rng = np.random.default_rng(1)
    drift = np.repeat(rng.uniform(0.8, 1.3, size=12), per)  # the machine's speed per round
    reference = list(0.1 * drift)
    low, high = training_step.ratio_interval(list(0.1 * 1.15 * drift), reference, per_round=per)
    assert low == pytest.approx(1.15) and high == pytest.approx(1.15)
    noisy = list(0.1 * 1.15 * drift * rng.uniform(0.9, 1.1, size=len(drift)))
    low, high = training_step.ratio_interval(noisy, reference, per_round=per)
    assert low < 1.15 < high and high - low > 0.01
    assert training_step.judge_prediction(1.15 * 1.02, (1.15, 1.15))
    assert not training_step.judge_prediction(1.15 * 1.04, (1.15, 1.15))
    assert training_step.judge_prediction(low * 0.975, (low, high))


def test_readme_update_replaces_only_what_lies_between_the_markers(tmp_path):
    results = tmp_path / "results" / "run.jsonl"
    results.parent.mkdir()
    bench_report.append_jsonl(results, _rows())
    md, pictures = bench_report.write(results)
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench_report.README_BEGIN}\nold table\n{bench_report.README_END}\nafter\n")
    for _ in range(2):  # a second update replaces the first
        bench_report.update_readme(readme, md, pictures)
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    assert text.count("| remat-ir hiremate 50% |") == 1
    assert "![run-gpt2](results/run-gpt2.png)" in text


def test_the_project_readme_has_the_benchmark_markers():
    text = (BENCHMARKS.parent / "README.md").read_text()
    assert text.index(bench_report.README_BEGIN) < text.index(bench_report.README_END)


def _solvers_benchmark():
    """benchmarks/solvers.py under another name (`solvers` is also the solvers' source folder)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_solvers", BENCHMARKS / "solvers.py")
    module = sys.modules["bench_solvers"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_solver_benchmark_rows_on_a_chain_and_their_table(tmp_path, capsys):
    from builders import chain

    bench = _solvers_benchmark()
    specs = bench.parse_specs("hiremate,rotor,sqrt,checkmate,no-such-solver:start=hiremate,steps=3")
    assert [s.text for s in specs][-1] == "no-such-solver:start=hiremate,steps=3"
    assert specs[-1].options == (("start", "hiremate"), ("steps", 3))
    specs = bench.present(specs)
    assert [s.name for s in specs] == ["hiremate", "rotor", "sqrt", "checkmate"]
    assert "'no-such-solver' is not available" in capsys.readouterr().out

    graph = chain(8)[0]
    record = bench.graph_rows("chain16", graph, specs, [0.7, 0.5, bench.SMALLEST], time_limit_s=20)
    assert record["nodes"] == 16 and 0 < record["smallest_feasible"]["share"] < 0.5
    assert len(record["rows"]) == 4 * 3
    for row in record["rows"]:
        assert {"solver", "budget", "budget_bytes", "budget_share", "seconds", "feasible"} <= row.keys()
        assert 0 <= row["seconds"] < 20
        if row["feasible"]:
            assert row["peak_bytes"] <= row["budget_bytes"]
            assert row["peak_share"] <= row["budget_share"] + 1e-4
            assert row["overhead"] >= -1e-9  # store-everything is the fastest
        else:
            assert row["smallest_feasible_share"] > row["budget_share"]
    by = {(r["solver"], r["budget"]): r for r in record["rows"]}
    assert by[("hiremate", "smallest")]["feasible"]  # every solver is asked hiremate's smallest
    assert by[("checkmate", "smallest")]["budget_bytes"] == record["smallest_feasible"]["bytes"]
    assert not by[("sqrt", "50%")]["feasible"]  # sqrt's one plan peaks at 2/3 of a chain's

    reference = bench.reference_rows("chain10", chain(5)[0], specs, (0.7,), time_limit_s=20)
    assert [r["solver"] for r in reference] == ["hiremate", "rotor", "sqrt"]
    assert all(r["checkmate_status"] == "OPTIMAL" for r in reference)
    assert reference[0]["ratio"] >= 1 - 1e-9  # checkmate's optimum is the fastest within the budget

    results = bench.load_results(tmp_path / "solvers.json")
    results["runs"]["r1"] = bench.run_context(20)
    bench.merge_graph(results, "chain16", dict(key="k", description="chain", lowering_seconds=0),
                      record, "r1")
    bench.merge_reference(results, reference, "r1")
    hiremate_again = bench.reference_rows("chain10", chain(5)[0], specs[:1], (0.7,), time_limit_s=20)
    bench.merge_reference(results, hiremate_again, "r2")  # replaces hiremate's row, keeps the others'
    assert sorted(r["solver"] for r in results["reference"]["rows"]) == ["hiremate", "rotor", "sqrt"]
    assert [r["run"] for r in results["reference"]["rows"] if r["solver"] == "hiremate"] == ["r2"]
    again = bench.graph_rows("chain16", graph, specs[:1], [0.7], time_limit_s=20)
    bench.merge_graph(results, "chain16", dict(key="k"), again, "r2")  # replaces one row, keeps the rest
    assert len(results["graphs"]["chain16"]["rows"]) == 12
    assert [r["run"] for r in results["graphs"]["chain16"]["rows"]].count("r2") == 1
    table = bench.write(results, tmp_path / "solvers.json").read_text()
    assert json.loads((tmp_path / "solvers.json").read_text())["graphs"]["chain16"]["nodes"] == 16
    assert "| graph | budget | hiremate | rotor | sqrt | checkmate |" in table
    assert "| chain16 | 50% | 62.5% (" in table and "infeasible, names 66.7%" in table
    assert f"| chain16 | smallest ({record['smallest_feasible']['share']:.1%}) |" in table
    assert "| hiremate | 1 | x1.0000 | x1.0000 | x1.0000 | 0 |" in table


def test_solver_benchmark_bound_rows_lie_below_every_plan(tmp_path):
    from builders import chain

    bench = _solvers_benchmark()
    specs = bench.present(bench.parse_specs("hiremate,bound:time_limit_s=20"))
    assert [s.name for s in specs] == ["hiremate", "bound"]
    assert specs[1].kill_after(150) == 2 * 20 + 120 and specs[0].kill_after(150) == 150
    record = bench.graph_rows("chain16", chain(8)[0], specs, [0.7, 0.5, 0.1], time_limit_s=20)
    by = {(r["solver"], r["budget"]): r for r in record["rows"]}
    for label in ("70%", "50%"):
        plan, bound = by[("hiremate", label)], by[("bound:time_limit_s=20", label)]
        assert plan["feasible"] and bound["feasible"] and bound["bound"]
        assert 0 <= bound["overhead"] <= plan["overhead"] + 1e-9
    assert not by[("bound:time_limit_s=20", "10%")]["feasible"]  # below what backward reads
    results = bench.load_results(tmp_path / "solvers.json")
    results["runs"]["r1"] = bench.run_context(20)
    bench.merge_graph(results, "chain16", dict(key="k"), record, "r1")
    table = bench.write(results, tmp_path / "solvers.json").read_text()
    assert "| chain16 | 10% | infeasible, names" in table and "none fits, proven (" in table
    assert f"| >= {by[('bound:time_limit_s=20', '50%')]['overhead']:.1%} (" in table


def test_solver_benchmark_kills_a_solve_past_its_limit_and_reports_a_crash():
    import time

    bench = _solvers_benchmark()
    started = time.monotonic()
    assert bench.run_limited(lambda: time.sleep(30), 0.5) is None
    assert time.monotonic() - started < 5
    assert bench.run_limited(lambda: dict(feasible=True), 10) == dict(feasible=True)
    failed = bench.run_limited(lambda: 1 / 0, 10)
    assert not failed["feasible"] and failed["error"].startswith("ZeroDivisionError")


def test_offload_benchmark_table():
    """benchmarks/offload.py's table: a reached row with its ratio and transfers, and a
    row where both refuse, with the floors they name."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_offload", BENCHMARKS / "offload.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    reached = {"reached": True, "peak_share": 0.3, "overhead": 0.2, "stall_share": 0.01,
               "transferred_mib": 512.4, "host_peak_mib": 256.2, "recomputations": 3,
               "planning_s": 1.5}
    moved = dict(reached, overhead=0.1)
    floor = {"reached": False, "least_share": 0.259, "planning_s": 2.0}
    rows = [{"graph": "g", "link": "pcie4", "share": 0.3, "remat": reached, "offload": moved,
             "pofo": floor, "ratio": 0.5},
            {"graph": "g", "link": "h100", "share": 0.15, "remat": floor, "offload": floor}]
    table = bench.table(rows).splitlines()
    assert table[2] == ("| g | pcie4 | 30% | +20.0% at 30.0% | +10.0% at 30.0% | 0.50 | 1.0% | 512 MiB "
                        "| 256 MiB | not reached (least 25.9%) | 1.5 / 1.5 / 2.0 |")
    assert table[3].startswith("| g | h100 | 15% | not reached (least 25.9%) | not reached (least 25.9%) |  |")


def test_the_time_model_table_judges_each_plan_against_its_interval():
    import time_model

    context = {"run": "r", "device": "cpu", "machine": {"cpus": 2}, "commit": "abc1234", "timing_rounds": 50}
    model = {"model": "gpt2", "model_description": "GPT-2 tiny", "status": "ok", "peak_byte_s": 0.0}
    plan = {**context, **model, "backend": "eager", "solver": "hiremate", "predicted_peak_share": 0.5, "predicted_time_ratio": 1.10,
            "predicted_peak_bytes": 1000, "peak_bytes": 1000}
    rows = [{**context, **model, "method": "eager", "family": "eager"},
            {**plan, "method": "remat-ir hiremate 50%", "budget": "50%", "measured_time_ratio": 1.12, "measured_time_interval": [1.10, 1.14],
             "prediction_error": 1.10 / 1.12 - 1, "prediction_within_tolerance": True},
            {**plan, "method": "remat-ir hiremate 30%", "budget": "30%", "predicted_time_ratio": 1.2, "measured_time_ratio": 1.3,
             "measured_time_interval": [1.28, 1.32], "prediction_error": 1.2 / 1.3 - 1,
             "prediction_within_tolerance": False},
            {**plan, "method": "remat-ir hiremate 30% + offload", "budget": "30%", "offload": True, "peak_bytes": 1100,
             "measured_time_ratio": 1.1, "measured_time_interval": [1.0, 1.2], "prediction_error": 0.0,
             "prediction_within_tolerance": True},
            {**context, **model, "solver": "rotor", "budget": "30%", "status": "infeasible"}]
    text = time_model.table(rows)
    assert "| hiremate 50% | 50.0% | 1.000 | x1.100 | x1.120 | 1.100-1.140 | 0.982 | yes |" in text
    assert "| hiremate 30% | 50.0% | 1.000 | x1.200 | x1.300 | 1.280-1.320 | 0.923 | no |" in text
    assert "| hiremate 30% + offload | 50.0% | 1.100 | x1.100 | x1.100 | 1.000-1.200 | 1.000 | yes |" in text
    assert "| rotor 30% | infeasible |" in text and "50 rounds of 2 timed steps" in text
    assert "Time model: 2 of 3 plans predicted within 3%" in text and "not: hiremate 30% (predicted x1.200)" in text
    # Costs on two timelines (CUDA): one timeline's prediction is set beside the two's.
    two = [{**r, "two_timelines": True, "predicted_time_ratio_one_timeline": 1.25, "store_all_host_busy_s": 0.0126,
            "store_all_device_busy_s": 0.003} if "measured_time_interval" in r else r for r in rows]
    text = time_model.table(two)
    assert "host busy 12.60 ms and device busy 3.00 ms per step" in text
    assert "with one timeline's prediction beside it" in text
    assert "| hiremate 50% | 50.0% | 1.000 | x1.100 | x1.250 | x1.120 | 1.100-1.140 | 0.982 | yes |" in text
    assert "| rotor 30% | infeasible | | | | | | | |" in text


def test_a_time_model_run_where_every_plan_was_infeasible_draws_no_picture(tmp_path):
    """The full-size GPT-2 planned below its floor: only store-everything ran, and drawing
    the picture raised from min() of nothing after every step had been timed."""
    import bench_report

    rows = [{"run": "r", "device": "cpu", "model": "gpt2", "method": "remat-ir store-everything",
             "budget": "store-everything", "measured_time_ratio": 1.0, "predicted_time_ratio": 1.0},
            {"run": "r", "device": "cpu", "model": "gpt2", "solver": "hiremate", "budget": "30%",
             "status": "infeasible"}]
    assert bench_report.time_model_picture(rows, tmp_path / "t.png") is False
    assert not (tmp_path / "t.png").exists()
    drawn = [*rows, {**rows[0], "budget": "50%", "method": "remat-ir hiremate 50%", "measured_time_ratio": 1.1,
                     "predicted_time_ratio": 1.12}]
    assert bench_report.time_model_picture(drawn, tmp_path / "t.png") is True and (tmp_path / "t.png").exists()


def test_each_peer_is_set_beside_the_fastest_remat_ir_backend_with_the_ratios_interval():
    base = {"model": "m", "status": "ok", "timed_per_round": 2}
    peer = {**base, "method": "checkpoint every block", "peak_ratio": 0.3, "step_time_ratio": 1.5,
            "step_times_s": [1.5, 1.5, 3.0, 3.0, 1.5, 1.5]}
    plans = [{**base, "method": f"remat-ir at peak [{b}]", "peer": peer["method"], "backend": b,
              "peak_ratio": 0.29, "step_time_ratio": t, "step_times_s": [t * x for x in (1, 1, 2, 2, 1, 1)]}
             for b, t in (("eager", 1.2), ("inductor", 1.05))]
    lines = bench_report.peer_points([peer, *plans])
    assert "| checkpoint every block | 30.0% | x1.500 | 29.0%, x1.200 | 29.0%, x1.050 | 0.700 (0.700-0.700) |" \
        in lines, lines


def test_time_model_plans_are_read_from_the_command_line_or_refused_in_one_line():
    import time_model

    assert time_model.parse_plans("hiremate@50%, rotor@30%+offload,") == [
        ("hiremate", "50%", False), ("rotor", "30%", True)]
    assert ("hiremate", "15%", True) in time_model.default_plans(offload=True)
    assert not any(offload for *_, offload in time_model.default_plans(offload=False))
    for bad, says in (("hiremate", "write SOLVER@BUDGET"), ("hiremate@50%+fast", "only '\\+offload'")):
        with pytest.raises(ValueError, match=says):
            time_model.parse_plans(bad)


def test_every_benchmark_command_answers_help_without_running():
    """`--help` prints usage and exits 0: a `%` left unescaped in a help text made argparse
    raise, and a script without a parser ran its whole benchmark on `--help`. The scripts
    run one after another in one process of their own (`_HELP_DRIVER`), which imports torch
    once (3-4 s a process, twenty scripts): run in the test's process, scripts that set
    $REMAT_IR_MILP=cbc at import switched every later test of the worker to CBC."""
    import subprocess

    scripts = sorted(str(p) for p in BENCHMARKS.glob("*.py")
                     if 'if __name__ == "__main__"' in p.read_text())
    assert len(scripts) >= 10
    done = subprocess.run([sys.executable, "-c", _HELP_DRIVER, *scripts], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(answers) == sorted(Path(s).name for s in scripts)
    for name, (code, usage) in answers.items():
        assert code == 0 and usage.startswith("usage:"), f"{name} --help: exit {code!r}: {usage}"


#: Runs each script given as `SCRIPT --help` as `python SCRIPT --help` would (as __main__,
#: its folder first on sys.path), and prints one JSON line: name -> [exit code, the start of
#: what it printed, or the error it raised].
_HELP_DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
answers = {}
for script in sys.argv[1:]:
    out, code = io.StringIO(), None
    sys.argv, saved_path = [script, "--help"], list(sys.path)
    sys.path.insert(0, os.path.dirname(script))
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        code, text = "returned without exiting", out.getvalue()
    except SystemExit as exit:
        code, text = exit.code or 0, out.getvalue()
    except BaseException:
        code, text = "raised", traceback.format_exc()[-500:]
    sys.path[:] = saved_path
    answers[os.path.basename(script)] = [code, text.lstrip()[:200] if code in (0, None) else text]
print(json.dumps(answers))
"""


def test_plans_made_in_worker_processes_are_the_plans_made_here():
    """`RematPlanner.prepare` with several jobs: each plan made in a process of its own on
    the graph's bytes is the one `plan_once` makes here (rotor's dynamic program is
    deterministic), and a refusal comes back as the same InfeasibleBudget."""
    from exactness import lowered
    from remat_ir import ir
    from remat_ir.solvers import InfeasibleBudget

    def own_copy():  # planning stores the plan in the graph: not in the session's cached one
        proto = ir.pb.Graph()
        proto.CopyFrom(lowered("gpt2").proto)
        return ir.Graph(proto)

    planner = bench_methods.RematPlanner.__new__(bench_methods.RematPlanner)
    planner.graph, planner.plans, planner.say = own_copy(), {}, lambda line: None
    planner.prepare([("rotor", "70%"), ("rotor", "1%")], None, jobs=2)
    made, seconds = planner.plans[("rotor", "70%", False)]
    here, _ = bench_methods.plan_once(own_copy(), "rotor", "70%", None, False)
    assert seconds > 0 and made.solve_time_s > 0
    made.ClearField("solve_time_s"), here.ClearField("solve_time_s")   # how long it took: not the plan
    assert made.SerializeToString() == here.SerializeToString()
    refused = planner.plans[("rotor", "1%", False)]
    expected = bench_methods.plan_once(own_copy(), "rotor", "1%", None, False)
    assert isinstance(refused, InfeasibleBudget) and isinstance(expected, InfeasibleBudget)
    assert (refused.budget, refused.smallest_feasible) == (expected.budget, expected.smallest_feasible)


def test_the_prediction_spread_table_relates_the_spread_to_the_overhead():
    """The spread of one plan's predictions over lowerings, against its median overhead:
    what decides whether one run can judge "within a fifth of the overhead"."""
    import prediction_spread

    context = {"run": "r", "device": "cpu", "commit": "abc1234", "lowerings": 3, "rounds": 30}
    rows = [{**context, "model": "cnn", "plan": "hiremate 50%", "predicted_where_planned": 1.11,
             "predicted": [1.14, 1.10, 1.12], "measured": 1.11},
            {**context, "model": "cnn", "plan": "hiremate 70%", "predicted_where_planned": 1.03,
             "predicted": [1.03, 1.04, 1.02], "measured": None}]
    text = prediction_spread.table(rows)
    # overheads 14%, 10%, 12% against 11%: 10% and 12% within a fifth (8.8%-13.2%)
    assert "| cnn | hiremate 50% | x1.110 | x1.110 | x1.100 | x1.120 | x1.140 | 33% | 1.09 | 2 of 3 |" in text
    assert "| cnn | hiremate 70% |  | x1.030 | x1.020 | x1.030 | x1.040 | 67% |  | |" in text
    assert "each of 3 further lowerings" in text and "30 interleaved rounds" in text


def test_recomputations_are_a_nodes_later_runs_priced_and_measured_per_op():
    """`recompute_prices`: a node's first run in a step is its forward, later ones are
    recomputations; each is set against its price and its first run, summed per op."""
    import recompute_prices
    from remat_ir import ir
    from remat_ir.runtimes.timing import ScheduleTiming

    graph = ir.load(str(BENCHMARKS.parent / "examples" / "mlp.rir"))
    a, b = [n.id for n in graph.proto.nodes[:2]]
    graph.node(a).cost.time_s, graph.node(b).cost.time_s = 3.0, 5.0
    timing = ScheduleTiming(occurrences=[(a, 1.0), (b, 2.0), (-2, 9.0), (a, 0.5), (a, 0.25)],
                            overhead_s=0.0, step_s=12.75, steps=1,
                            host_device=[(a, 0.9, 0.1), (b, 1.0, 1.0), (-2, 9.0, 0.0), (a, 0.4, 0.1),
                                         (a, 0.2, 0.05)])
    per_op = recompute_prices.recomputations(graph, timing)
    assert set(per_op) == {graph.node(a).op}
    row = per_op[graph.node(a).op]
    assert row["count"] == 2 and row["priced_s"] == 6.0 and row["measured_s"] == 0.75
    assert row["measured_host_s"] == pytest.approx(0.6) and row["first_run_s"] == 2.0


def test_torch_overhead_runs_and_splits_the_runtimes_own_time_from_its_segments(tmp_path):
    """`make bench-full` ran it with a solver name that no longer existed ('store_all'),
    and failed. It now also times the plan's generated segments alone: the scheduled
    step's time beyond them is the runtime's per-call overhead (issue 25)."""
    import torch_overhead

    out = tmp_path / "overhead.json"
    assert torch_overhead.main(["--rounds", "3", "--device", "cpu", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    medians = result["median_step_s"]
    assert set(medians) == {"eager", "remat_store_all", "segments_alone"}
    assert 0 < medians["segments_alone"] and result["call_overhead_s"] == pytest.approx(
        medians["remat_store_all"] - medians["segments_alone"], abs=2e-6)


def test_loss_only_runs_and_each_plan_measures_its_simulated_peak(tmp_path):
    """`benchmarks/loss_only.py` on a tiny GPT-2: both ways planned at each budget, every
    step trained on `.loss` alone measuring its simulated peak (within 64 B), and the loss
    alone never needing a larger floor than the model with its logits."""
    import loss_only

    out = tmp_path / "loss_only"
    assert loss_only.main(["--layers", "1", "--width", "32", "--vocab", "256", "--seq", "16", "--batch", "2",
                           "--shares", "0.5", "--time-limit", "2", "--output", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert {row["way"] for row in rows} == {"loss and logits (all outputs)", 'loss alone (outputs=["loss"])'}
    for row in rows:
        if row["feasible"]:
            assert abs(row["measured_peak_bytes"] - row["simulated_peak_bytes"]) <= 64, row
    floors = {row["way"]: row["simulated_peak_bytes"] for row in rows if row["budget"] == "floor"}
    assert floors['loss alone (outputs=["loss"])'] < floors["loss and logits (all outputs)"], floors
