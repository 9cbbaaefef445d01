"""The README's first example: a transformers Llama, keyword inputs, half the memory.

    python examples/quickstart.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import remat_ir
from remat_ir.runtimes.memory import measure_peak

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=344,
                                     num_hidden_layers=4, num_attention_heads=4,
                                     use_cache=False)).train()
ids = torch.randint(0, 1024, (4, 128))
batch = {"input_ids": ids, "labels": ids}          # what model(**batch) takes

scheduled = remat_ir.remat(model, batch, budget=0.5)  # half of autograd's activation peak


def step(module):
    module(**batch).loss.backward()


def peak(module):
    """One step's peak, the last step's gradients dropped before it: a free of a tensor
    made before the measurement lowers the CPU figure only where the profiler saw it made
    (`measure_peak`), which would measure one module net of them and not the other."""
    module.zero_grad(set_to_none=True)
    return measure_peak(lambda: step(module), "cpu").peak_bytes


step(scheduled)                                       # the first call compiles the segments
eager, ours = peak(model), peak(scheduled)
print(f"peak of one training step: eager {eager / 2**20:.1f} MiB, "
      f"remat-ir {ours / 2**20:.1f} MiB ({ours / eager:.0%})")
