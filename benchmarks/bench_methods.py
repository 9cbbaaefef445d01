"""The ways a user can train a model in less memory, each as one training step to time.

A `Method` wraps one way of running forward + backward of a `BenchModel`:
- eager PyTorch (the reference every ratio is taken against);
- `torch.utils.checkpoint` around every block (what most users do by hand);
- `torch.compile` with `torch._functorch.config.activation_memory_budget` (PyTorch's
  own memory-budgeted rematerialization, decided by its min-cut partitioner);
- remat-ir: the model lowered once, planned by a solver at a budget, run by the
  PyTorch runtime.
Each method runs on its own copy of the model (same weights), so that a checkpoint
wrapper or a compiled cache entry never leaks into another method.
"""

from __future__ import annotations

import copy
import functools
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint

from bench_models import BenchModel

import remat_ir
from remat_ir import ir
from remat_ir.solvers import InfeasibleBudget


@dataclass
class Method:
    """One way to run a training step. `step()` runs forward + backward of `module` (what
    the method trains: a copy of the model, wrapped or not) and frees the gradients;
    `setup_s` is what it cost before the first step (compilation, or lowering + planning);
    `info` holds what the method predicted or decided."""
    name: str
    family: str  # eager | checkpoint | compile | remat-ir
    step: Callable[[], float] | None
    module: torch.nn.Module | None = None
    setup_s: float = 0.0
    info: dict = field(default_factory=dict)


def _stepper(module: torch.nn.Module, inputs: tuple, call=None) -> Callable[[], float]:
    call = call or module

    def step() -> float:
        loss = call(*inputs)
        loss.backward()
        module.zero_grad(set_to_none=True)
        return loss.item()
    return step


def eager(bm: BenchModel) -> Method:
    model = copy.deepcopy(bm.module).train()
    return Method("eager", "eager", _stepper(model, bm.inputs), model)


def checkpoint_every_block(bm: BenchModel) -> Method:
    """`torch.utils.checkpoint` (non-reentrant, RNG state preserved) around the forward of
    every module of the model's block classes: the usual "gradient checkpointing"."""
    model = copy.deepcopy(bm.module).train()
    wrapped = 0
    for module in model.modules():
        if isinstance(module, bm.blocks):
            module.forward = functools.partial(torch.utils.checkpoint.checkpoint, module.forward,
                                               use_reentrant=False)
            wrapped += 1
    if not wrapped:
        raise ValueError(f"{bm.name}: no module of {bm.blocks} to checkpoint")
    return Method("checkpoint every block", "checkpoint", _stepper(model, bm.inputs), model,
                  info={"blocks_checkpointed": wrapped})


def _own_code(fn, name: str):
    """A copy of `fn` with its own code object. Dynamo keeps compiled entries per code
    object; two variants compiling the same function would share (and reuse) entries made
    under another variant's configuration."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _call_model(model, *inputs):
    return model(*inputs)


def compiled(bm: BenchModel, budget: float) -> Method:
    """`torch.compile` (inductor, whole graph) with `activation_memory_budget = budget`. The
    budget is read when the joint graph is partitioned, at the first call, so the first step
    runs under the patched configuration; `fullgraph=True` so that no part of the model is
    compiled apart, in a cache another variant could hit."""
    model = copy.deepcopy(bm.module).train()
    label = f"{budget:g}".replace(".", "_")
    call = torch.compile(_own_code(_call_model, f"step_budget_{label}"), fullgraph=True)
    model_call = functools.partial(call, model)
    step = _stepper(model, bm.inputs, model_call)
    started = time.perf_counter()
    with torch._functorch.config.patch(activation_memory_budget=budget):
        step()
    return Method(f"torch.compile budget {budget:g}", "compile", step, model,
                  time.perf_counter() - started, info={"activation_memory_budget": budget})


class RematPlanner:
    """Lowers a model once, with costs from `cost_model` for the runtime `backend` its plans
    run on, and plans it with any solver at any budget. Plans made on another cost model
    than "profile" (the default) are named with it: "remat-ir hiremate 50% (isolated
    costs)"; plans run compiled end in " [inductor]"."""

    def __init__(self, bm: BenchModel, say: Callable[[str], None], cost_model: str = "profile",
                 backend: str = "eager"):
        from remat_ir.lowering import lower_torch

        self.bm, self.say, self.cost_model, self.backend = bm, say, cost_model, backend
        self.suffix = "" if cost_model == "profile" else f" ({cost_model} costs)"
        self.model = copy.deepcopy(bm.module).train()
        started = time.perf_counter()
        self.graph = lower_torch(self.model, bm.inputs, cost_model=cost_model, backend=backend)
        self.lowering_s = time.perf_counter() - started
        self.plans: dict[tuple, tuple | InfeasibleBudget] = {}
        reference = ir.store_all(self.graph)
        self.store_all_peak = reference.predicted_peak_bytes
        simulated = ir.simulate(self.graph, reference)
        self.store_all_time = simulated.total_time_s
        #: With two timelines (CUDA): store-everything's host and device busy seconds.
        self.busy = ((simulated.host_busy_s, simulated.device_busy_s)
                     if self.graph.proto.provenance.cost_model.two_timelines else None)
        self._store_all_one_timeline: float | None = None
        say(f"  lowered{'' if backend == 'eager' else f' for {backend}'}: {len(self.graph.nodes)} nodes "
            f"in {self.lowering_s:.1f} s, "
            f"store-everything peak {self.store_all_peak / 2**20:.1f} MiB (simulated), footprint price "
            f"{self.graph.proto.provenance.cost_model.peak_byte_s * 2**20 * 1e3:.3f} ms per MiB of peak"
            + (f"; two timelines, store-everything's host busy {self.busy[0] * 1e3:.2f} ms, device "
               f"{self.busy[1] * 1e3:.2f} ms of {self.store_all_time * 1e3:.2f} ms" if self.busy else ""))

    def one_timeline_ratio(self, schedule: ir.pb.Schedule) -> float:
        """The time ratio of `schedule` to store-everything's that one timeline of the nodes'
        `time_s` predicts on a graph costed with two (CUDA): what the model said before IR
        1.9, reported beside the two timelines' figure so that one run compares them."""
        record = self.graph.proto.provenance.cost_model
        record.two_timelines = False
        try:
            if self._store_all_one_timeline is None:
                self._store_all_one_timeline = ir.simulate(self.graph, ir.store_all(self.graph)).total_time_s
            return ir.simulate(self.graph, schedule).total_time_s / self._store_all_one_timeline
        finally:
            record.two_timelines = True

    def _plan(self, solver: str, budget, time_limit_s: float | None, offload: bool = False):
        """(schedule, planning seconds) at `budget`, planned once per (solver, budget,
        offload); InfeasibleBudget (with `planning_s`) if the budget is out of reach.
        `offload`: over the host link the lowering measured
        (`solvers.offload.plan_with_offload`)."""
        key = (solver, budget, offload)
        if key not in self.plans:
            self.plans[key] = plan_once(self.graph, solver, budget, time_limit_s, offload)
        found = self.plans[key]
        if isinstance(found, InfeasibleBudget):
            raise found
        return found

    def prepare(self, requests: list[tuple], time_limit_s: float | None, jobs: int) -> None:
        """Make the plans of `requests` ((solver, budget) or (solver, budget, offload)) that
        are not made yet, `jobs` at a time in processes of their own (each on a copy of the
        graph), so that `method` finds them made. Why: planning is most of the quick
        benchmark's setup (about 250 s of 2 CPU cores' time for two models), and a lent
        GPU machine has 16 cores and minutes. With `jobs` 1 nothing is done ahead: each
        solver then has the whole machine for its time limit."""
        keys = list(dict.fromkeys((r[0], r[1], bool(r[2:] and r[2])) for r in requests))
        keys = [k for k in keys if k not in self.plans]
        if jobs <= 1 or len(keys) < 2:
            return
        import concurrent.futures
        import multiprocessing

        data = self.graph.proto.SerializeToString()
        self.say(f"  planning {len(keys)} plans, {jobs} at a time...")
        # spawn: the parent may hold CUDA, which a forked child cannot use
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {key: pool.submit(_plan_elsewhere, data, *key, time_limit_s) for key in keys}
            for key, future in futures.items():
                found = future.result()
                if found[0] == "infeasible":
                    _, budget_bytes, smallest, seconds = found
                    self.plans[key] = InfeasibleBudget(budget_bytes, smallest)
                    self.plans[key].planning_s = seconds
                else:
                    schedule = ir.pb.Schedule()
                    schedule.ParseFromString(found[1])
                    self.plans[key] = (schedule, found[2])

    def method(self, solver: str, budget: str | int | None, *, time_limit_s: float | None = None,
               label: str | None = None, info: dict | None = None, offload: bool = False) -> Method:
        """Plan at `budget` ("50%", bytes, None for store-everything, "smallest" for the
        lowest budget the solver reaches), with offloading if `offload`, and run with the
        planner's backend; an infeasible budget returns a Method without a step. `label` names the
        budget in the method's name; `info` is recorded with it."""
        from remat_ir.runtimes.torch import ScheduledModule

        backend = self.backend
        label = label or {None: "store-everything", "smallest": "smallest feasible"}.get(budget, budget)
        name = (("remat-ir store-everything" if budget is None else f"remat-ir {solver} {label}")
                + (" + offload" if offload else "") + self.suffix
                + ("" if backend == "eager" else f" [{backend}]"))
        info = {"solver": solver, "budget": label, "cost_model": self.cost_model, "graph_nodes": len(self.graph.nodes),
                "lowering_s": round(self.lowering_s, 2), "store_all_predicted_peak_bytes": self.store_all_peak,
                "backend": backend, "offload": offload,
                "peak_byte_s": self.graph.proto.provenance.cost_model.peak_byte_s, **(info or {})}
        try:
            schedule, planning_s = self._plan(solver, budget, time_limit_s, offload)
        except InfeasibleBudget as exc:
            info.update(status="infeasible", smallest_feasible_bytes=exc.smallest_feasible,
                        planning_s=round(exc.planning_s, 2))
            self.say(f"  {name}: infeasible (smallest feasible {exc.smallest_feasible} bytes)")
            return Method(name, "remat-ir", None, info=info)
        simulated = ir.simulate(self.graph, schedule)
        info.update(planning_s=round(planning_s, 2), budget_bytes=schedule.budget_bytes or None,
                    predicted_peak_bytes=simulated.peak_bytes,
                    predicted_peak_share=round(simulated.peak_bytes / self.store_all_peak, 4),
                    predicted_time_ratio=round(simulated.total_time_s / self.store_all_time, 4),
                    recomputations=simulated.recomputations)
        call = self.graph.proto.provenance.cost_model.call_overhead_s
        if call:  # the prediction as it was before the runtime's time per call was priced
            info.update(call_overhead_s=call, predicted_time_ratio_without_call=round(
                (simulated.total_time_s - call) / (self.store_all_time - call), 4))
        if self.busy:
            info.update(two_timelines=True, store_all_host_busy_s=self.busy[0], store_all_device_busy_s=self.busy[1],
                        predicted_time_ratio_one_timeline=round(self.one_timeline_ratio(schedule), 4))
        if offload:
            info.update(offloads=sum(1 for s in schedule.steps if s.HasField("offload")),
                        transferred_bytes=simulated.transferred_bytes,
                        predicted_stall_s=simulated.stall_s)
        scheduled = ScheduledModule(self.model, self.graph, schedule, backend=backend)
        self.say(f"  {name}: planned in {planning_s:.1f} s, predicted peak "
                 f"{info['predicted_peak_share']:.1%} of store-everything, time x{info['predicted_time_ratio']:.3f}")
        return Method(name, "remat-ir", _stepper(self.model, self.bm.inputs, scheduled), scheduled,
                      planning_s, info)


def plan_once(graph: ir.Graph, solver: str, budget, time_limit_s: float | None, offload: bool):
    """(schedule, planning seconds) of `solver` at `budget` ("50%", bytes, None for
    store-everything, "smallest" for the lowest budget the solver reaches), or the
    InfeasibleBudget it raised, with `planning_s`."""
    options = {"time_limit_s": time_limit_s, **({"offload": True} if offload else {})}
    started = time.perf_counter()
    try:
        if budget == "smallest":
            try:
                schedule = remat_ir.plan(graph, 1, solver, **options)
            except InfeasibleBudget as exc:
                if exc.smallest_feasible is None:
                    raise
                schedule = remat_ir.plan(graph, exc.smallest_feasible, solver, **options)
        else:
            schedule = remat_ir.plan(graph, budget, solver if budget else "autograd", **options)
        return schedule, time.perf_counter() - started
    except InfeasibleBudget as exc:
        exc.planning_s = time.perf_counter() - started
        return exc


def _plan_elsewhere(data: bytes, solver: str, budget, offload: bool, time_limit_s: float | None) -> tuple:
    """`plan_once` in a worker process, on the graph's bytes: ("ok", schedule bytes,
    seconds) or ("infeasible", budget bytes, smallest feasible, seconds)."""
    proto = ir.pb.Graph()
    proto.ParseFromString(data)
    found = plan_once(ir.Graph(proto), solver, budget, time_limit_s, offload)
    if isinstance(found, InfeasibleBudget):
        return "infeasible", found.budget, found.smallest_feasible, found.planning_s
    return "ok", found[0].SerializeToString(), found[1]
