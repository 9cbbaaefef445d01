"""transformers' SpecAugment trains like eager (`frontends/spec_augment.py`,
`torchlib/spec_augment.py`): the speech models' masks, drawn from NumPy's global
generator in the forward, are drawn at every step by eager's own code, in eager's order;
they were refused before ("set mask_time_prob=0.0")."""

from __future__ import annotations

import functools
import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given

import remat_ir
from remat_ir import ir
from remat_ir.lowering import lower_torch
from remat_ir.runtimes.torch import ScheduledModule
from remat_ir.torchlib import spec_augment

from exactness import SCHEDULE_DRAWS, random_schedule, side_by_side
from strategies import search

transformers = pytest.importorskip("transformers")

#: Masks wide enough to show in a tiny model: half the frames in spans of 2, a third of
#: the features in spans of 3 (the defaults mask 5% of the frames in spans of 10).
MASKS = dict(mask_time_prob=0.5, mask_time_length=2, mask_time_min_masks=1,
             mask_feature_prob=0.3, mask_feature_length=3, mask_feature_min_masks=0)


def _config(family: str = "wav2vec2", features: bool = True):
    kind = {"wav2vec2": transformers.Wav2Vec2Config, "hubert": transformers.HubertConfig}[family]
    masks = dict(MASKS) if features else {**MASKS, "mask_feature_prob": 0.0}
    return kind(vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, layerdrop=0.0,
                pad_token_id=0, feat_extract_norm="layer", ctc_loss_reduction="mean", **masks)


def _build(family: str = "wav2vec2", features: bool = True):
    torch.manual_seed(0)
    kind = {"wav2vec2": transformers.Wav2Vec2ForCTC, "hubert": transformers.HubertForCTC}[family]
    return kind(_config(family, features)).train()


def _batch(seed: int = 0, attention: bool = True) -> dict:
    """Two clips of 800 samples (79 frames), the second padded from 600 where `attention`;
    labels padded with -100."""
    generator = torch.Generator().manual_seed(seed)
    batch = dict(input_values=torch.randn(2, 800, generator=generator))
    if attention:
        batch["attention_mask"] = torch.ones(2, 800, dtype=torch.long)
        batch["attention_mask"][1, 600:] = 0
    labels = torch.randint(1, 12, (2, 6), generator=generator)
    labels[1, 3:] = -100
    return dict(batch, labels=labels)


def _loss(out):
    return out.loss


@pytest.mark.parametrize("family, features, attention", [
    ("wav2vec2", True, True), ("wav2vec2", False, False), ("hubert", True, False)])
def test_spec_augment_trains_like_eager_under_a_random_schedule(family, features, attention):
    """Bitwise over two steps, under a random schedule recomputing 80% of the forward, with
    NumPy's generator seeded alike on both sides: the masks, every gradient and NumPy's
    state after each step are eager's (`side_by_side` compares the generators' states)."""
    kwargs = _batch(attention=attention)
    graph = lower_torch(_build(family, features), (), example_kwargs=kwargs, cost_model="flops")
    ops = [graph.node(n).op for n in graph.nodes]
    assert ops.count(spec_augment.OP) == (2 if features else 1)
    schedule = random_schedule(graph, random.Random(4), recompute_share=0.8)
    assert side_by_side(_build(family, features), lambda model: ScheduledModule(model, graph, schedule),
                        (), kwargs, _loss, tolerance=1e-30) == {}


def test_the_masks_are_drawn_at_every_step_in_eagers_order_once(tmp_path):
    """Each mask is an op that may run only once per step, the feature mask's reading the
    time mask's (so that every plan draws them in eager's order); the masks differ from
    step to step as eager's do; read back from an IR file, the graph trains like eager."""
    kwargs = _batch()
    graph = lower_torch(_build(), (), example_kwargs=kwargs, cost_model="flops")
    time_mask, feature_mask = [graph.node(n) for n in graph.nodes if graph.node(n).op == spec_augment.OP]
    assert time_mask.non_recomputable and feature_mask.non_recomputable
    assert set(time_mask.outputs) <= set(feature_mask.inputs)
    model = _build()
    scheduled = remat_ir.remat(model, (), example_kwargs=kwargs, solver="recompute-all", cost_model="flops")
    np.random.seed(0)
    losses = []
    for _ in range(3):
        loss = scheduled(**kwargs).loss
        loss.backward()
        losses.append(loss.item())
    assert len(set(losses)) == 3   # the masks (and dropout) differ per step
    loaded = ir.load(ir.save(graph, tmp_path / "wav2vec2.rir"))
    schedule = random_schedule(loaded, random.Random(6), recompute_share=0.8)
    assert side_by_side(_build(), lambda m: ScheduledModule(m, loaded, schedule), (), kwargs, _loss,
                        tolerance=1e-30) == {}


def test_planning_and_profiling_leave_every_generator_as_it_was():
    """`remat` profiles each op (the masks' included) and times the plans' steps: NumPy's,
    Python's and torch's generators are where they were (before, profiling drew masks)."""
    model = _build()
    np.random.seed(1)
    random.seed(1)
    torch.manual_seed(1)
    before = np.random.get_state(), random.getstate(), torch.get_rng_state()
    remat_ir.remat(model, (), example_kwargs=_batch(), budget=0.8)
    after = np.random.get_state(), random.getstate(), torch.get_rng_state()
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))
    assert before[1] == after[1] and torch.equal(before[2], after[2])


@functools.cache
def _lowered():
    return lower_torch(_build(), (), example_kwargs=_batch(), cost_model="flops")


@search(5, derandomize=True)
@given(**SCHEDULE_DRAWS)
def test_random_schedules_train_like_eager(seed, recompute, defer, groups):
    """Searched: random valid schedules of one graph (recomputations anywhere, forward
    nodes deferred to the backward, gradients handed in groups): bitwise, every
    generator's state included, over two steps."""
    graph = _lowered()
    schedule = random_schedule(graph, random.Random(seed), recompute_share=recompute, defer_share=defer)
    make = lambda model: ScheduledModule(model, graph, schedule, gradient_groups=groups)   # noqa: E731
    assert side_by_side(_build(), make, (), _batch(), _loss, tolerance=1e-30) == {}


def test_a_span_longer_than_the_clip_is_eagers_error_named_by_line():
    """Eager raises ValueError before drawing where a span is longer than the frames: so
    does lowering, naming the line, not a failure inside profiling at `remat`."""
    from remat_ir.frontends.errors import LoweringError

    model = _build(features=False)
    model.config.mask_time_length = 500
    with pytest.raises(ValueError, match="mask_length"):
        model(**_batch())
    with pytest.raises(LoweringError, match=r"ValueError at .*modeling_wav2vec2.py:\d+ in _compute_mask_indices.*"
                                            r"eager raises it too"):
        remat_ir.remat(model, (), example_kwargs=_batch(), cost_model="flops", solver="recompute-all")


@pytest.mark.parametrize("damage, message", [
    ("module", r"cannot be imported here .*install the library"),
    ("function", r"has no function _compute_mask_indices here"),
    ("flag", r"must run once per step but node .* is not marked non_recomputable"),
])
def test_a_graph_file_whose_mask_cannot_be_drawn_as_lowered_is_one_clear_error(tmp_path, damage, message):
    """A graph file names the module whose code draws each mask, and marks the draw as
    run once per step: where the module is missing here (transformers not installed, or
    another version) or the flag was lost, the first call says so naming the node, not a
    ModuleNotFoundError from inside the step nor a mask drawn twice; `validate` too."""
    from remat_ir.runtimes.op_checks import op_problems

    loaded = ir.load(ir.save(_lowered(), tmp_path / "wav2vec2.rir"))
    node = next(loaded.node(n) for n in loaded.nodes if loaded.node(n).op == spec_augment.OP)
    if damage == "module":
        node.args[0].string_value = "transformers.models.no_such_speech_model"
    elif damage == "function":
        node.args[0].string_value = "transformers.utils"
    else:
        node.non_recomputable = False
    named = f"node '{node.name}' ({spec_augment.OP}, id {node.id})"
    problems = [p for p in op_problems(loaded) if re.search(message, p)]
    assert len(problems) == 1 and named in problems[0], op_problems(loaded)
    scheduled = ScheduledModule(_build(), loaded, ir.recompute_all(loaded))
    with pytest.raises(ir.RematIRError, match=message) as refused:
        scheduled(**_batch())
    assert named in str(refused.value)
