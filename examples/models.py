"""Model factories for `remat-ir convert --torch examples.models:NAME` and the demo.

Each returns (model, example_inputs): a tuple of positional inputs or a dict of
keyword inputs. Architectures come from configs with random weights.
"""

import torch


def gpt2():
    """A 4-layer GPT-2 (transformers), dropout 0.1, language-model loss."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=512, n_positions=128,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 512, (4, 128))
    return GPT2LMHeadModel(config), dict(input_ids=ids, labels=ids, use_cache=False)
