"""Hugging Face Trainer trains a remat-ir module like the plain model: dynamic padding (a
new padded length is planned by itself), losses and final weights bitwise equal."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

import remat_ir
from remat_ir.ir import pb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from hf_trainer import _Collator, small_llama, token_dataset, train  # noqa: E402


def test_trainer_with_dynamic_padding_matches_plain_trainer(tmp_path, capsys):
    model = small_llama(hidden=32, vocab=64)
    dataset = token_dataset(16, 64, (5, 30))
    plain = copy.deepcopy(model)
    scheduled = remat_ir.remat(model, _Collator()(dataset[:4]), solver="recompute-all",
                               cost_model="flops", outputs=["loss"])   # Trainer reads the loss alone
    plain_losses = train(plain, dataset, steps=4, batch_size=4, output_dir=str(tmp_path))
    remat_losses = train(scheduled, dataset, steps=4, batch_size=4, output_dir=str(tmp_path))
    assert len(plain_losses) == 4 and remat_losses == plain_losses
    for (name, a), b in zip(plain.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    lengths = {g.value(e.value_id).shape[1] for g, _ in scheduled.plans
               for e in g.proto.inputs if e.name == "input0"}
    assert len(lengths) >= 2  # batches were padded to different lengths, each planned
    for g, _ in scheduled.plans:   # each without its logits (`outputs`)
        assert [o.name for o in g.proto.outputs if o.role == pb.USER_OUTPUT] == ["output0"]
    notices = capsys.readouterr().err.count("remat-ir: new input signature")
    assert notices == len(scheduled.plans) - 1


def test_trainer_given_the_model_remat_in_place_saves_checkpoints_from_pretrained_loads(tmp_path):
    """Given the remat-ir module, Trainer saved checkpoints without `config.json`
    (`from_pretrained` failed: "Unrecognized model") and needed `remove_unused_columns=False`
    and `label_names`. With `in_place=True` it is given the model itself, with default
    arguments: the losses are eager's, and its checkpoint loads as the model."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    dataset = token_dataset(12, 64, (5, 30))
    losses, trained = {}, {}
    for kind in ("plain", "remat"):
        model = small_llama(hidden=32, vocab=64)
        if kind == "remat":
            scheduled = remat_ir.remat(model, _Collator()(dataset[:4]), budget=0.5, cost_model="flops",
                                       in_place=True, time_limit_s=5)
        args = TrainingArguments(output_dir=str(tmp_path / kind), max_steps=3, per_device_train_batch_size=4,
                                 learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                                 use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=_Collator())
        losses[kind] = [entry["loss"] for entry in trainer.train() and trainer.state.log_history
                        if "loss" in entry]
        trained[kind] = [p.detach().clone() for p in model.parameters()]
        trainer.save_model(str(tmp_path / kind / "final"))
        if kind == "remat":
            assert len(scheduled.plans) >= 2   # the calls went through the plan, new lengths planned
            loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / kind / "final"))
            assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters()))
    assert len(losses["plain"]) == 3 and losses["remat"] == losses["plain"]
    assert all(torch.equal(a, b) for a, b in zip(trained["plain"], trained["remat"]))


def test_trainer_epochs_with_accumulation_clipping_evaluation_saves_and_resume_are_plain_trainers(tmp_path):
    """README's Trainer claim, run: two epochs of 22 samples at batch 4 (the last batch
    smaller), gradient accumulation, clipping, an evaluation and a save per epoch. The log
    (losses, gradient norms, evaluation losses) and the weights are plain Trainer's, and a
    run resumed from the first epoch's checkpoint ends on the uninterrupted run's weights."""
    from transformers import Trainer, TrainingArguments

    dataset, evalset = token_dataset(22, 64, (9, 16)), token_dataset(6, 64, (9, 16))   # all padded to 16

    def run(kind, name, resume=None):
        model = small_llama(hidden=32, vocab=64)
        if kind == "remat":
            remat_ir.remat(model, _Collator()(dataset[:4]), solver="recompute-all", cost_model="flops",
                           in_place=True)
        args = TrainingArguments(output_dir=str(tmp_path / name), num_train_epochs=2, per_device_train_batch_size=4,
                                 per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_grad_norm=0.5,
                                 learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="epoch",
                                 eval_strategy="epoch", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                                 seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=evalset,
                          data_collator=_Collator())
        trainer.train(resume_from_checkpoint=resume)
        log = [(entry.get("step"), entry.get("loss"), entry.get("grad_norm"), entry.get("eval_loss"))
               for entry in trainer.state.log_history]
        return log, [p.detach().clone() for p in model.parameters()]

    plain_log, plain_weights = run("plain", "plain")
    remat_log, remat_weights = run("remat", "remat")
    assert sum(loss is not None for _, loss, _, _ in plain_log) == 6   # 2 epochs of 3 optimizer steps
    assert sum(loss is not None for _, _, _, loss in plain_log) == 2   # an evaluation per epoch
    assert remat_log == plain_log
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, remat_weights))
    _, resumed_weights = run("remat", "resumed", resume=str(tmp_path / "remat" / "checkpoint-3"))
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, resumed_weights))
