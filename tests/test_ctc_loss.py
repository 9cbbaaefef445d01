"""A CTC loss in the forward trains like eager (`frontends/ctc_losses.py`,
`torchlib/ctc_loss.py`): it was refused before, since `_ctc_loss` keeps a tensor whose
shape the target lengths' values decide, and transformers' speech models select their
targets with `masked_select`."""

from __future__ import annotations

import copy
import functools
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import remat_ir
from remat_ir import ir
from remat_ir.frontends.errors import LoweringError
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule

from exactness import SCHEDULE_DRAWS, random_schedule, side_by_side
from strategies import search


class _Recognizer(torch.nn.Module):
    """Frames -> log probabilities over 6 symbols (0 the blank), then a CTC loss whose
    targets come in the form `kind` names: selected from labels padded with -100 by a
    mask (`masked_select`, as transformers' `ForCTCLoss`), by boolean indexing, selected
    then shifted and cast (the blank last), padded (2-D targets, through `nn.CTCLoss`),
    or padded with the lengths as Python lists;
    `reduction` and `zero_infinity` as `F.ctc_loss` takes them."""

    def __init__(self, kind: str = "masked_select", reduction: str = "mean", zero_infinity: bool = False):
        super().__init__()
        self.kind, self.reduction, self.zero_infinity = kind, reduction, zero_infinity
        self.inner, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 6)
        self.drop = torch.nn.Dropout(0.2)
        self.ctc = torch.nn.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)

    def forward(self, frames, labels, frame_lengths):
        logits = self.out(self.drop(torch.tanh(self.inner(frames))))
        log_probs = F.log_softmax(logits, dim=-1, dtype=torch.float32).transpose(0, 1)
        mask = (labels != -100) & (labels != 0)
        target_lengths = mask.sum(-1)
        if self.kind == "padded":
            loss = self.ctc(log_probs, labels.clamp_min(1), frame_lengths, target_lengths)
        elif self.kind == "lists":
            loss = F.ctc_loss(log_probs, labels.clamp_min(1), LISTED[0], LISTED[1],
                              reduction=self.reduction, zero_infinity=self.zero_infinity)
        elif self.kind == "shifted":   # classes 1-5 as 0-4, int32, the blank last
            targets = (labels.masked_select(mask) - 1).to(torch.int32)
            loss = F.ctc_loss(log_probs, targets, frame_lengths, target_lengths, blank=5,
                              reduction=self.reduction, zero_infinity=self.zero_infinity)
        else:
            targets = labels.masked_select(mask) if self.kind == "masked_select" else labels[mask]
            loss = F.ctc_loss(log_probs, targets, frame_lengths, target_lengths,
                              reduction=self.reduction, zero_infinity=self.zero_infinity)
        return loss if self.reduction != "none" else loss.sum()


#: The "lists" kind's (frame lengths, target lengths), those of `_batch()`.
LISTED = ([10, 7, 9], [3, 2, 4])


def _batch(seed: int = 0, target_lengths=LISTED[1], frame_lengths=LISTED[0]):
    """Three sequences of 10 frames, labels padded with -100 to 4."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.randn(3, 10, 8, generator=generator)
    labels = torch.randint(1, 6, (3, 4), generator=generator)
    for row, length in enumerate(target_lengths):
        labels[row, length:] = -100
    return frames, labels, torch.tensor(frame_lengths)


def _random_plan(args, *model_args):
    """A maker for `side_by_side`: a random schedule recomputing 80%, of the graph lowered
    once from a model of its own (the model trained is another, built alike)."""
    graph = lower_torch(_Recognizer(*model_args), args, cost_model="flops")
    schedule = random_schedule(graph, random.Random(3), recompute_share=0.8)
    return lambda model: ScheduledModule(model, graph, schedule)


@pytest.mark.parametrize("kind", ["masked_select", "indexing", "shifted", "padded", "lists"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_ctc_loss_trains_like_eager_under_a_random_schedule(kind, reduction):
    """Bitwise, generator state included, over two steps with dropout, with 80% of the
    forward recomputed at random; then, where the lengths are tensors, a batch of other
    target lengths (the same shapes) on the same plan: still eager's bits."""
    args = _batch()
    make = _random_plan(args, kind, reduction)
    assert side_by_side(_Recognizer(kind, reduction), make, args, {}, lambda loss: loss,
                        tolerance=1e-30) == {}
    if kind != "lists":
        other = _batch(seed=1, target_lengths=[1, 4, 3], frame_lengths=[8, 10, 10])
        assert side_by_side(_Recognizer(kind, reduction), make, other, {}, lambda loss: loss,
                            tolerance=1e-30) == {}


@functools.cache
def _lowered_recognizer():
    """The masked-select recognizer's graph, lowered once for the searches below (all its
    batches have `_batch()`'s shapes)."""
    return lower_torch(_Recognizer(), _batch(), cost_model="flops")


@search(10, derandomize=True)
@given(**SCHEDULE_DRAWS, target_lengths=st.lists(st.integers(0, 4), min_size=3, max_size=3),
       frame_lengths=st.lists(st.integers(1, 10), min_size=3, max_size=3), labels_seed=st.integers(0, 99))
def test_random_schedules_and_batches_train_like_eager(seed, recompute, defer, groups, target_lengths,
                                                       frame_lengths, labels_seed):
    """Searched: random valid schedules of one graph (recomputations anywhere, forward
    nodes deferred to the backward, gradients handed in groups) and batches of any target
    and frame lengths, empty targets and impossible alignments (an infinite loss)
    included: bitwise, generator state included, over two steps."""
    graph = _lowered_recognizer()
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=defer)
    args = _batch(labels_seed, target_lengths=target_lengths, frame_lengths=frame_lengths)
    make = lambda model: ScheduledModule(model, graph, schedule, gradient_groups=groups)   # noqa: E731
    assert side_by_side(_Recognizer(), make, args, {}, lambda loss: loss, tolerance=1e-30) == {}


def test_a_ctc_loss_trains_where_the_backends_flags_are_frozen():
    """After `torch.backends.disable_global_flags()` (which `torch.testing`'s utilities
    call), setting `torch.backends.cudnn.enabled` raises: every step of the op, which sets
    it as the forward had it, raised, where eager's CTC loss runs (found by a review)."""
    args = _batch()
    frozen = torch.backends.disable_global_flags.__globals__
    torch.backends.disable_global_flags()
    try:
        assert side_by_side(_Recognizer("padded"), _random_plan(args, "padded"), args, {}, lambda loss: loss,
                            tolerance=1e-30) == {}
    finally:
        frozen["__allow_nonbracketed_mutation_flag"] = True
    assert not torch.backends.flags_frozen()


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_an_impossible_alignment_trains_like_eager(zero_infinity):
    """A sequence of 1 frame for 2 labels has no alignment: eager's loss is infinite (its
    gradients NaN, the same on both sides), or zeroed with its gradient with
    `zero_infinity`."""
    args = _batch(target_lengths=[3, 2, 4], frame_lengths=[10, 1, 9])
    eager = _Recognizer("masked_select", "mean", zero_infinity)(*args)
    assert torch.isinf(eager).item() is not zero_infinity
    make = _random_plan(args, "masked_select", "mean", zero_infinity)
    assert side_by_side(_Recognizer("masked_select", "mean", zero_infinity), make, args, {},
                        lambda loss: loss, tolerance=1e-30) == {}


def test_the_loss_is_one_op_of_fixed_shapes_and_the_selection_is_folded_into_it(tmp_path):
    """The graph holds the op and its backward, and no op whose shape the data decides
    (the selection, `_ctc_loss`); read back from an IR file, it trains like eager; one
    plan made serves batches of other target lengths."""
    args = _batch()
    graph = lower_torch(_Recognizer(), args, cost_model="flops")
    ops = [graph.node(n).op for n in graph.nodes]
    assert ops.count("remat_ir.ctc_loss.default") == 1
    assert ops.count("remat_ir.ctc_loss_backward.default") == 1
    assert not any(op.startswith(("aten.masked_select", "aten._ctc_loss", "aten.nonzero")) for op in ops), ops
    loaded = ir.load(ir.save(graph, tmp_path / "recognizer.rir"))
    schedule = random_schedule(loaded, random.Random(5), recompute_share=0.8)
    assert side_by_side(_Recognizer(), lambda model: ScheduledModule(model, loaded, schedule), args, {},
                        lambda loss: loss, tolerance=1e-30) == {}
    model = _Recognizer()
    scheduled = remat_ir.remat(model, args, solver="recompute-all", cost_model="flops")
    for seed, lengths in enumerate(([3, 2, 4], [4, 4, 1], [1, 1, 1])):
        scheduled(*_batch(seed, target_lengths=lengths)).backward()
    assert len(scheduled.plans) == 1   # no call was planned again


class _HalfRecognizer(_Recognizer):
    """Logits in bfloat16 (a linear layer under autocast) and log probabilities taken in
    them: autocast runs `ctc_loss` in float32, casting them."""

    def forward(self, frames, labels, frame_lengths):
        log_probs = F.log_softmax(self.out(torch.tanh(self.inner(frames))).bfloat16(), dim=-1)
        mask = labels != -100
        return F.ctc_loss(log_probs.transpose(0, 1), labels.masked_select(mask), frame_lengths,
                          mask.sum(-1))


def test_a_ctc_loss_under_autocast_trains_like_eager():
    args = _batch()
    autocast = lambda: torch.autocast("cpu", torch.bfloat16)   # noqa: E731
    with autocast():
        assert _HalfRecognizer()(*args).dtype == torch.float32   # autocast's float32 policy
        graph = lower_torch(_HalfRecognizer(), args, cost_model="flops")
    schedule = random_schedule(graph, random.Random(3), recompute_share=0.8)
    assert side_by_side(_HalfRecognizer(), lambda model: ScheduledModule(model, graph, schedule), args,
                        {}, lambda loss: loss, forward_context=autocast, tolerance=1e-30) == {}


class _SelectionReadElsewhere(_Recognizer):
    """The selected targets also feed the loss another way (their mean): the selection
    stays in the graph, with as many targets as the example's mask selects (the count
    read as eager's, `frontends/input_sizes.py`)."""

    def forward(self, frames, labels, frame_lengths):
        log_probs = F.log_softmax(self.out(torch.tanh(self.inner(frames))), dim=-1).transpose(0, 1)
        mask = labels != -100
        targets = labels.masked_select(mask)
        return F.ctc_loss(log_probs, targets, frame_lengths, mask.sum(-1)) + targets.float().mean()


def test_targets_read_elsewhere_too_are_selected_by_their_count_and_train_like_eager():
    """Refused before (the selection's shape is the mask's count); now bitwise eager's,
    and a batch with another count of targets is planned for it."""
    args = _batch()
    assert side_by_side(_SelectionReadElsewhere(), lambda model: _scheduled_elsewhere(model, args), args, {},
                        lambda loss: loss) == {}
    model = _SelectionReadElsewhere()
    scheduled = remat_ir.remat(copy.deepcopy(model), args, cost_model="flops")
    other = _batch(target_lengths=[4, 4, 2])   # 10 targets, the example 9
    torch.manual_seed(0)
    expected = model(*other)
    torch.manual_seed(0)
    assert torch.equal(scheduled(*other), expected)
    assert len(scheduled.plans) == 2


def _scheduled_elsewhere(model, args):
    graph = lower_torch(_SelectionReadElsewhere(), args, cost_model="flops")
    return ScheduledModule(model, graph, random_schedule(graph, random.Random(2), recompute_share=0.8))


def test_transformers_wav2vec2_fine_tuned_for_ctc_trains_like_eager():
    """`Wav2Vec2ForCTC` (tiny, random weights) with labels padded with -100 and an
    attention mask over audio of two lengths, under a random schedule recomputing 80%:
    bitwise over two steps; then labels of other lengths on the same plan."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.0, layerdrop=0.0, pad_token_id=0,
        feat_extract_norm="layer", ctc_loss_reduction="mean")

    def build():
        torch.manual_seed(0)
        return transformers.Wav2Vec2ForCTC(config).train()

    def batch(seed, lengths):
        generator = torch.Generator().manual_seed(seed)
        audio = torch.randn(2, 800, generator=generator)
        attention_mask = torch.ones(2, 800, dtype=torch.long)
        attention_mask[1, 600:] = 0
        labels = torch.randint(1, 12, (2, 6), generator=generator)
        for row, length in enumerate(lengths):
            labels[row, length:] = -100
        return dict(input_values=audio, attention_mask=attention_mask, labels=labels)

    first = batch(0, [6, 3])
    graph = lower_torch(build(), (), example_kwargs=first, cost_model="flops")
    assert "remat_ir.ctc_loss.default" in {graph.node(n).op for n in graph.nodes}
    schedule = random_schedule(graph, random.Random(1), recompute_share=0.8)
    for kwargs in (first, batch(1, [2, 5])):
        assert side_by_side(build(), lambda model: ScheduledModule(model, graph, schedule), (), kwargs,
                            lambda out: out.loss, tolerance=1e-30) == {}


@pytest.mark.parametrize("schedule", ["store-all", "recompute-all", "random"])
def test_the_measured_peak_stays_within_the_simulated_one(schedule):
    """The ops' forward variables (alpha, and beta in the backward: 2 x 3 x 200 x 81
    floats, above the activations) count as their workspace, bounded by the labels' row
    length: profiling's synthetic inputs (zero lengths) would measure none, and the step
    measured 2-3x its simulated peak. Every label valid: the longest targets the shapes allow."""
    from remat_ir.runtimes.memory import measure_peak

    torch.manual_seed(0)
    args = (torch.randn(3, 200, 8), torch.randint(1, 6, (3, 40)), torch.tensor([200, 197, 199]))
    model = _Recognizer()
    graph = lower_torch(model, args, cost_model="isolated")
    plan = {"store-all": lambda: ir.store_all(graph),
            "recompute-all": lambda: remat_ir.plan(graph, None, "recompute-all"),
            "random": lambda: random_schedule(graph, random.Random(2), recompute_share=0.8)}[schedule]()
    scheduled = ScheduledModule(model, graph, plan)

    def step():
        scheduled(*args).backward()

    step()
    model.zero_grad(set_to_none=True)
    measured = measure_peak(step, "cpu").peak_bytes
    simulated = ir.simulate(graph, plan).peak_bytes
    assert simulated * 0.9 <= measured <= simulated, (measured, simulated)
