"""Buffer reuse (frontends/buffer_reuse.py): backward ops that write their result into
a gradient dying at them.

Two things must hold for the rewrite to be worth anything. Each op of `REUSING_OPS`,
given one of its inputs as `out=`, computes the bits its functional form computes
(checked here op by op, for every input it may overwrite, on rows whose lengths are
not multiples of a vector width). And on lowered models the rewrite only ever takes a
buffer nothing else reads, and lowers the memory of the steps it touches by the
result's bytes, never raising any step (checked here against the same model lowered
without it). That gradients stay bitwise equal to eager's under any valid schedule of
the rewritten graphs is the random-schedule tests' job (test_differential.py,
test_torch_memory_and_files.py), which lower with buffer reuse, the default.
"""

from __future__ import annotations

import pytest
import torch

from remat_ir.frontends.buffer_reuse import REUSING_OPS
from remat_ir.torchlib.overloads import functional_overload, out_overload
from remat_ir.frontends.torch import lower
from remat_ir.ir import pb, simulate, store_all
from remat_ir.torchlib.types import resolve_op

from exactness import DEVICES

SHAPES = [(7,), (3, 37), (2, 5, 1031)]


def _cases(shape, device):
    """(op name, functional arguments, positions of the inputs the op may overwrite)."""
    g = torch.Generator().manual_seed(sum(shape))

    def rand(positive=False):
        t = torch.randn(shape, generator=g)
        return (t.abs() + 0.5 if positive else t).to(device)

    log_probs = torch.log_softmax(rand(), -1)
    probs = torch.softmax(rand(), -1)
    return [
        ("aten._log_softmax_backward_data.default", (rand(), log_probs, -1, torch.float32), (0,)),
        ("aten._log_softmax_backward_data.default",
         (rand(), torch.log_softmax(log_probs, 0), 0, torch.float32), (0,)),
        ("aten._softmax_backward_data.default", (rand(), probs, -1, torch.float32), (0,)),
        ("aten.add.Tensor", (rand(), rand()), (0, 1)),
        ("aten.sub.Tensor", (rand(), rand()), (0, 1)),
        ("aten.mul.Tensor", (rand(), rand()), (0, 1)),
        ("aten.div.Tensor", (rand(), rand(positive=True)), (0, 1)),
        ("aten.neg.default", (rand(),), (0,)),
        ("aten.pow.Tensor_Scalar", (rand(), 2), (0,)),
        ("aten.silu_backward.default", (rand(), rand()), (0, 1)),
        ("aten.gelu_backward.default", (rand(), rand()), (0, 1)),
        ("aten.tanh_backward.default", (rand(), torch.tanh(rand())), (0, 1)),
        ("aten.sigmoid_backward.default", (rand(), torch.sigmoid(rand())), (0, 1)),
        ("aten.threshold_backward.default", (rand(), rand(), 0.0), (0, 1)),
    ]


def test_every_reusing_op_has_an_out_overload_taking_the_same_arguments():
    for name in sorted(REUSING_OPS):
        found = out_overload(resolve_op(name))
        assert found is not None, f"{name} has no out= overload with its arguments"
        overload, out_name = found
        assert any(a.is_out and a.name == out_name for a in overload._schema.arguments)
        # and back: the runtime runs the functional op where the buffer is laid out otherwise
        assert functional_overload(overload) == (resolve_op(name), out_name)


def test_the_cases_cover_every_reusing_op():
    assert {name for name, _, _ in _cases((3,), "cpu")} == REUSING_OPS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_an_op_writing_into_its_input_gives_the_functional_bits(shape, device):
    for name, args, positions in _cases(shape, device):
        op = resolve_op(name)
        expected = op(*args)
        overload, out_name = out_overload(op)
        for position in positions:
            given = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            target = given[position]
            result = overload(*given, **{out_name: target})
            assert result.data_ptr() == target.data_ptr(), f"{name}: the result is not in its input"
            assert torch.equal(result, expected), \
                f"{name} writing into input {position} at {shape} on {device}: bits differ"


@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_an_op_writing_into_its_input_allocates_nothing_on_cpu(shape):
    """The point of the rewrite is one buffer instead of two: an `out=` overload that
    computed into a temporary and copied it (as `mul.Scalar_out` does) would hold two
    all the same, and pay a copy."""
    from remat_ir.runtimes.memory import measure_peak

    for name, args, positions in _cases(shape, "cpu"):
        overload, out_name = out_overload(resolve_op(name))
        for position in positions:
            given = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            peak = measure_peak(lambda: overload(*given, **{out_name: given[position]}), "cpu").peak_bytes
            assert peak <= 16, f"{name} writing into input {position} allocates {peak} bytes"


def _rewritten(plain, reused) -> list[pb.Node]:
    """The nodes of `reused` that buffer reuse rewrote (mutating there, not in `plain`)."""
    return [n for n in reused.proto.nodes if n.mutating and not plain.node(n.id).mutating]


@pytest.fixture(scope="module", params=["gpt2", "cnn_batchnorm", "lora_llama"])
def both_lowerings(request):
    """A zoo model lowered without and with buffer reuse (the same nodes, ids and order)."""
    import zoo_models

    model, args, kwargs, _ = zoo_models.ZOO[request.param]()
    return (lower(model, args, example_kwargs=kwargs, reuse_buffers=False),
            lower(model, args, example_kwargs=kwargs))


def test_reuse_takes_only_buffers_nothing_else_reads(both_lowerings):
    plain, reused = both_lowerings
    rewritten = _rewritten(plain, reused)
    assert rewritten, "no backward op was rewritten"
    outputs = {plain.value(v).storage_id for v in plain.output_value_ids}
    readers: dict[int, set[int]] = {}
    for node in plain.proto.nodes:
        for v in node.inputs:
            readers.setdefault(plain.value(v).storage_id, set()).add(node.id)
    for node in rewritten:
        before = plain.node(node.id)
        assert before.phase == pb.BACKWARD and list(before.inputs) == list(node.inputs)
        result = reused.value(node.outputs[0])
        taken = [v for v in node.inputs if reused.value(v).storage_id == result.storage_id]
        assert len(taken) == 1, f"{node.name}: its result shares {len(taken)} inputs' storage"
        storage = plain.value(taken[0]).storage_id
        assert readers[storage] == {node.id}, f"{node.name} overwrites a buffer others read"
        assert storage not in outputs and storage not in plain.resident_storage_ids
        assert plain.value(taken[0]).size_bytes == plain.value(node.outputs[0]).size_bytes


def test_reuse_lowers_the_steps_it_touches_and_raises_none(both_lowerings):
    plain, reused = both_lowerings
    runs = []
    for graph in (plain, reused):
        schedule = store_all(graph)
        result = simulate(graph, schedule)
        assert result.valid
        during = {s.compute: m for s, m in zip(schedule.steps, result.memory_during)
                  if s.WhichOneof("action") == "compute"}
        runs.append((during, result.peak_bytes))
    (during_plain, peak_plain), (during_reused, peak_reused) = runs
    assert during_plain.keys() == during_reused.keys()
    assert all(during_reused[n] <= during_plain[n] for n in during_plain)
    assert peak_reused <= peak_plain
    # The first rewritten node saves exactly its result's bytes while it runs.
    backward = reused.phase_order(pb.BACKWARD)
    first = min(_rewritten(plain, reused), key=lambda n: backward.index(n.id))
    assert during_plain[first.id] - during_reused[first.id] == reused.value(first.outputs[0]).size_bytes


def test_the_language_model_loss_holds_two_vocab_buffers_not_three():
    """GPT-2's `_log_softmax_backward_data` (the floor of every plan on the benchmark's
    GPT-2) writes its result into the incoming gradient."""
    import zoo_models

    model, args, kwargs, _ = zoo_models.ZOO["gpt2"]()
    graph = lower(model, args, example_kwargs=kwargs)
    loss = [n for n in graph.proto.nodes if n.op.startswith("aten._log_softmax_backward_data")]
    assert [n.op for n in loss] == ["aten._log_softmax_backward_data.out"]
    result, gradient = graph.value(loss[0].outputs[0]), graph.value(loss[0].inputs[0])
    assert result.storage_id == gradient.storage_id


def test_for_a_fusing_backend_pointwise_ops_stay_functional_and_the_loss_still_reuses():
    """`lower(..., fusing=True)` (the inductor backend's graph): a pointwise op writing into
    its input would split the chain Inductor fuses it into, so only the others are
    rewritten; the loss's `_log_softmax_backward_data` still writes into its gradient."""
    import zoo_models

    model, args, kwargs, _ = zoo_models.ZOO["gpt2"]()
    plain = lower(model, args, example_kwargs=kwargs, reuse_buffers=False)
    reused = lower(model, args, example_kwargs=kwargs)
    fusing = lower(model, args, example_kwargs=kwargs, fusing=True)

    def pointwise(node):
        return torch.Tag.pointwise in resolve_op(node.op).tags
    assert any(pointwise(n) for n in _rewritten(plain, reused)), "the test checks nothing"
    kept = _rewritten(plain, fusing)
    assert kept and not any(pointwise(n) for n in kept)
    assert "aten._log_softmax_backward_data.out" in [n.op for n in kept]


class _PolarOfTransposed(torch.nn.Module):
    """A complex product in the backward (polar's) with a transposed operand."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(33, 33)

    def forward(self, x, angle):
        magnitude = self.linear(x).transpose(1, 2)
        return torch.polar(magnitude, angle).abs().square().mean()


def test_an_op_with_an_input_laid_out_otherwise_keeps_its_functional_form_and_eagers_bits():
    """Given the output, the kernel iterated in another order: the complex product's
    gradient fed the weight's sum 1e-7 off eager's (a short-time Fourier transform's
    magnitude through a Linear, 2026-11-30 sweep)."""
    from exactness import side_by_side
    from remat_ir.runtimes.torch import ScheduledModule

    torch.manual_seed(0)
    args = (torch.randn(2, 17, 33), torch.randn(2, 33, 17))
    model = _PolarOfTransposed()
    graph = lower(model, args)
    transposed = [n for n in graph.nodes if graph.node(n).op == "aten.mul.Tensor"
                  and any(list(graph.value(v).stride) == [561, 1, 33] for v in graph.node(n).inputs)]
    assert transposed   # kept functional
    schedule = store_all(graph)
    assert side_by_side(model, lambda m: ScheduledModule(m, graph, schedule), args, {}, lambda out: out,
                        tolerance=1e-30) == {}


def test_a_graph_whose_mutating_flags_were_lost_is_refused_naming_the_node():
    """A file edited or written by another tool without `Node.mutating`: a schedule ran
    an op writing into its input twice, the second time over what the first wrote
    (found by a review: every gradient off, up to 0.14, the simulator and `validate`
    content). The runtime refuses it, naming the node."""
    from remat_ir import ir, plan
    from remat_ir.ir import RematIRError
    from remat_ir.runtimes.torch import ScheduledModule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    graph = lower(model, (x,))
    marked = [node for node in graph.proto.nodes if node.mutating]
    assert marked and all(resolve_op(node.op)._schema.is_mutable for node in marked)
    for node in marked:
        node.mutating = False
    graph = ir.Graph(graph.proto)
    scheduled = ScheduledModule(model, graph, plan(graph, None, "recompute-all"))
    with pytest.raises(RematIRError, match=rf"{marked[0].op} writes into one of its arguments but node .* "
                                           r"is not marked mutating in the graph .* lower the model again"):
        scheduled(x)
