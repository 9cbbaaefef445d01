"""`remat_ir::spec_augment_mask`: transformers' SpecAugment mask, drawn by eager's own
NumPy code at every step, as one op of the graph.

Why: transformers' speech models (Wav2Vec2, HuBERT, WavLM, Data2VecAudio, SEW, UniSpeech,
Wav2Vec2-BERT, Wav2Vec2-Conformer, SpeechT5, Whisper) mask spans of time steps (and of
features) while training, with a mask their `_compute_mask_indices` draws from NumPy's
global generator (`mask_time_prob=0.05` by default in Wav2Vec2's and HuBERT's configs,
and in transformers' fine-tuning script). Traced, the draw ran once and the graph would
have repeated that mask at every step: the model was refused, and fine-tuning with the
default config needed `mask_time_prob=0.0`, that is without SpecAugment.

The op calls the model module's `_compute_mask_indices` with the arguments the forward
gave it, the attention mask a tensor of the step: the same NumPy draws in the same order
as eager's forward, so the mask, the gradients and NumPy's state after the step are
eager's. Its node is `non_recomputable` (a second run would draw a second mask), and each
such op of a step reads the mask drawn before it (`after`), so that every plan draws them
in eager's order. Registered when `remat_ir.torchlib.types` is imported, which every
frontend and runtime does.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

NAME = "remat_ir::spec_augment_mask"
#: The op as the IR names it.
OP = "remat_ir.spec_augment_mask.default"
#: The function each module of transformers' speech models defines (a copy of
#: Wav2Vec2's), and the parameters it takes.
FUNCTION = "_compute_mask_indices"
PARAMETERS = ("shape", "mask_prob", "mask_length", "attention_mask", "min_masks")


def missing(module: str) -> str | None:
    """Why `module` cannot draw the mask in this process (not importable, or without
    `_compute_mask_indices`), or None. A graph file names the module its mask comes from;
    checked before a first step, so that a missing transformers is one clear error instead
    of a ModuleNotFoundError from inside the step."""
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        return f"its module {module} cannot be imported here ({exc}): install the library the model came from"
    if not callable(getattr(loaded, FUNCTION, None)):
        return (f"its module {module} has no function {FUNCTION} here: the installed library differs "
                f"from the one the graph was lowered with; lower the model again")
    return None


def draw(module: str, shape: list[int], mask_prob: float, mask_length: int, min_masks: int,
         attention_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The mask `module`'s `_compute_mask_indices` draws now, on `device`, as the forward
    makes it a tensor (`torch.tensor(..., dtype=torch.bool)`)."""
    compute = getattr(importlib.import_module(module), FUNCTION)
    mask = compute(tuple(shape), mask_prob=mask_prob, mask_length=mask_length,
                   attention_mask=attention_mask, min_masks=min_masks)
    return torch.tensor(np.asarray(mask), device=device, dtype=torch.bool)


@torch.library.custom_op(NAME, mutates_args=())
def spec_augment_mask(module: str, shape: list[int], mask_prob: float, mask_length: int,
                      min_masks: int, attention_mask: torch.Tensor | None, after: torch.Tensor | None,
                      device: torch.device) -> torch.Tensor:
    """`draw(...)`; `after`, the mask drawn before it in the step (or None), is only read
    to order the draws."""
    return draw(module, shape, mask_prob, mask_length, min_masks, attention_mask, device)


@spec_augment_mask.register_fake
def _(module, shape, mask_prob, mask_length, min_masks, attention_mask, after, device):
    return torch.empty(list(shape), dtype=torch.bool, device=device)
