"""The model zoo at a sweep of budgets: two optimizer steps through each plan equal eager's.

Seventeen architectures from configs (tiny sizes; `benchmarks/zoo.py` runs larger
ones): Llama, Mistral, Qwen2, GPT-NeoX, GPT-2, BERT, DistilBERT with a padded
mask, ViT, T5 and Whisper with labels, Wav2Vec2 with a CTC loss, a conditioned diffusers U-Net, PEFT LoRA
with dropout on Llama and GPT-2, custom autograd Functions, a CNN with
BatchNorm, an MLP with dropout. Each is planned at store-everything, 50% (where
the planner reaches it; the benchmark adds 70% and 35%) and its smallest
feasible budget; loss,
gradients, buffers and the generator state after every step must be bitwise
equal to eager's, or, for a model `zoo.REASONS` names, within 1e-6 relative.
`make test` sweeps nine of them; the other eight are trained offloaded at 30% there
(`test_offload.py`) and swept by `make test-all` (`slow.py`).
"""

from __future__ import annotations

import pytest

from slow import some_slow
import zoo
import zoo_models

#: Exact under offloading at 30% in `make test` (`test_offload.py`), so swept here only
#: by `make test-all`.
SWEPT_IN_TEST_ALL = ("unet_conditioned", "t5", "mistral", "qwen2", "gpt_neox", "distilbert",
                     "lora_llama", "wav2vec2_ctc")


@pytest.mark.parametrize("name", some_slow(list(zoo_models.ZOO), SWEPT_IN_TEST_ALL))
def test_zoo_model_is_exact_at_every_budget_it_reaches(name):
    rows = zoo.sweep(name, "tiny", cost_model="flops", shares=("50%",), time_limit_s=5,
                     progress=lambda _: None)
    budgets = [r["budget"] for r in rows]
    assert budgets[0] == "store-everything" and budgets[-1] == "smallest feasible", budgets
    reached = [r for r in rows if r["reached"]]
    assert reached[-1]["peak_bytes"] <= min(r["peak_bytes"] for r in reached)
    for row in reached:
        assert not row["failure"], f"{name} at {row['budget']}: {row['failure']}"
        if name not in zoo.REASONS:
            assert row["bitwise"], f"{name} at {row['budget']}: {row['max_relative_error']:.3g}"
