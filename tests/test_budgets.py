"""The smallest feasible budget a refusal names is feasible when asked for: with the same
lowering, and with another lowering whose times differ (profiling noise steers solvers)."""

from __future__ import annotations

import random

import pytest
import torch

from remat_ir import ir, solvers
from remat_ir.lowering import lower_torch
from torch_models import gpt2


def _noisy_copy(graph: ir.Graph, seed: int) -> ir.Graph:
    """Another lowering of the same model as profiling noise makes it: same structure,
    every node's time scaled by a random factor in [0.01, 100]."""
    copy = ir.Graph(ir.loads(ir.dumps(graph)).proto)
    del copy.proto.schedules[:]
    rng = random.Random(seed)
    for node in copy.proto.nodes:
        node.cost.time_s *= 10 ** rng.uniform(-2, 2)
    return copy


def _relowered_copy(graph: ir.Graph) -> ir.Graph:
    """Another lowering of the same model after a call changed an attribute its forward
    reads (transformers' classifiers set `config.problem_type`): the same graph but for the
    attributes recorded in its metadata."""
    copy = ir.Graph(ir.loads(ir.dumps(graph)).proto)
    del copy.proto.schedules[:]
    copy.proto.metadata["torch.object_attributes"] = '[["", "config", "problem_type", "regression"]]'
    return copy


@pytest.fixture(scope="module")
def lowered_gpt2():
    """GPT-2 with one block and FLOP costs, lowered once for the module (tracing is most of
    these tests' time); each test plans on its own copy (`gpt2_graph`)."""
    model, args, kwargs, _ = gpt2(n_layer=1, n_embd=32, seq=16, batch=2)
    return lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")


@pytest.fixture
def gpt2_graph(lowered_gpt2):
    return ir.loads(ir.dumps(lowered_gpt2))


@pytest.mark.parametrize("solver", ["hiremate", "rotor"])
def test_named_floor_is_feasible_when_asked_for(solver, gpt2_graph):
    graph = gpt2_graph
    options = dict(time_limit_s=5) if solver != "rotor" else {}
    with pytest.raises(solvers.InfeasibleBudget) as refused:
        solvers.solve(graph, 1, solver, **options)
    floor = refused.value.smallest_feasible
    assert floor is not None and floor > 1
    assert ir.simulate(graph, refused.value.schedule).peak_bytes == floor
    for other in (graph, _noisy_copy(graph, 1), _noisy_copy(graph, 2), _relowered_copy(graph)):
        schedule = solvers.solve(other, floor, solver, **options)
        assert ir.simulate(other, schedule, budget=floor).valid
        assert ir.simulate(other, schedule).peak_bytes <= floor
        # Below the floor, the refusal names the same floor (or a lower one just found).
        with pytest.raises(solvers.InfeasibleBudget) as again:
            solvers.solve(other, 1, solver, **options)
        assert again.value.smallest_feasible <= floor


class _CausalAttention(torch.nn.Module):
    """Two causal attention blocks with dropout: 212 nodes, which checkmate's MILP cannot
    solve within seconds."""

    def __init__(self):
        super().__init__()
        self.qkv, self.mid, self.out = (torch.nn.Linear(32, 96), torch.nn.Linear(32, 32),
                                        torch.nn.Linear(32, 1))

    def forward(self, x, y):
        b, t, _ = x.shape
        for _ in range(2):
            q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            x = x + torch.tanh(self.mid(a.transpose(1, 2).reshape(b, t, 32)))
        return torch.nn.functional.mse_loss(self.out(x), y)


def test_a_floor_named_is_remembered_for_a_lowering_differing_only_in_metadata(gpt2_graph):
    """The plan a refusal named is what `solve` falls back on when the solver, asked for
    that floor, finds nothing within it; a lowering after a call that changed an attribute
    (`_relowered_copy`) is the same graph to plan, and gets it too."""
    from remat_ir.solvers import _FLOORS, known_floor

    _FLOORS.clear()
    with pytest.raises(solvers.InfeasibleBudget) as refused:
        solvers.solve(gpt2_graph, 1, "rotor")
    known = known_floor(_relowered_copy(gpt2_graph), "rotor")
    assert known is not None and known.predicted_peak_bytes == refused.value.smallest_feasible


def test_hiremates_floor_polished_to_the_budget_is_its_plan():
    """Where nothing it made fits, hiremate anneals its lowest plan at that plan's own peak
    and names the result. Asked for that floor afresh (another process: no floor
    remembered), the annealed floor fitted the budget and hiremate still refused it,
    naming the budget it was asked for (a transformers audio classifier, found by
    `benchmarks/families.py`)."""
    import family_models

    from remat_ir.solvers import _FLOORS

    torch.manual_seed(0)
    model, args, kwargs, _ = family_models.FAMILIES["audio_spectrogram_transformer"]()
    graph = lower_torch(model, args, example_kwargs=kwargs, cost_model="flops")
    with pytest.raises(solvers.InfeasibleBudget) as refused:
        solvers.solve(graph, "50%", "hiremate")
    floor = refused.value.smallest_feasible
    _FLOORS.clear()
    schedule = solvers.solve(graph, floor, "hiremate")
    assert ir.simulate(graph, schedule).peak_bytes <= floor


def test_checkmates_floor_out_of_time_is_feasible_when_asked_for():
    """Checkmate's floor is feasible when asked for. There its MILP ran out of time, the
    starts made for that budget (Fast SA's among them) did not fit, and it failed ("give
    it more time") where the facade remembered the plan it had named: out of time with
    nothing within the budget it now refuses, naming the lowest plan of its starts."""
    torch.manual_seed(0)
    graph = lower_torch(_CausalAttention().train(), (torch.randn(8, 128, 32), torch.randn(8, 128, 1)),
                        cost_model="flops")
    with pytest.raises(solvers.InfeasibleBudget) as refused:
        solvers.solve(graph, 1, "checkmate", time_limit_s=5)
    floor = refused.value.smallest_feasible
    schedule = solvers.solve(graph, floor, "checkmate", time_limit_s=5)
    assert ir.simulate(graph, schedule).peak_bytes <= floor


def test_fingerprint_ignores_times_but_not_memory(gpt2_graph):
    from remat_ir.ir.fingerprint import structure_fingerprint
    graph = gpt2_graph
    assert structure_fingerprint(_noisy_copy(graph, 0)) == structure_fingerprint(graph)
    grown = _noisy_copy(graph, 0)
    grown.proto.nodes[3].cost.workspace_bytes += 1
    assert structure_fingerprint(grown) != structure_fingerprint(graph)
    grown = _noisy_copy(graph, 0)
    grown.proto.storages[0].size_bytes += 4
    assert structure_fingerprint(grown) != structure_fingerprint(graph)


def test_profiled_memory_figures_do_not_depend_on_the_run():
    """Two profiling runs of one model (a convolution with oneDNN workspace, attention,
    layer norms) measure the same storages and workspaces: only times differ. The model
    is traced once (tracing measures nothing) and each copy profiled, as `remat` does."""
    import torch

    from remat_ir.runtimes.profiling import estimate_costs
    from remat_ir.ir.fingerprint import structure_fingerprint
    from torch_models import unet
    for make in (lambda: gpt2(n_layer=1, n_embd=32, seq=16, batch=2), unet):
        model, args, kwargs, _ = make()
        traced = lower_torch(model, args, example_kwargs=kwargs, cost_model=None)
        first, second = ir.loads(ir.dumps(traced)), ir.loads(ir.dumps(traced))
        for graph in (first, second):
            estimate_costs(graph, "profile", torch.device(graph.proto.provenance.cost_device))
        assert structure_fingerprint(first) == structure_fingerprint(second)
        assert [n.cost.time_s for n in first.proto.nodes] != [n.cost.time_s for n in second.proto.nodes]


class _LastStep(torch.nn.Module):
    """A recurrent layer read at its last step, as a sequence classifier does."""

    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.rnn, self.head = rnn, torch.nn.Linear(rnn.hidden_size, 4)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def _small_models() -> dict:
    """Factories of (model, inputs) by name: a few kinds of small model, among them
    oneDNN's LSTM, whose backward returns one bias gradient for two parameters."""
    nn = torch.nn
    return {
        "lstm": lambda: (_LastStep(nn.LSTM(16, 32, batch_first=True)), (torch.randn(8, 20, 16),)),
        "gru": lambda: (_LastStep(nn.GRU(8, 16, batch_first=True)), (torch.randn(4, 4, 8),)),
        "mlp": lambda: (nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.LayerNorm(64), nn.Linear(64, 16)),
                        (torch.randn(32, 16),)),
        "cnn": lambda: (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 64, 4)),
                        (torch.randn(4, 3, 8, 8),)),
    }


@pytest.mark.parametrize("kind", sorted(_small_models()))
def test_named_floor_is_feasible_on_a_second_lowering(kind):
    """The floor a refusal names for one lowering of a model is feasible for the next
    lowering of a copy of it, as `remat` called again does. torch's fake-tensor cache
    gave the LSTM's second lowering in a process two bias gradients where the first had
    one (`lowering.fake_cache_keeping_aliases`): 512 bytes more, and the floor named
    (421,012 bytes for the review's 32-wide LSTM) was refused, naming 421,524. The cache
    is cleared first, so that the first lowering fills it as in a fresh process."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode

    from remat_ir.ir.fingerprint import structure_fingerprint

    FakeTensorMode.cache_clear()
    torch.manual_seed(0)
    model, inputs = _small_models()[kind]()
    model.train()
    first = lower_torch(copy.deepcopy(model), inputs, cost_model="flops")
    with pytest.raises(solvers.InfeasibleBudget) as refused:
        solvers.solve(first, 1, "hiremate", time_limit_s=1)
    floor = refused.value.smallest_feasible
    again = lower_torch(copy.deepcopy(model), inputs, cost_model="flops")
    schedule = solvers.solve(again, floor, "hiremate", time_limit_s=1)
    assert ir.simulate(again, schedule).peak_bytes <= floor
    assert structure_fingerprint(again) == structure_fingerprint(first)   # one graph to plan
