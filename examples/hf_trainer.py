"""Train a small causal LM with Hugging Face's `Trainer` through remat-ir, beside plain
`Trainer`, with dynamic padding (every batch padded to its own longest sequence).

    python examples/hf_trainer.py

The only change to a Trainer script is one line: the model passed to `Trainer` is
`remat_ir.remat(model, example_batch, budget=..., outputs=["loss"])` (or, with
`in_place=True`, the model itself, whose calls then run the plan: checkpoints
`from_pretrained` loads, README; `outputs=["loss"]`: Trainer reads the loss alone, so the
logits are planned as intermediates). Batches of a new padded length are
lowered once each (a notice says so) and planned, or take the plan made for another
length where it fits them. Prints both runs' losses, which are equal, and the lengths
that were planned.
"""

from __future__ import annotations

import copy
import random
import sys
import tempfile

import torch

import remat_ir


def small_llama(hidden: int = 64, layers: int = 2, vocab: int = 256):
    """A Llama from a config, random weights, dropout on (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 8,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=128, attention_dropout=0.1, use_cache=False,
                         pad_token_id=0)
    return LlamaForCausalLM(config).train()


def token_dataset(count: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> list[dict]:
    """Sequences of random lengths: what dynamic padding is for."""
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(1, vocab) for _ in range(rng.randint(*lengths))]}
            for _ in range(count)]


class _Collator:
    """Pads each batch to a multiple of 8 of its longest sequence; labels are the inputs
    with padding ignored (what DataCollatorForLanguageModeling(mlm=False) does, without a
    tokenizer to download)."""

    def __call__(self, features: list[dict]) -> dict:
        longest = max(len(f["input_ids"]) for f in features)
        length = -(-longest // 8) * 8
        ids = torch.zeros(len(features), length, dtype=torch.long)
        mask = torch.zeros(len(features), length, dtype=torch.long)
        for row, f in enumerate(features):
            ids[row, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[row, :len(f["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train(model, dataset, *, steps: int, batch_size: int, output_dir: str) -> list[float]:
    """Losses of `steps` Trainer steps of `model` (a plain model or a remat-ir module)."""
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                             learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                             use_cpu=True, disable_tqdm=True, remove_unused_columns=False,
                             label_names=["labels"],
                             dataloader_num_workers=0, seed=0)
    losses: list[float] = []

    class Recorder(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            loss = super().compute_loss(model, inputs, return_outputs, **kwargs)
            losses.append((loss[0] if return_outputs else loss).item())
            return loss

    Recorder(model=model, args=args, train_dataset=dataset, data_collator=_Collator()).train()
    return losses


def main(steps: int = 6, budget="50%") -> None:
    model = small_llama()
    dataset = token_dataset(64, model.config.vocab_size, (20, 60))
    plain = copy.deepcopy(model)
    example = _Collator()(dataset[:4])
    # Trainer trains on the loss alone: the logits need not be kept to the end of the step.
    scheduled = remat_ir.remat(model, example, budget=budget, outputs=["loss"])
    with tempfile.TemporaryDirectory() as out:
        eager_losses = train(plain, dataset, steps=steps, batch_size=4, output_dir=out)
        remat_losses = train(scheduled, dataset, steps=steps, batch_size=4, output_dir=out)
    print("step  plain Trainer    through remat-ir")
    for step, (a, b) in enumerate(zip(eager_losses, remat_losses)):
        print(f"{step:4d}  {a:.10f}  {b:.10f}  {'equal' if a == b else 'DIFFERENT'}")
    lengths = sorted({int(g.value(e.value_id).shape[1]) for g, _ in scheduled.plans
                      for e in g.proto.inputs if e.name == "input0"})
    reused = sum("reused_from" in s.solver_params for _, s in scheduled.plans)
    print(f"padded lengths planned: {lengths} ({reused} of them took the plan of another "
          f"length, which fits them: solvers.solve's reuse)")
    sys.exit(0 if eager_losses == remat_losses else 1)


if __name__ == "__main__":
    main()
