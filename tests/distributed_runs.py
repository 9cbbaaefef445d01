"""Two-process training runs (gloo, CPU) for tests/test_distributed.py.

`run_all` is what each spawned rank runs: every case in turn, under DDP or FSDP2,
against a reference computed in the same process by eager PyTorch over the
global batch, shard by shard (gradients accumulated with the loss divided by
the world size: what DDP and FSDP compute, BatchNorm statistics per shard
included). Each case's worst relative gradient error and what went wrong are
written by rank 0 to a JSON file the test reads.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import socket
import traceback

import torch
import torch.distributed as dist
from torch.distributed import all_reduce, get_rank

STEPS = 2
#: The plan cache every case's `remat` shares (`run_all` sets it beside the results file):
#: the first case of each model plans under torch.distributed, the others (the same graph
#: and budget) load that plan, as a user's second run would. Planning GPT-2 five times and
#: the CNN twice was 28 s of the 75 s spawn.
_cache_dir = None
SEED = 1234
BUDGET = 0.75  # of the store-everything peak: below it for both models, above their floors (the CNN shard: 73.9%)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpt2():
    from torch_models import gpt2

    model, _, kwargs, loss_of = gpt2(n_layer=2, n_embd=32, seq=16, batch=4)
    ids = kwargs["input_ids"]
    return model, (lambda shard: ((), dict(input_ids=shard, labels=shard, use_cache=False))), ids, loss_of, \
        lambda m: list(m.transformer.h)


def _cnn():
    from zoo_models import cnn_batchnorm

    model, (x, labels), _, loss_of = cnn_batchnorm()
    batch = torch.cat([x, labels.float()[:, None, None, None].expand(-1, 1, *x.shape[2:])], 1)

    def split(shard):
        return (shard[:, :3].contiguous(), shard[:, 3, 0, 0].long()), {}
    return model, split, batch, loss_of, lambda m: [m.body[0], m.body[4], m.body[-1]]


def _llama():
    """Grouped-query attention with an attention mask that pads rank 1's rows and not rank
    0's: transformers decides from its values whether attention needs a mask, which one
    process answers per batch (`torchlib.value_guards`) and ranks, planning together,
    cannot: the traced answer (a mask) serves both."""
    from torch_models import llama

    model, _, kwargs, loss_of = llama(n_layer=2, seq=32, batch=4)
    ids = kwargs["input_ids"].clamp(min=1)
    ids[2:, 28:] = 0   # rank 1's shard: four padding tokens per row
    return model, (lambda shard: ((), dict(input_ids=shard, labels=shard, attention_mask=(shard != 0).long()))), \
        ids, loss_of, lambda m: list(m.model.layers)


CASES = {"gpt2": _gpt2, "cnn": _cnn, "llama": _llama}


def _reference(model, split, batch, loss_of, world: int) -> list[dict[str, torch.Tensor]]:
    """Gradients per step of eager training over the global batch, shard by shard."""
    from exactness import copy_model   # deepcopy refuses weights hooks compute

    eager = copy_model(model)
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    grads = []
    for step in range(STEPS):
        for rank, shard in enumerate(batch.chunk(world)):
            torch.manual_seed(SEED + 100 * step + rank)
            args, kwargs = split(shard)
            (loss_of(eager(*args, **kwargs)) / world).backward()
        grads.append({n: p.grad.clone() for n, p in eager.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-30)
    return (a.double() - b.double()).abs().max().item() / scale


def _train_case(name: str, wrapper: str, rank: int, world: int) -> dict:
    import remat_ir
    from remat_ir.runtimes.torch import gradient_nodes
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    model, split, batch, loss_of, units_of = CASES[name]()
    reference = _reference(model, split, batch, loss_of, world)
    shard = batch.chunk(world)[rank]
    args, kwargs = split(shard)
    scheduled = remat_ir.remat(model, args, budget=BUDGET, example_kwargs=kwargs, cost_model="flops",
                               cache_dir=_cache_dir)
    schedules: list = [None] * world
    dist.all_gather_object(schedules, scheduled.schedule.SerializeToString())
    if wrapper == "ddp":
        trained = DistributedDataParallel(scheduled)
    else:
        for unit in units_of(model):
            fully_shard(unit)
        trained = fully_shard(scheduled)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9)
    names = [n for n, _ in model.named_parameters()]
    worst, early = 0.0, []
    for step in range(STEPS):
        at_rest = list(trained.parameters())  # under FSDP, the shards (gathered ones differ)
        torch.manual_seed(SEED + 100 * step + rank)
        loss = loss_of(trained(*args, **kwargs))
        # Gradients reduced (DDP: accumulated; FSDP: reduce-scattered into the shards)
        # before the last group's node runs: they left the backward segment early.
        last = gradient_nodes(loss)[-1]
        last.register_prehook(lambda _: early.append(
            sum(p.grad is not None for p in at_rest)))
        loss.backward()
        for n, p in zip(names, trained.parameters()):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            worst = max(worst, _relative(grad, reference[step][n]))
        optimizer.step()
        optimizer.zero_grad()
    return {"worst_relative_error": worst, "same_schedule_on_all_ranks": len(set(schedules)) == 1,
            "groups": len(scheduled.runner(shard.device).plan.gradient_groups),
            "reduced_before_last_group": early, "parameters": len(names),
            "value_guards": [g.proto.metadata.get("torch.value_guards", "") for g, _ in scheduled.plans]}


#: Dynamic padding: each rank's rows are padded to its own batch's longest, so lengths
#: differ across ranks and a rank meets a new one at a step where the other does not.
RAGGED_LENGTHS = [[16, 12, 12, 16], [12, 12, 16, 16]]


def _ragged_ddp(rank: int, world: int) -> dict:
    """GPT-2 under DDP, each rank's batches of its own lengths (`RAGGED_LENGTHS`), against
    eager over the same shards. Every call of a new length on one rank was a collective
    before, and ranks of different shapes were refused (`RankMismatch`)."""
    import remat_ir
    from torch.nn.parallel import DistributedDataParallel

    model, split, ids, loss_of, _ = _gpt2()
    steps = len(RAGGED_LENGTHS[0])

    def shard(step, of_rank):
        return split(ids.chunk(world)[of_rank][:, :RAGGED_LENGTHS[of_rank][step]].contiguous())

    eager = copy.deepcopy(model)
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    reference = []
    for step in range(steps):
        for other in range(world):
            torch.manual_seed(SEED + 100 * step + other)
            args, kwargs = shard(step, other)
            (loss_of(eager(*args, **kwargs)) / world).backward()
        reference.append({n: p.grad.clone() for n, p in eager.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    args, kwargs = shard(0, rank)
    scheduled = remat_ir.remat(model, args, budget=BUDGET, example_kwargs=kwargs, cost_model="flops")
    trained = DistributedDataParallel(scheduled)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9)
    worst = 0.0
    for step in range(steps):
        torch.manual_seed(SEED + 100 * step + rank)
        args, kwargs = shard(step, rank)
        loss_of(trained(*args, **kwargs)).backward()
        for n, p in model.named_parameters():
            worst = max(worst, _relative(p.grad, reference[step][n]))
        optimizer.step()
        optimizer.zero_grad()
    return {"worst_relative_error": worst, "plans": len(scheduled.plans),
            "inputs": sorted({json.loads(g.proto.metadata["torch.inputs"])[0] for g, _ in scheduled.plans})}


def _ragged_fsdp(rank: int, world: int) -> dict:
    """Ranks that called `remat` with batches of different sizes each planned their own:
    under FSDP2, which needs one plan, every rank gets one clear error at the first call."""
    import remat_ir
    from torch.distributed.fsdp import fully_shard

    model, split, batch, _, units_of = _gpt2()
    args, kwargs = split(batch[: 2 + rank])
    scheduled = remat_ir.remat(model, args, budget=BUDGET, example_kwargs=kwargs, cost_model="flops")
    for unit in units_of(model):
        fully_shard(unit)
    trained = fully_shard(scheduled)
    try:
        trained(*args, **kwargs)
    except remat_ir.ir.RematIRError as error:
        return {"error": str(error), "type": type(error).__name__}
    return {"error": None}


def _fsdp_misuse(rank: int, world: int) -> dict:
    """FSDP applied where the scheduled step cannot reduce or run: one error each."""
    import remat_ir
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def attempt(shard_them):
        model, split, batch, loss_of, units_of = CASES["gpt2"]()
        args, kwargs = split(batch.chunk(world)[rank])
        scheduled = remat_ir.remat(model, args, budget=BUDGET, example_kwargs=kwargs,
                                   cost_model="flops", cache_dir=_cache_dir)
        trained = shard_them(model, scheduled, units_of(model))
        try:
            loss_of(trained(*args, **kwargs)).backward()
        except remat_ir.ir.RematIRError as error:
            return {"type": type(error).__name__, "error": str(error)}
        return {"error": None}

    def root_is_model(model, scheduled, units):
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        return scheduled

    def no_root(model, scheduled, units):
        for unit in units:
            fully_shard(unit)
        return scheduled

    def param_dtype(model, scheduled, units):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for unit in units:
            fully_shard(unit, mp_policy=policy)
        return fully_shard(scheduled, mp_policy=policy)

    return {f.__name__: attempt(f) for f in (root_is_model, no_root, param_dtype)}


def _fsdp_new_shape(rank: int, world: int) -> dict:
    """A module sharded by FSDP2 meets a batch of another size (an epoch's last batch):
    lowering it again would run its units' gathers on the planning rank alone, and every
    rank hung (found by a review). Every rank gets one clear error instead."""
    import remat_ir
    from torch.distributed.fsdp import fully_shard

    model, split, batch, loss_of, units_of = CASES["gpt2"]()
    shard = batch.chunk(world)[rank]
    args, kwargs = split(shard)
    scheduled = remat_ir.remat(model, args, budget=BUDGET, example_kwargs=kwargs, cost_model="flops",
                               cache_dir=_cache_dir)
    for unit in units_of(model):
        fully_shard(unit)
    trained = fully_shard(scheduled)
    loss_of(trained(*args, **kwargs)).backward()
    args, kwargs = split(shard[:1])
    try:
        loss_of(trained(*args, **kwargs)).backward()
    except remat_ir.ir.RematIRError as error:
        return {"type": type(error).__name__, "error": str(error)}
    return {"error": None}


class _ScaledPerRank(torch.nn.Module):
    """A plain tensor attribute (no buffer) of its own value on each rank."""

    def __init__(self, rank: int):
        super().__init__()
        self.fc, self.scale = torch.nn.Linear(4, 4), torch.tensor(float(rank + 1))

    def forward(self, x):
        return (self.fc(x) * self.scale).square().mean()


def _held_tensor_per_rank(rank: int, world: int) -> dict:
    """Rank 0 lowers for every rank, so the graph holds rank 0's tensor: rank 1 was told
    its tensor "holds other values than it held when the model was lowered", which it
    never changed (found by a review), then that rank 0 lowered it. Since hunt66 a held
    tensor that differs is planned for, as a plain value is: each rank its own."""
    import remat_ir

    torch.manual_seed(0)
    model, x = _ScaledPerRank(rank), torch.randn(2, 4)
    eager = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops")
    try:
        scheduled(x).backward()
    except remat_ir.ir.RematIRError as error:
        return {"type": type(error).__name__, "error": str(error)}
    eager(x).backward()
    return {"error": None, "worst": max((a.grad - b.grad).abs().max().item()
                                        for a, b in zip(eager.parameters(), model.parameters()))}


class _RankScaled(torch.nn.Module):
    """A forward reading its rank (a per-rank scale)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * (1.0 + dist.get_rank())).square().mean()


class _RankScaledByName(_RankScaled):
    """The rank read through a name bound before tracing (`from torch.distributed import
    get_rank`), which calls the function past the attribute tracing watches."""

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * (1.0 + get_rank())).square().mean()


def _rank_read(rank: int, world: int) -> dict:
    """Rank 0 lowers for every rank, so the graph held its rank number and rank 1 trained
    with it: outputs 0.135 off eager DDP's, silently (found by a review). Rank 1 now finds
    the rank it reads differs and plans its own. Returns the largest gradient difference
    from eager DDP's over two steps, and what rank 1 was told."""
    import io
    import contextlib as cl

    import remat_ir
    from torch.nn.parallel import DistributedDataParallel as DDP

    said, worst = io.StringIO(), 0.0
    for kind in (_RankScaled, _RankScaledByName):
        torch.manual_seed(0)
        model = kind()
        eager = DDP(copy.deepcopy(model))
        with cl.redirect_stderr(said):
            scheduled = DDP(remat_ir.remat(model, (torch.randn(3, 4),), solver="recompute-all", cost_model="flops"))
            for step in range(2):
                x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * step + rank))
                for m in (eager, scheduled):
                    m.zero_grad()
                    m(x).backward()
                worst = max([worst] + [(p.grad - q.grad).abs().max().item()
                                       for p, q in zip(eager.parameters(), scheduled.parameters())])
    return {"worst": worst, "said": said.getvalue()}


class AllReducing(torch.nn.Module):
    """A forward all-reducing a statistic (as SyncBatchNorm does), through
    `dist.all_reduce` or, `by_name`, a name this file bound before tracing."""

    def __init__(self, by_name: bool = False):
        super().__init__()
        self.a, self.by_name = torch.nn.Linear(4, 4), by_name

    def forward(self, x):
        h = self.a(x)
        mean = h.detach().mean(0)
        (all_reduce if self.by_name else dist.all_reduce)(mean)
        return (h - mean).square().mean()


def _collective_in_forward(rank: int, world: int) -> dict:
    """Rank 0 lowered alone while rank 1 waited for its plan in a broadcast: the forward's
    all-reduce met that broadcast, and both ranks hung until the group's timeout (found by
    a review). Now refused on rank 0 before it runs, and said on every rank."""
    import remat_ir

    try:
        remat_ir.remat(AllReducing(), (torch.randn(3, 4),), solver="recompute-all", cost_model="flops")
    except remat_ir.ir.RematIRError as error:
        return {"type": type(error).__name__, "error": str(error)}
    return {"error": None}


class _BranchOnLabels(torch.nn.Module):
    """A branch on the caller's values (FSMT's `if not padding_mask.any()`)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x, labels):
        if (labels == 0).any():
            x = x * (labels != 0)[:, None]
        return torch.nn.functional.cross_entropy(self.b(torch.tanh(self.a(x))), labels)


def _input_branch(rank: int, world: int) -> dict:
    """Refused under torch.distributed with "cannot depend on tensor values", which one
    process trains (found by a review). Rank 0's batch holds a label 0 at the first step
    and rank 1's none: rank 1 answers otherwise and plans its own. Returns the largest
    gradient difference from eager DDP's over two steps."""
    import remat_ir
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = _BranchOnLabels()
    eager = DDP(copy.deepcopy(model))
    batches = [(torch.randn(4, 4), torch.tensor([[0, 1, 2, 1], [1, 2, 2, 1]][rank])),
               (torch.randn(4, 4), torch.tensor([1, 0, 2, 2]))]
    scheduled = DDP(remat_ir.remat(model, batches[0], solver="recompute-all", cost_model="flops"))
    worst = 0.0
    for batch in batches:
        for m in (eager, scheduled):
            m.zero_grad()
            m(*batch).backward()
        worst = max([worst] + [(p.grad - q.grad).abs().max().item()
                               for p, q in zip(eager.parameters(), scheduled.parameters())])
    return {"worst": worst}


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.a(h), self.b(h)


def _ddp_head_left_out(rank: int, world: int) -> dict:
    """A loss that reads head b at the first step only, under DDP with and without
    `find_unused_parameters`, for eager and remat-ir: the step at which DDP raises (eager's
    reducer waits for b's gradient hooks, which its backward never runs), or the weights
    after 3 AdamW steps. The step's nodes took every parameter, so autograd ran b's hooks
    with no gradient: DDP reduced zeros into b.grad, which AdamW's decay applied, where
    eager raises (found by a review)."""
    import remat_ir

    results = {}
    for find_unused in (False, True):
        torch.manual_seed(0)
        model, x = _TwoHeads(), torch.randn(4, 8) + rank
        runs = {"eager": copy.deepcopy(model),
                "remat": remat_ir.remat(model, (x,), solver="recompute-all", cost_model="flops",
                                        cache_dir=_cache_dir)}
        for name, module in runs.items():
            ddp = torch.nn.parallel.DistributedDataParallel(module, find_unused_parameters=find_unused)
            optimizer = torch.optim.AdamW(ddp.parameters(), lr=0.1, weight_decay=0.1)
            raised = None
            for step in range(3):
                try:
                    a, b = ddp(x)
                except RuntimeError as error:
                    raised = (step, "Expected to have finished reduction" in str(error))
                    break
                (a.square().mean() + (b.square().mean() if step == 0 else 0)).backward()
                optimizer.step()
                optimizer.zero_grad()
            results[f"{name}-{find_unused}"] = {
                "raised": raised, "weights": [p.detach().flatten().tolist() for p in module.parameters()]}
            del ddp
            gc.collect()
    return results


def _fsdp_head_left_out_with_hooks(rank: int, world: int) -> dict:
    """FSDP2 around eager and around remat-ir, post-accumulate hooks on every (sharded)
    parameter: the parameters whose hooks run and whose gradient is None at a step whose
    loss reads both heads, then at one that leaves head b out."""
    import remat_ir
    from torch.distributed.fsdp import fully_shard

    results = {}
    for name in ("eager", "remat"):
        torch.manual_seed(0)
        model, x = _TwoHeads(), torch.randn(4, 8) + rank
        trained = model if name == "eager" else remat_ir.remat(model, (x,), solver="recompute-all",
                                                                cost_model="flops", cache_dir=_cache_dir)
        fully_shard(model.a)
        fully_shard(model.b)
        trained = fully_shard(trained)
        calls = []
        for n, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, n=n: calls.append(n))
        steps = []
        for heads in (2, 1):
            trained.zero_grad(set_to_none=True)
            a, b = trained(x)
            try:
                (a.square().mean() + (b.square().mean() if heads == 2 else 0)).backward()
            except Exception as error:
                steps.append({"error": f"{type(error).__name__}: {error}"})
                break
            steps.append({"hooks": sorted(calls), "no_grad": sorted(n for n, p in model.named_parameters()
                                                                     if p.grad is None)})
            calls.clear()
        results[name] = steps
    return results


class _Layers(torch.nn.Module):
    """Six FSDP units: linear layers of 256 x 256 and GELU."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                          for _ in range(6))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.mse_loss(self.head(x), y)


def _fsdp_gathered_at_once(rank: int, world: int) -> dict:
    """The most units holding gathered parameters at any gather, through a training step
    with recomputation, observed on the modules themselves (a gathered parameter is a
    plain tensor, a sharded one a DTensor)."""
    import remat_ir
    from remat_ir.ir import pb
    from remat_ir.runtimes import fsdp
    from torch.distributed.tensor import DTensor
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _Layers()
    x, y = torch.randn(512, 256), torch.randn(512, 1)
    scheduled = remat_ir.remat(model, (x, y), budget=0.5, cost_model="flops", cache_dir=_cache_dir)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(scheduled)
    counts = []
    gather = fsdp.StepUnits.gather

    def observed(self, unit, following=None):
        result = gather(self, unit, following)
        counts.append(sum(not isinstance(layer[0].weight, DTensor) for layer in model.layers))
        return result
    fsdp.StepUnits.gather = observed
    try:
        loss = scheduled(x, y)
        forward = len(counts)
        loss.backward()
    finally:
        fsdp.StepUnits.gather = gather
    recomputed = sum(1 for s in scheduled.schedule.steps[scheduled.schedule.backward_start:]
                     if s.HasField("compute") and scheduled.graph.node(s.compute).phase == pb.FORWARD)
    return {"forward": counts[:forward], "backward": counts[forward:], "recomputations": recomputed}


class _Hooked(torch.nn.Module):
    """An LSTM (oneDNN's layer on CPU), a Linear under the hook-based `weight_norm` and one
    under `spectral_norm` (whose power iteration updates buffers in place), dropout."""

    def __init__(self):
        super().__init__()
        import warnings

        self.embed, self.rnn = torch.nn.Embedding(50, 32), torch.nn.LSTM(32, 32, batch_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # weight_norm's deprecation
            self.proj = torch.nn.utils.weight_norm(torch.nn.Linear(32, 32))
        self.disc = torch.nn.utils.spectral_norm(torch.nn.Linear(32, 32))
        self.head = torch.nn.Linear(32, 50)

    def forward(self, ids):
        h = self.rnn(self.embed(ids))[0]
        h = torch.nn.functional.dropout(self.proj(h).relu(), 0.1) + self.disc(h).tanh()
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


def _hooked_beside_eager(rank: int, world: int) -> dict:
    """`_Hooked` under DDP and under FSDP2 (the hooked Linears as units), beside eager
    under the same wrapper in the same process: {wrapper: what is not bitwise equal after
    each of 3 steps (gradients, buffers, the weights the hooks left on their modules)}.
    Beside eager, not the one-process reference: DDP broadcasts rank 0's buffers at every
    forward, and spectral_norm's power iteration reads them."""
    import remat_ir
    from exactness import copy_model
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    def whole(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    results = {}
    for wrapper in ("ddp", "fsdp"):
        torch.manual_seed(SEED)
        model, ids = _Hooked(), torch.randint(0, 50, (4, 32))
        shard = ids.chunk(world)[rank]
        eager = copy_model(model)
        scheduled = remat_ir.remat(model, (shard,), budget=0.97, cost_model="flops", cache_dir=False)
        if wrapper == "ddp":
            pair = [DistributedDataParallel(eager), DistributedDataParallel(scheduled)]
        else:
            for m in (eager, model):
                fully_shard(m.proj), fully_shard(m.disc)
            pair = [fully_shard(eager), fully_shard(scheduled)]
        optimizers = [torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9) for t in pair]
        differ = []
        for step in range(3):
            for trained in pair:
                torch.manual_seed(SEED + 100 * step + rank)
                trained(shard).backward()
            named = list(eager.named_parameters()) + list(eager.named_buffers())
            for (name, a), b in zip(named, list(pair[1].parameters()) + list(model.buffers())):
                a, b = (whole(a.grad), whole(b.grad)) if isinstance(a, torch.nn.Parameter) else (whole(a), whole(b))
                if not torch.equal(a, b):
                    differ.append(f"step {step} {name}")
            for name in ("proj", "disc"):
                if not torch.equal(getattr(eager, name).weight, getattr(model, name).weight):
                    differ.append(f"step {step} {name}.weight left on the module")
            for optimizer in optimizers:
                optimizer.step(), optimizer.zero_grad()
        results[wrapper] = differ
    return results


def run_all(rank: int, world: int, port: int, out: str) -> None:
    global _cache_dir
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KINETO_LOG_LEVEL="6")
    _cache_dir = f"{out}.plans"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    try:
        for name in CASES:
            for wrapper in ("ddp", "fsdp"):
                try:
                    results[f"{name}-{wrapper}"] = _train_case(name, wrapper, rank, world)
                except Exception:
                    results[f"{name}-{wrapper}"] = {"failure": traceback.format_exc()}
        for name, case in (("ragged_ddp", _ragged_ddp), ("ragged_fsdp", _ragged_fsdp)):
            try:
                results[name] = case(rank, world)
            except Exception:
                results[name] = {"failure": traceback.format_exc()}
        results["fsdp_misuse"] = _fsdp_misuse(rank, world)
        results["fsdp_new_shape"] = _fsdp_new_shape(rank, world)
        results["fsdp_gathers"] = _fsdp_gathered_at_once(rank, world)
        results["held_per_rank"] = _held_tensor_per_rank(rank, world)
        for name, case in (("rank_read", _rank_read), ("collective_in_forward", _collective_in_forward),
                           ("input_branch", _input_branch)):
            try:
                results[name] = case(rank, world)
            except Exception:
                results[name] = {"failure": traceback.format_exc()}
        results["ddp_head_left_out"] = _ddp_head_left_out(rank, world)
        results["fsdp_head_left_out"] = _fsdp_head_left_out_with_hooks(rank, world)
        try:
            results["hooked"] = _hooked_beside_eager(rank, world)
        except Exception:
            results["hooked"] = {"failure": traceback.format_exc()}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        # DDP and FSDP objects sit in reference cycles: collected later, after the process
        # group is gone, their destructors abort the process. Collect them now; and a rank
        # that leaves first would cut the other's gloo work short.
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
