"""Hugging Face Trainer trains a remat-ir module like the plain model: dynamic padding (a
new padded length is planned by itself), losses and final weights bitwise equal."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

import remat_ir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from hf_trainer import _Collator, small_llama, token_dataset, train  # noqa: E402


def test_trainer_with_dynamic_padding_matches_plain_trainer(tmp_path, capsys):
    model = small_llama(hidden=32, vocab=64)
    dataset = token_dataset(16, 64, (5, 30))
    plain = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, _Collator()(dataset[:4]), solver="recompute-all",
                               cost_model="flops")
    plain_losses = train(plain, dataset, steps=4, batch_size=4, output_dir=str(tmp_path))
    remat_losses = train(scheduled, dataset, steps=4, batch_size=4, output_dir=str(tmp_path))
    assert len(plain_losses) == 4 and remat_losses == plain_losses
    for (name, a), b in zip(plain.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    lengths = {g.value(e.value_id).shape[1] for g, _ in scheduled.plans
               for e in g.proto.inputs if e.name == "input0"}
    assert len(lengths) >= 2  # batches were padded to different lengths, each planned
    notices = capsys.readouterr().err.count("remat-ir: new input signature")
    assert notices == len(scheduled.plans) - 1
