"""Real architectures from configs with random weights (no downloads), small enough for CI.

Each factory returns (model, args, kwargs, loss_of) where `loss_of(output)` is
the scalar to call backward on.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class MLPWithLoss(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1)]
        self.body = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x, target):
        return nn.functional.mse_loss(self.body(x), target)


def mlp():
    torch.manual_seed(0)
    return MLPWithLoss(), (torch.randn(16, 32), torch.randn(16, 1)), {}, lambda out: out


def gpt2(n_layer=2, n_embd=32, seq=16, batch=2):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_head=2, n_embd=n_embd, vocab_size=128, n_positions=seq,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids, use_cache=False), lambda out: out.loss


def llama(n_layer=8, hidden=32, vocab=256, seq=32, batch=2, kv_heads=2):
    """A Llama shaped like the benchmark's 32-layer one in miniature: parameter gradients
    (a quarter of the store-everything peak) and the loss set its least memory.

    `kv_heads=2`: grouped-query attention, which transformers runs through SDPA's
    native GQA when it builds no mask, traced as eager runs it
    (frontends/transformers_masks.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 8,
                         num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=kv_heads,
                         max_position_embeddings=seq, use_cache=False)
    model = LlamaForCausalLM(config).train()
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids), lambda out: out.loss


def resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                          layer_type="basic", num_labels=3)
    model = ResNetForImageClassification(config)
    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([0, 1, 2, 1])
    return model, (), dict(pixel_values=pixels, labels=labels), lambda out: out.loss


class UNetWithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        from diffusers import UNet2DModel
        self.unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                                block_out_channels=(8, 16), norm_num_groups=4,
                                down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                up_block_types=("AttnUpBlock2D", "UpBlock2D"))

    def forward(self, noisy, timestep, noise):
        return nn.functional.mse_loss(self.unet(noisy, timestep).sample, noise)


def unet():
    torch.manual_seed(0)
    model = UNetWithLoss()
    return (model, (torch.randn(2, 3, 16, 16), torch.tensor([10, 500]), torch.randn(2, 3, 16, 16)),
            {}, lambda out: out)


class ConvBNNet(nn.Module):
    """Residual conv-BatchNorm-ReLU blocks and a classifier: most of the activation memory
    is BatchNorm's and ReLU's outputs, which only recomputing BatchNorm can free."""

    def __init__(self, channels=16, blocks=3):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
                          nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1),
                          nn.BatchNorm2d(channels))
            for _ in range(blocks))
        self.head = nn.Linear(channels, 10)

    def forward(self, x, labels):
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(x + block(x))
        return nn.functional.cross_entropy(self.head(x.mean((2, 3))), labels)


def conv_bn(blocks=3):
    torch.manual_seed(0)
    return (ConvBNNet(blocks=blocks), (torch.randn(4, 3, 16, 16), torch.tensor([0, 3, 7, 9])), {},
            lambda out: out)


MODELS = {"mlp": mlp, "gpt2": gpt2, "resnet": resnet, "unet": unet}


def mlp_for_cli():
    """Factory in the form `remat-ir convert --torch` expects: (model, example inputs)."""
    model, args, _, _ = mlp()
    return model, args


def gpt2_for_cli():
    """A tiny GPT-2 and its batch (keyword inputs, labels included) for `remat-ir convert --torch`."""
    model, _, kwargs, _ = gpt2(n_layer=1)
    return model, kwargs


def a_factory_that_raises():
    """`remat-ir convert --torch` names where a factory failed (it printed a traceback)."""
    raise RuntimeError("the factory failed on purpose")


def not_a_factory_result():
    return 42


class Guarded(torch.nn.Module):
    """A forward guarding its computation with a branch on its activations' values that
    only raises: refused before ("branches on a value computed from tensor data")."""

    def __init__(self, kind: str):
        super().__init__()
        self.lin, self.kind = torch.nn.Linear(8, 8), kind

    def forward(self, x):
        h = self.lin(x)
        loss = h.square().mean()
        if self.kind == "nan guard":
            if torch.isnan(loss):
                raise RuntimeError("the loss is NaN")
        elif self.kind == "assert":
            assert (h.abs() < 50).all(), "activations exploded"
        elif self.kind == "assert not":
            assert not (h.abs() >= 50).any()
        elif self.kind == "assert item":   # ProphetNet's form: the truth read by `.item()`
            assert torch.all(h.abs() < 50).item(), "activations exploded"
        elif self.kind == "computed message":
            if h.amax() > 50:
                raise ValueError(f"too big: {h.amax()}")
        elif self.kind == "computes on both sides":
            if loss > 1:
                loss = loss * 2
        elif self.kind == "one operand of or":
            if torch.isnan(loss) or self.kind == "never":
                raise RuntimeError("the loss is NaN")
        return loss
