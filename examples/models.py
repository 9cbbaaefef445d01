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


class LanguageModelLoss(torch.nn.Module):
    """A causal language model returning only its loss, as a training step needs it.
    (Returning the logits too makes them a graph output, live to the end of the step.)"""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


class DenoisingLoss(torch.nn.Module):
    """A diffusion U-Net trained to predict the noise (mean squared error)."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, noisy, timesteps, noise):
        return torch.nn.functional.mse_loss(self.unet(noisy, timesteps).sample, noise)


def gpt2_base():
    """GPT-2 with 12 layers, d=768, 12 heads, sequence 512, batch 8 (HiRemate's benchmark)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (8, 512))
    return LanguageModelLoss(GPT2LMHeadModel(config)), (ids, ids)


def unet():
    """A diffusers UNet2DModel (4 levels, 32-128 channels, attention at 8x8), 64x64, batch 8."""
    from diffusers import UNet2DModel
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=64, in_channels=3, out_channels=3, layers_per_block=2,
                        block_out_channels=(32, 64, 128, 128), norm_num_groups=8,
                        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"))
    x = torch.randn(8, 3, 64, 64)
    return DenoisingLoss(model), (x, torch.randint(0, 1000, (8,)), torch.randn(8, 3, 64, 64))
