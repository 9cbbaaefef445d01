"""`if mask.any(): x[mask] = constant` on activations traces as taken
(`frontends/raising_checks.empty_mask_branch`): with no True element the write changes
nothing, so the step is eager's whether the mask holds one or not. transformers'
`Wav2Vec2ForPreTraining` guards its contrastive logits so, and lowering refused it."""

from __future__ import annotations

import copy

import pytest
import torch

import remat_ir
from remat_ir.frontends.errors import LoweringError
from exactness import side_by_side


class _MasksTies(torch.nn.Module):
    """Masks the logits equal to their row's first (a tie, rare on random data, as
    wav2vec2's negatives equal to the positive) before a cross entropy."""

    def __init__(self, how: str):
        super().__init__()
        self.fc, self.how = torch.nn.Linear(6, 5), how

    def forward(self, x, target):
        logits = torch.tanh(self.fc(x)).round(decimals=1)
        ties = logits[:, 1:] == logits[:, :1]
        if self.how == "method":
            if ties.any():
                logits[:, 1:][ties] = float("-inf")
        else:
            if torch.any(ties):
                logits[:, 1:][ties] = -1e4
        return torch.nn.functional.cross_entropy(logits, target)


@pytest.mark.parametrize("how", ["method", "torch.any"])
def test_a_constant_written_through_a_mask_tested_by_any_trains_as_eager_with_and_without_a_true_element(how):
    torch.manual_seed(0)
    model = _MasksTies(how)
    eager = copy.deepcopy(model)
    target = torch.tensor([0, 1, 2, 0])
    x = torch.randn(4, 6)
    scheduled = remat_ir.remat(model, (x, target), solver="recompute-all")
    ties_seen = set()
    for step in range(6):
        x = torch.randn(4, 6) if step % 2 else torch.zeros(4, 6)   # zeros: every logit ties
        with torch.no_grad():
            logits = torch.tanh(eager.fc(x)).round(decimals=1)
            ties_seen.add(bool((logits[:, 1:] == logits[:, :1]).any()))
        loss, expected = scheduled(x, target), eager(x, target)
        loss.backward()
        expected.backward()
        assert torch.equal(loss, expected), step
        for got, want in zip(model.parameters(), eager.parameters()):
            assert torch.equal(got.grad, want.grad), step
        model.zero_grad()
        eager.zero_grad()
    assert ties_seen == {True, False}   # both sides of eager's branch were met


class _WritesATensor(torch.nn.Module):
    """Writes a parameter through the mask: taken with no True element, the write would
    give the parameter a zero gradient where eager gives none."""

    def __init__(self):
        super().__init__()
        self.fc, self.fill = torch.nn.Linear(6, 5), torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        logits = self.fc(x)
        big = logits > 100
        if big.any():
            logits[big] = self.fill
        return logits.square().mean()


def test_a_tensor_written_through_a_mask_tested_by_any_is_still_refused():
    model, x = _WritesATensor(), torch.randn(4, 6)
    with pytest.raises(LoweringError, match="branches on a value computed from tensor data"):
        remat_ir.remat(model, (x,), solver="recompute-all")


def test_wav2vec2_pretraining_trains_bitwise():
    """The model that met the refusal (`if neg_is_pos.any():` in its forward), tiny:
    trained side by side with eager, bitwise (its Gumbel draws included)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForPreTraining
    from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices
    config = Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
        codevector_dim=8, proj_codevector_dim=8, num_codevectors_per_group=4, num_codevector_groups=2,
        num_negatives=3, mask_time_length=2, mask_time_prob=0.3, feat_extract_norm="group", layerdrop=0.0)
    torch.manual_seed(0)
    model = Wav2Vec2ForPreTraining(config)
    frames = int(model._get_feat_extract_output_lengths(torch.tensor(400)))
    masked = torch.from_numpy(_compute_mask_indices((2, frames), 0.3, 2, min_masks=1)).bool()
    negatives = torch.from_numpy(_sample_negative_indices((2, frames), 3, mask_time_indices=masked.numpy())).long()
    inputs = dict(input_values=torch.randn(2, 400), mask_time_indices=masked, sampled_negative_indices=negatives)
    assert side_by_side(model, lambda m: remat_ir.remat(m, (), example_kwargs=inputs, solver="recompute-all"),
                        (), inputs, lambda out: out.loss, tolerance=1e-30) == {}


class _WritesThroughIndices(torch.nn.Module):
    """`if idx.any(): h[idx] = 0.0` with an integer `idx`: zeros index row 0."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        h = self.fc(x)
        idx = (h > 100).long().sum(dim=1)
        if idx.any():
            h[idx] = 0.0
        return h.square().mean()


def test_an_integer_index_tested_by_any_is_still_refused():
    """Taken with indices all zero, the write would zero row 0, where eager, not taking
    the branch, writes nothing (found by a review: 0.908 off)."""
    with pytest.raises(LoweringError, match="branches on a value computed from tensor data"):
        remat_ir.remat(_WritesThroughIndices(), (torch.randn(4, 6),), solver="recompute-all")
