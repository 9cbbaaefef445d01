"""`remat_ir.remat` and `remat_ir.remat_onnx`: lower, plan and wrap a model in one call.

This facade is the only place that wires the layers together (docs/architecture.md):
a frontend (PyTorch, or ONNX through its imported module) lowers the model,
a solver plans it within the budget (`remat_ir.solvers.solve`), and the
PyTorch runtime returns a module that trains as usual.
"""

from __future__ import annotations

import contextlib

from remat_ir.ir import Graph, pb, store_all
from remat_ir.ir.units import human_bytes
from remat_ir.solvers import (DEFAULT_SOLVER, BadRequest, InfeasibleBudget, Progress, check_request,
                              parse_budget, remember_floor, solve)
from remat_ir.solvers.budgets import parse_bandwidth, parse_host_budget
from remat_ir.solvers.offload import describe_link

__all__ = ["remat", "remat_onnx", "scheduled_onnx_module", "plan", "parse_budget", "InfeasibleBudget",
           "DEFAULT_SOLVER", "Planner"]


def plan(graph: Graph, budget=None, solver: str | None = None, *,
         time_limit_s: float | None = None, progress: Progress | None = None,
         **options) -> pb.Schedule:
    """The schedule to train with, stored in the graph: `solver`'s plan for `budget`
    (no budget: autograd's store-everything schedule)."""
    if solver is None:
        solver = "autograd" if budget is None else DEFAULT_SOLVER
    return solve(graph, budget, solver, time_limit_s=time_limit_s, progress=progress, **options)


def _runs_users_code(graph: Graph) -> bool:
    """Whether running `graph`'s ops runs code of the user's: a custom op's kernel, a
    custom Function's forward (ops outside PyTorch's and remat-ir's own namespaces)."""
    return any(not node.op.startswith(("aten.", "prims.", "remat_ir.")) for node in graph.proto.nodes)


def remat(model, example_inputs, budget=None, *, solver: str | None = None,
          example_kwargs: dict | None = None, cost_model: str = "profile",
          time_limit_s: float | None = None, progress: Progress | None = None,
          max_plans: int | None = None, cache_dir=None, offload: bool = False,
          host_bandwidth=None, host_budget=None, gradient_groups: int | None = None,
          backend: str = "eager", reuse_plans: bool = True, in_place: bool = False,
          outputs=None, pure_ops=(), **options):
    """A module that trains like `model` within `budget` of activation memory.

    `example_inputs`: a tuple of positional inputs, a dict of keyword inputs (a
    Hugging Face batch) or one tensor. `budget`: None (no limit), bytes, a size
    ("2GiB"), or a share of the store-everything peak (0.5 or "50%": each input
    shape gets that share of its own peak, or its smallest feasible budget where that is
    more and within the bytes an earlier shape was planned at). `solver`: any name `remat-ir
    solvers` lists (default: hiremate when there is a budget). The returned
    module shares `model`'s parameters and buffers; a call with inputs of a new
    signature (shapes, dtypes, layouts, non-tensor arguments, autocast state, device),
    or whose `attention_mask` or `position_ids` answer transformers' decision whether
    attention needs a mask otherwise (`torchlib.value_guards`), is lowered and planned
    once more, with a notice on stderr (with `reuse_plans`, a plan made for another shape
    is taken where the simulator finds it within the new shape's budget: `solvers.solve`'s
    `reuse`; False plans every shape itself), and up to
    `max_plans` plans are kept (default 8). `cache_dir` (or the environment
    variable REMAT_IR_CACHE_DIR; False: none) keeps profiled graphs and plans on
    disk, so that another process skips profiling and planning
    (`remat_ir.plan_cache`). Its `.graph` and `.schedule` say what it ran last.

    `offload=True` also moves idle activations to host memory and back, on a copy
    stream beside compute (`solvers.offload`), where that is cheaper than recomputing
    them, and reaches budgets below rematerialization's floor. The host link is
    measured on the device, or given as `host_bandwidth` ("25GB/s"); `host_budget`
    (bytes or a size) bounds the host memory the copies take.

    Under torch.distributed (DDP, FSDP2: docs/distributed.md) this is a collective:
    where the ranks' inputs agree, rank 0 lowers and plans and every rank gets its plan;
    where they differ (dynamic padding), each rank plans its own, which DDP takes and
    FSDP2 refuses at the first call. Later calls of a new shape are planned by their
    rank alone under DDP, refused under FSDP2 (FSDPUsageError). `gradient_groups`: how many groups the
    backward hands gradients over in (None: 1 in one process, 16 under
    torch.distributed, so that the reductions overlap the backward).

    `in_place=True` also makes `model(...)` itself run the plan, as `model.compile()` does
    for torch.compile, so that the model stays what training tools are given: Hugging
    Face's Trainer then saves checkpoints with `save_pretrained` (config included) and
    finds label names and unused columns in its `forward`'s signature. Copies and pickles
    of the model are the plain model (of the returned module, routed to it); `model.compile()`
    replaces the routing. As past `model.compile()`, torch.compile of a parent module, or of
    a model of torch's own classes (`nn.Sequential`), traces the model's forward without the
    plan; `nn.DataParallel` replicas all route to the one module: give those the returned one.

    `outputs`: the names or positions of the model's outputs a training call returns, such
    as `["loss"]` for a Hugging Face model trained on its loss alone (None: all). Every
    output returned is held by the caller until the backward, so a plan keeps it whole;
    the others (the logits, often the step's largest tensor) are freed or recomputed like
    any intermediate, and are None in what a training call returns (`model.eval()` or
    `torch.no_grad()` calls run the model as it is and return everything).

    `pure_ops`: custom ops (`torch.library.custom_op` names, "mylib::gelu") whose kernels
    draw from torch's generator alone, or nothing, and keep no state: plans may recompute
    them as they do PyTorch's ops. Others are computed once per step, as eager computes them
    (their kernels may count calls or draw from NumPy), which keeps what they make until the
    backward reads it.

    `backend`: "eager" (default) runs the planned segments op by op; "inductor"
    compiles them with Inductor (fused kernels) while keeping what the plan decided:
    recomputations, frees and random draws (`runtimes/compiled.py`). With "profile"
    costs, the plan is then made on compiled times: profiling runs the store-everything
    step compiled too and shares each region's time among its nodes
    (`runtimes/compiled_costs.py`).
    """
    from remat_ir.frontends.torch import check_arguments_bind, example_arguments
    from remat_ir.runtimes.compiled import check_backend
    from remat_ir.runtimes.torch import MAX_PLANS, ScheduledModule, check_count

    import torch

    if not isinstance(model, torch.nn.Module):
        raise BadRequest(f"model must be a torch.nn.Module, not {type(model).__name__} (wrap a "
                         f"function in a Module whose forward calls it)")
    check_backend(backend)
    if backend == "eager":
        _notice_compiled(model)
    if gradient_groups is not None:  # before minutes of planning
        check_count("gradient_groups", gradient_groups)
    if offload:
        options.update(offload=True, host_budget=host_budget)
    elif host_budget is not None:
        # Found by a review: ignored without a word, the plan then offloading nothing.
        raise BadRequest(f"host_budget={host_budget!r} bounds the host memory offloading uses, "
                         f"and offloading is off: pass offload=True too (or leave host_budget out)")
    if not isinstance(reuse_plans, bool):
        raise BadRequest(f"reuse_plans must be True or False, not {reuse_plans!r}")
    if not isinstance(in_place, bool):
        raise BadRequest(f"in_place must be True or False, not {in_place!r}")
    planner = Planner(budget, solver, cost_model=cost_model, time_limit_s=time_limit_s,
                      progress=progress, options=options, cache_dir=cache_dir,
                      host_bandwidth=host_bandwidth, backend=backend, reuse_plans=reuse_plans,
                      outputs=outputs, pure_ops=pure_ops)
    args, kwargs = example_arguments(example_inputs, example_kwargs)
    check_arguments_bind(model, args, kwargs, example_inputs)
    with _for_training():
        args, kwargs = _usable_in_training((args, kwargs))
        graph, schedule = planner(model, args, kwargs)
    scheduled = ScheduledModule(model, graph, schedule, planner=planner,  # checks it in the simulator
                                max_plans=MAX_PLANS if max_plans is None else max_plans,
                                gradient_groups=gradient_groups, backend=backend)
    if in_place:
        scheduled.route_calls()
    return scheduled


def _notice_compiled(model) -> None:
    """Say, once per call of `remat`, where `torch.compile` applies in `model`: tracing goes
    through its wrappers, and the eager backend runs the plan op by op (gradients bitwise
    those of the uncompiled model), which a user who compiled the model for speed would
    not guess (`frontends/compiled_parts.py`)."""
    from remat_ir.frontends.compiled_parts import compiled_parts
    from remat_ir.runtimes.torch import notify_stderr

    parts = compiled_parts(model)
    if parts:
        shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
        notify_stderr(f"remat-ir: {shown} {'is' if len(parts) == 1 else 'are'} compiled with torch.compile; "
                      f"remat-ir traces the code it wraps and the eager backend runs the plan op "
                      f"by op: pass backend=\"inductor\" to compile the plan's segments")


def _for_training():
    """Gradients on and inference mode off while the model is lowered: the plan is for the
    training calls. `remat` called inside `torch.no_grad()` was refused as if the forward
    detached everything, and inside `torch.inference_mode()` with export's "True != False"
    (found by a review)."""
    import contextlib

    import torch

    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


def _usable_in_training(arguments):
    """`arguments` with each inference tensor (made under `torch.inference_mode()`, which
    tracing cannot take) as a copy that is not one."""
    import torch

    # A torch.Size kept whole: pytree's map makes it a tuple, and lowering refuses it.
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) and t.is_inference() else t, arguments,
        is_leaf=lambda node: isinstance(node, torch.Size))


#: The `solver_params` key marking a shape's floor taken for its share budget
#: (`Planner._floor_of_a_later_shape`): neither reused for other shapes nor stored in the
#: plan cache, where another process would find it without the earlier shapes that allow it.
AT_FLOOR = "at_floor"

#: Plans a `Planner` keeps for calls of new shapes to reuse.
REUSED_PLANS = 8


class Planner:
    """Lowers and plans `model` for one call's inputs, under the autocast state active
    when it is called: what `remat` does first and what its module does for each new
    input signature. Picklable (the progress callback is not kept)."""

    def __init__(self, budget, solver: str | None, *, cost_model: str, time_limit_s: float | None,
                 progress: Progress | None, options: dict, cache_dir=None, host_bandwidth=None,
                 backend: str = "eager", reuse_plans: bool = True, outputs=None, pure_ops=()):
        from remat_ir.frontends.random_ops import check_pure_ops
        from remat_ir.frontends.selected_outputs import check_selection
        from remat_ir.lowering import check_cost_model

        parse_budget(budget, 1)  # a malformed budget fails before the model is traced
        parse_host_budget(options.get("host_budget"), 1)
        if host_bandwidth is not None:
            parse_bandwidth(host_bandwidth)
        self.host_bandwidth = host_bandwidth
        check_cost_model(cost_model, allow_none=False)  # and so does an unknown cost model
        self.budget, self.cost_model = budget, cost_model
        self.solver = solver or ("autograd" if budget is None else DEFAULT_SOLVER)
        check_request(self.solver, time_limit_s,   # and a bad solver, time limit or option
                      {k: v for k, v in options.items() if k not in ("offload", "host_budget")},
                      offload=bool(options.get("offload")))
        self.time_limit_s, self.progress, self.options = time_limit_s, progress, dict(options)
        self.cache_dir, self.backend = cache_dir, backend
        #: The outputs a training call returns (`frontends.selected_outputs`); None: all.
        self.outputs = check_selection(outputs)
        try:   #: The custom ops declared pure (`frontends.random_ops.opaque_custom_op`).
            self.pure_ops = check_pure_ops(pure_ops)
        except ValueError as refused:
            raise BadRequest(str(refused)) from None
        #: The last `REUSED_PLANS` (graph, schedule) pairs its solver made: a call of a new
        #: shape takes one that fits its own graph before planning (`solvers.solve`'s reuse).
        self._solved: list[tuple[Graph, pb.Schedule]] = []
        self.reuse_plans = reuse_plans
        #: Under torch.distributed: whether a plan was made by each rank for its own
        #: inputs, which may differ across ranks (`remat_ir.distributed`).
        self.per_rank = False
        #: The largest budget planned for, in bytes: a later shape's floor within it is
        #: taken where a share budget is below that floor (`_floor_of_a_later_shape`).
        self._largest_budget = 0

    def __getstate__(self):
        return {**self.__dict__, "progress": None, "_solved": []}

    def __setstate__(self, state):
        # Pickled before it kept plans, or before it said whether ranks plan alone.
        self.__dict__.update({"_solved": [], "reuse_plans": True, "per_rank": False, "_largest_budget": 0,
                              "outputs": None, "pure_ops": frozenset(), **state})

    def __call__(self, model, args: tuple, kwargs: dict, *, alone: bool = False,
                 same_plan: bool = False) -> tuple[Graph, pb.Schedule]:
        """Lower and plan. Under torch.distributed, unless `alone`, a collective: rank 0
        does it for every rank where the ranks' inputs agree, each rank for itself where
        they differ, unless `same_plan` (FSDP2), which refuses that
        (`remat_ir.distributed.plan_together`)."""
        from remat_ir.distributed import plan_together
        from remat_ir.runtimes.torch import world_size

        distributed = world_size() > 1
        if distributed:
            self.per_rank = self.per_rank or alone
        if distributed and not alone:
            graph, schedule, per_rank = plan_together(self._lower_and_plan, model, args, kwargs,
                                                      same_plan=same_plan)
            self.per_rank = self.per_rank or per_rank
        else:
            graph, schedule = self._lower_and_plan(model, args, kwargs)
        self._largest_budget = max(self._largest_budget, schedule.budget_bytes)
        return graph, schedule

    def _lower_and_plan(self, model, args: tuple, kwargs: dict) -> tuple[Graph, pb.Schedule]:
        from remat_ir.torchlib.hooks import watching_tools_set_aside

        with watching_tools_set_aside():   # a `FlopCounterMode` around the step's call
            return self._lower_and_plan_unwatched(model, args, kwargs)

    def _say_checkpoints(self, graph: Graph, notify) -> None:
        """Once: a share budget of a model checkpointing blocks itself is a share of the peak
        without those checkpoints (remat-ir traces them as plain calls and plans what to
        recompute), above eager's with them: `budget=0.7` measured 1.10x eager's peak,
        without a word (hunt86 F5)."""
        import json

        blocks = json.loads(graph.proto.metadata.get("torch.checkpointed_blocks") or "[]")
        share = isinstance(self.budget, float) and self.budget <= 1 or \
            isinstance(self.budget, str) and self.budget.strip().endswith("%")
        if not blocks or not share or self.__dict__.get("_checkpoints_said"):
            return
        self._checkpoints_said = True
        more = f" and {len(blocks) - 1} more" if len(blocks) > 1 else ""
        notify(f"remat-ir: the model checkpoints blocks itself (torch.utils.checkpoint at {blocks[0]}{more}), "
               f"which remat-ir traces as plain calls, planning what to recompute: budget={self.budget!r} is a "
               f"share of the peak without those checkpoints, above eager's with them. Remove them (remat-ir "
               f"recomputes for you), or give the budget in bytes")

    def _lower_and_plan_unwatched(self, model, args: tuple, kwargs: dict) -> tuple[Graph, pb.Schedule]:
        import torch

        from remat_ir.frontends.outside_values import user_state_kept
        from remat_ir.frontends.selected_outputs import SelectionError
        from remat_ir.lowering import add_costs, for_backend, lower_torch
        from remat_ir.plan_cache import PlanCache
        from remat_ir.runtimes.torch import notify_stderr

        cache = PlanCache.from_setting(self.cache_dir, warn=notify_stderr)
        try:
            graph = lower_torch(model, args, example_kwargs=kwargs, cost_model=None, backend=self.backend,
                                outputs=self.outputs, pure_ops=self.pure_ops)
        except SelectionError:
            if not self._solved:   # the first call: the selection is wrong
                raise
            # A later call returning none of them (hunt64: Trainer's label smoothing pops the
            # labels and computes the loss from the logits, and was refused): every output.
            notify_stderr(f"remat-ir: outputs={list(self.outputs)!r} selects no output this call returns "
                          f"(a call without labels computes no loss): its plan returns every output")
            graph = lower_torch(model, args, example_kwargs=kwargs, cost_model=None, backend=self.backend,
                                pure_ops=self.pure_ops)
        self._say_checkpoints(graph, notify_stderr)
        graph_key = cache and cache.graph_key(graph, self.cost_model, torch.__version__, self.backend)
        cached = cache and cache.load_graph(graph_key, graph)
        if cached:
            graph = cached
        else:
            # Profiling runs custom ops, which may count their calls: the user's state is put
            # back. Only then (hunt67: a `progress` callback's own counter was put back too).
            with user_state_kept(model) if _runs_users_code(graph) else contextlib.nullcontext():
                reused = self._reuse_before_timing(graph, model, args, kwargs)
                if reused is not None:
                    return reused
                add_costs(graph, self.cost_model, model=model, example=(args, kwargs), progress=self.progress,
                          backend=self.backend)
            if cache:
                cache.store_graph(graph_key, graph)
        graph = for_backend(graph, self.backend)
        if self.host_bandwidth is not None:
            describe_link(graph, self.host_bandwidth)
        if self.options.get("offload") and not graph.proto.provenance.cost_device.startswith("cuda"):
            notify_stderr(f"remat-ir: offloading on {graph.proto.provenance.cost_device or 'cpu'} "
                          "copies activations into host buffers in the same memory: the plan "
                          "runs, exactly, but saves no memory there (offload on a CUDA device)")
        if not cache:
            return graph, self._plan(graph)
        options = dict(self.options, time_limit_s=self.time_limit_s, host_bandwidth=self.host_bandwidth)
        limit = parse_budget(self.budget, store_all(graph).predicted_peak_bytes)
        plan_key, floor_key = cache.plan_key(limit, self.solver, options), cache.floor_key(self.solver, options)
        schedule = cache.load_schedule(graph_key, plan_key, graph, limit)
        if schedule is not None and "reused_from" in schedule.solver_params and not self.reuse_plans:
            schedule = None  # another shape's plan, stored by a process that reused plans
        if schedule is not None:
            schedule = graph.add_schedule(schedule)
            self._remember(graph, schedule)
            return graph, schedule
        floor = cache.load_schedule(graph_key, floor_key, graph)
        if floor is not None:
            remember_floor(graph, self.solver, floor)
        try:
            schedule = self._plan(graph)
        except InfeasibleBudget as refused:
            if refused.schedule is not None:
                cache.store_schedule(graph_key, floor_key, refused.schedule)
            raise
        if AT_FLOOR not in schedule.solver_params:   # taken for this process's earlier shapes only
            cache.store_schedule(graph_key, plan_key, schedule)
        return graph, schedule

    def _reuse_before_timing(self, graph: Graph, model, args: tuple, kwargs: dict
                             ) -> tuple[Graph, pb.Schedule] | None:
        """(graph, plan) where a plan made for another shape fits this one by its memory
        facts alone (`solvers.reusable`): the graph then gets the isolated runs' memory
        facts and the source's in-step times scaled to its shapes
        (`profiling.scale_profile`), and its store-everything step is not timed (most of
        profiling). None where no plan fits (then `graph` is left without costs, to be
        profiled as usual) or where this does not apply: other cost models, the inductor
        backend (its costs are compiled regions'), offloading (transfers are timed per
        graph), a planner that does not reuse plans."""
        from remat_ir.lowering import add_costs
        from remat_ir.runtimes.profiling import scale_profile
        from remat_ir.solvers import reusable

        if not (self.reuse_plans and self._solved and self.cost_model == "profile"
                and self.backend == "eager" and not self.options.get("offload")):
            return None
        measured = pb.Graph()
        measured.CopyFrom(graph.proto)
        measured = Graph(measured)
        add_costs(measured, "isolated", model=model, example=(args, kwargs), progress=self.progress)
        peak = store_all(measured).predicted_peak_bytes
        found = reusable(measured, self.solver, parse_budget(self.budget, peak), peak, self._solved[::-1])
        if found is None:
            return None
        schedule, source = found
        scale_profile(measured, source, schedule.solver_params["reused_from"])
        if self.host_bandwidth is not None:
            describe_link(measured, self.host_bandwidth)
        planned = next(s for g, s in self._solved if g is source)
        return measured, plan(measured, self.budget, self.solver, time_limit_s=self.time_limit_s,
                              progress=self.progress, reuse=[(source, planned)], **self.options)

    def _plan(self, graph: Graph) -> pb.Schedule:
        try:
            schedule = plan(graph, self.budget, self.solver, time_limit_s=self.time_limit_s,
                            progress=self.progress, reuse=self._solved[::-1], **self.options)
        except InfeasibleBudget as refused:
            schedule = self._floor_of_a_later_shape(graph, refused)
            if schedule is None:
                raise
        self._remember(graph, schedule)
        return schedule

    def _floor_of_a_later_shape(self, graph: Graph, refused: InfeasibleBudget) -> pb.Schedule | None:
        """The smallest feasible plan of a shape met after the first, where a share budget
        is below it and it peaks within the bytes an earlier shape was planned at; None
        otherwise (a byte budget, the first call, a floor above what was planned).

        Why: a share is of each shape's own peak, and a smaller batch's peak is mostly its
        parameter gradients, which no schedule frees. The last batch of an epoch (a
        DataLoader without `drop_last`, Hugging Face's default) was refused mid-training,
        after the epoch's work, for a budget that every full batch met; taken at its floor,
        it needs no more memory than the steps before it."""
        from remat_ir.runtimes.torch import notify_stderr
        from remat_ir.solvers.budgets import is_share

        floor, planned = refused.smallest_feasible, self._largest_budget
        if not (is_share(self.budget) and planned and floor is not None and floor <= planned):
            return None
        try:
            schedule = plan(graph, floor, self.solver, time_limit_s=self.time_limit_s,
                            progress=self.progress, **self.options)
        except InfeasibleBudget:
            raise refused from None   # the user's budget, not the floor, is what was refused
        schedule.solver_params[AT_FLOOR] = "true"
        notify_stderr(f"remat-ir: {refused}; planned at that smallest budget instead, within the "
                      f"{human_bytes(planned)} planned for an earlier shape (a share budget is of "
                      f"each shape's own peak; bytes bound every shape alike, and are refused "
                      f"where they do not fit)")
        return schedule

    def _remember(self, graph: Graph, schedule: pb.Schedule) -> None:
        """Keep a plan the solver made (here or in an earlier process: the plan cache) for
        new shapes to reuse; not one that was itself reused, nor a shape's floor taken for
        its share budget (its budget in bytes, a large share, would let shapes of nearby
        peaks reuse the plan that recomputes most)."""
        if self.reuse_plans and not {"reused_from", AT_FLOOR} & set(schedule.solver_params):
            self._solved = (self._solved + [(graph, schedule)])[-REUSED_PLANS:]


def remat_onnx(model_or_path, example_inputs=None, budget=None, *, solver: str | None = None,
               trainable="initializers", cost_model: str = "profile",
               time_limit_s: float | None = None, progress: Progress | None = None, **options):
    """A trainable module running an ONNX model within `budget` bytes of activation memory.

    `model_or_path`: a path, bytes or `onnx.ModelProto`. `example_inputs` (a tuple in graph
    order, a dict by input name, or one tensor) fix dynamic dimensions such as batch and
    sequence length. The module's parameters are the model's float initializers that feed
    a differentiable op, by ONNX name (`trainable`: see `remat_ir.frontends.onnx.to_torch`);
    its forward takes the graph inputs positionally in graph order or by name and returns
    the graph outputs (the tensor when there is one, else a tuple). `budget` and `solver`
    are as for `remat`.
    """
    from remat_ir.frontends.onnx import to_torch
    from remat_ir.lowering import check_cost_model, lower_onnx_module

    check_cost_model(cost_model, allow_none=False)
    module, examples = to_torch(model_or_path, example_inputs, trainable=trainable)
    graph = lower_onnx_module(module, examples, cost_model=cost_model)
    schedule = plan(graph, budget, solver, time_limit_s=time_limit_s, progress=progress, **options)
    return scheduled_onnx_module(module, graph, schedule)


def scheduled_onnx_module(module, graph: Graph, schedule: pb.Schedule):
    """An imported ONNX module (`frontends.onnx.to_torch`) trained through `schedule` of its
    lowered `graph` (`remat_ir.lowering.lower_onnx_module`): what `remat_onnx` returns, for callers
    that lower once and plan themselves."""
    return _onnx_scheduled_class()(module, graph, schedule)


_ONNX_SCHEDULED = None


def _onnx_scheduled_class():
    """`ScheduledModule` taking the ONNX graph's inputs by position or name (made on first use,
    so that importing this module does not import torch)."""
    global _ONNX_SCHEDULED
    if _ONNX_SCHEDULED is None:
        from remat_ir.runtimes.torch import ScheduledModule

        class OnnxScheduledModule(ScheduledModule):
            """An ONNX model trained through a schedule; inputs in graph order or by name."""

            #: The import evaluates the graph's shape computations for its example inputs,
            #: so inputs of other shapes need the graph imported again.
            lower_again = ("call remat_ir.remat_onnx with inputs like these (the import "
                           "evaluates the graph's shape computations for its example inputs)")

            def forward(self, *args, **kwargs):
                return super().forward(*self._model.positional_inputs(args, kwargs))

        _ONNX_SCHEDULED = OnnxScheduledModule
    return _ONNX_SCHEDULED
