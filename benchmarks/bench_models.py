"""The models of the training-step comparison, each wrapped to return its loss.

Every factory takes a size ("quick" or "full") and returns a `BenchModel`: the
loss-returning module, its example inputs, and the module classes that
`torch.utils.checkpoint` wraps when a user "checkpoints every block". The loss is
computed here from the logits (not by transformers' `labels=` path, whose logging
breaks `torch.compile(fullgraph=True)`), so every method trains the same function.
Architectures come from configs with random weights (no downloads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class BenchModel:
    name: str
    description: str
    module: torch.nn.Module  # forward(*inputs) -> scalar loss
    inputs: tuple
    blocks: tuple[type, ...]  # what "checkpoint every block" wraps


class CausalLMLoss(torch.nn.Module):
    """Next-token cross-entropy of a causal language model (GPT-2)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        logits = self.model(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


class MaskedLMLoss(torch.nn.Module):
    """Cross-entropy of a masked language model (BERT) on every position."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        logits = self.model(input_ids=ids).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class ClassifierLoss(torch.nn.Module):
    """Cross-entropy of an image classifier (ResNet)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels, labels):
        return F.cross_entropy(self.model(pixel_values=pixels).logits, labels)


class DenoisingLoss(torch.nn.Module):
    """A diffusion U-Net trained to predict the noise (mean squared error)."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, noisy, timesteps, noise):
        return F.mse_loss(self.unet(noisy, timesteps).sample, noise)


def _quiet_transformers():
    from transformers.utils import logging
    logging.set_verbosity_error()


def gpt2(size: str) -> BenchModel:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    _quiet_transformers()
    torch.manual_seed(0)
    layers, width, heads, vocab, seq, batch = ((4, 128, 4, 2048, 128, 8) if size == "quick"
                                               else (12, 768, 12, 50257, 512, 2))
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                        n_positions=seq, use_cache=False, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, vocab, (batch, seq))
    return BenchModel("gpt2", f"GPT-2 {layers} layers, d={width}, seq {seq}, batch {batch}",
                      CausalLMLoss(GPT2LMHeadModel(config)), (ids,), (GPT2Block,))


def bert(size: str) -> BenchModel:
    from transformers import BertConfig, BertForMaskedLM
    from transformers.models.bert.modeling_bert import BertLayer
    _quiet_transformers()
    torch.manual_seed(0)
    layers, width, heads, vocab, seq, batch = ((4, 128, 4, 2048, 128, 8) if size == "quick"
                                               else (12, 768, 12, 30522, 512, 2))
    config = BertConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                        intermediate_size=4 * width, vocab_size=vocab, max_position_embeddings=seq)
    ids = torch.randint(0, vocab, (batch, seq))
    return BenchModel("bert", f"BERT {layers} layers, d={width}, seq {seq}, batch {batch}",
                      MaskedLMLoss(BertForMaskedLM(config)), (ids, ids), (BertLayer,))


def cnn(size: str) -> BenchModel:
    from transformers import ResNetConfig, ResNetForImageClassification
    from transformers.models.resnet.modeling_resnet import ResNetBasicLayer, ResNetBottleNeckLayer
    torch.manual_seed(0)
    # Bottleneck layouts: their wide high-resolution stages hold most of the activations.
    # (A ResNet-18 layout at 128x128, batch 16, is bound by its stem and its weight gradients:
    # recomputing everything still needs 71% of its store-everything peak.)
    if size == "quick":
        config = ResNetConfig(embedding_size=32, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                              layer_type="bottleneck", num_labels=10)
        image, batch, what = 64, 16, "ResNet bottleneck layout, 2-2-2-2 blocks, 64-512 channels"
    else:  # ResNet-50
        config = ResNetConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                              layer_type="bottleneck", num_labels=1000)
        image, batch, what = 128, 16, "ResNet-50"
    # channels_last, for every method: PyTorch's recipe for convolutions, which Inductor
    # applies by itself (its layout optimization) and eager does not. Contiguous, the quick
    # CNN's eager step took 1.33x its channels_last one, so torch.compile's rows measured
    # the layout as much as the compiler (and remat-ir follows the layout it is given).
    pixels = torch.randn(batch, 3, image, image).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, config.num_labels, (batch,))
    model = ResNetForImageClassification(config).to(memory_format=torch.channels_last)
    return BenchModel("cnn", f"{what}, {image}x{image}, batch {batch}, channels_last",
                      ClassifierLoss(model), (pixels, labels), (ResNetBasicLayer, ResNetBottleNeckLayer))


def unet(size: str) -> BenchModel:
    from diffusers import UNet2DModel
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    torch.manual_seed(0)
    if size == "quick":  # attention at 8x8, as in the full one
        image, batch, channels = 32, 4, (32, 64, 64)
        down, up = ("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"), ("AttnUpBlock2D", "UpBlock2D", "UpBlock2D")
    else:  # examples/models.py:unet, HiRemate's U-Net benchmark
        image, batch, channels = 64, 8, (32, 64, 128, 128)
        down = ("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D")
        up = ("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")
    model = UNet2DModel(sample_size=image, in_channels=3, out_channels=3, layers_per_block=2,
                        block_out_channels=channels, norm_num_groups=8,
                        down_block_types=down, up_block_types=up)
    x = torch.randn(batch, 3, image, image)
    return BenchModel("unet", f"diffusers U-Net {len(channels)} levels, {channels[0]}-{channels[-1]} "
                      f"channels, {image}x{image}, batch {batch}",
                      DenoisingLoss(model), (x, torch.randint(0, 1000, (batch,)), torch.randn_like(x)),
                      (ResnetBlock2D, Attention))


FACTORIES = {"gpt2": gpt2, "bert": bert, "unet": unet, "cnn": cnn}
