"""The model zoo of the exactness tests and `benchmarks/zoo.py`: architectures from configs.

Each factory takes a size ("tiny": the tests' configs, seconds to lower; "bench":
the benchmark's, larger) and returns (model, args, kwargs, loss_of), random
weights from seed 0, dropout on wherever the config has it, in training mode.
`loss_of(output)` is the scalar to call backward on. Nothing is downloaded.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def _quiet_transformers():
    from transformers.utils import logging
    logging.set_verbosity_error()


def _causal_lm(config_class, model_class, size, **extra):
    _quiet_transformers()
    torch.manual_seed(0)
    hidden, layers, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    config = config_class(vocab_size=128 if size == "tiny" else 1024, hidden_size=hidden,
                          intermediate_size=hidden * 2 + 8, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max(seq, 64), use_cache=False, **extra)
    model = model_class(config).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids), lambda out: out.loss


def llama(size="tiny"):
    from transformers import LlamaConfig, LlamaForCausalLM
    return _causal_lm(LlamaConfig, LlamaForCausalLM, size, attention_dropout=0.1)


def mistral(size="tiny"):
    from transformers import MistralConfig, MistralForCausalLM
    return _causal_lm(MistralConfig, MistralForCausalLM, size, attention_dropout=0.1,
                      head_dim=None)


def qwen2(size="tiny"):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return _causal_lm(Qwen2Config, Qwen2ForCausalLM, size, attention_dropout=0.1)


def gpt_neox(size="tiny"):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    _quiet_transformers()
    torch.manual_seed(0)
    hidden, layers, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    config = GPTNeoXConfig(vocab_size=128, hidden_size=hidden, intermediate_size=hidden * 4,
                           num_hidden_layers=layers, num_attention_heads=4,
                           max_position_embeddings=max(seq, 64), use_cache=False,
                           hidden_dropout=0.1, attention_dropout=0.1)
    model = GPTNeoXForCausalLM(config).train()
    ids = torch.randint(0, 128, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids), lambda out: out.loss


def gpt2(size="tiny", layers=None):
    """`layers`: another depth than the size's (fewer blocks: fewer regions to compile)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    _quiet_transformers()
    torch.manual_seed(0)
    embd, depth, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    layers = layers or depth
    config = GPT2Config(n_layer=layers, n_head=2, n_embd=embd, vocab_size=128, n_positions=seq,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 128, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids), lambda out: out.loss


def bert(size="tiny"):
    from transformers import BertConfig, BertForMaskedLM
    _quiet_transformers()
    torch.manual_seed(0)
    hidden, layers, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    config = BertConfig(vocab_size=128, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=hidden * 4,
                        max_position_embeddings=max(seq, 64))
    model = BertForMaskedLM(config).train()
    ids = torch.randint(0, 128, (batch, seq))
    return model, (), dict(input_ids=ids, labels=ids), lambda out: out.loss


def distilbert(size="tiny"):
    """Sequence classification with a padded attention mask (the second sequence is short)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    _quiet_transformers()
    torch.manual_seed(0)
    dim, layers, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    config = DistilBertConfig(vocab_size=128, dim=dim, n_layers=layers, n_heads=4,
                              hidden_dim=dim * 4, max_position_embeddings=max(seq, 64),
                              num_labels=3)
    model = DistilBertForSequenceClassification(config).train()
    ids = torch.randint(1, 128, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq // 2:] = 0
    ids[1, seq // 2:] = 0
    labels = torch.arange(batch) % 3
    return model, (), dict(input_ids=ids, attention_mask=mask, labels=labels), lambda out: out.loss


def wav2vec2_ctc(size="tiny"):
    """Speech recognition fine-tuning: audio of two lengths (an attention mask), labels
    padded with -100, the CTC loss (one op of fixed shapes: `frontends/ctc_losses.py`),
    SpecAugment's time masks as the default config draws them (NumPy, at every step:
    `frontends/spec_augment.py`)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    _quiet_transformers()
    torch.manual_seed(0)
    hidden, layers, samples, batch = (16, 1, 800, 2) if size == "tiny" else (64, 4, 16000, 4)
    config = Wav2Vec2Config(vocab_size=12, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=2, intermediate_size=hidden * 2,
                            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
                            layerdrop=0.0, pad_token_id=0,
                            feat_extract_norm="layer", ctc_loss_reduction="mean")
    model = Wav2Vec2ForCTC(config).train()
    audio = torch.randn(batch, samples)
    mask = torch.ones(batch, samples, dtype=torch.long)
    mask[1, samples * 3 // 4:] = 0
    labels = torch.randint(1, 12, (batch, 6))
    labels[1, 3:] = -100
    kwargs = dict(input_values=audio, attention_mask=mask, labels=labels)
    return model, (), kwargs, lambda out: out.loss


def vit(size="tiny"):
    from transformers import ViTConfig, ViTForImageClassification
    _quiet_transformers()
    torch.manual_seed(0)
    hidden, layers, image, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 64, 8)
    config = ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                       intermediate_size=hidden * 4, image_size=image, patch_size=4,
                       num_labels=5, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = ViTForImageClassification(config).train()
    pixels = torch.randn(batch, 3, image, image)
    labels = torch.arange(batch) % 5
    return model, (), dict(pixel_values=pixels, labels=labels), lambda out: out.loss


def t5(size="tiny"):
    """Encoder-decoder called with labels: `_shift_right` makes a lifted tensor constant."""
    from transformers import T5Config, T5ForConditionalGeneration
    _quiet_transformers()
    torch.manual_seed(0)
    d, layers, seq, batch = (32, 2, 16, 2) if size == "tiny" else (128, 4, 128, 4)
    config = T5Config(vocab_size=128, d_model=d, d_kv=8, d_ff=d * 2, num_layers=layers,
                      num_heads=4, decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.1,
                      use_cache=False)
    model = T5ForConditionalGeneration(config).train()
    ids = torch.randint(1, 128, (batch, seq))
    labels = torch.randint(1, 128, (batch, seq // 2))
    return model, (), dict(input_ids=ids, labels=labels), lambda out: out.loss


def whisper(size="tiny"):
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    _quiet_transformers()
    torch.manual_seed(0)
    d, layers, frames, batch = (32, 2, 32, 2) if size == "tiny" else (128, 4, 200, 4)
    config = WhisperConfig(vocab_size=128, d_model=d, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=4, decoder_attention_heads=4,
                           encoder_ffn_dim=d * 2, decoder_ffn_dim=d * 2, num_mel_bins=8,
                           max_source_positions=frames // 2, max_target_positions=32,
                           decoder_start_token_id=1, pad_token_id=0, dropout=0.1,
                           bos_token_id=1, eos_token_id=2, use_cache=False)
    model = WhisperForConditionalGeneration(config).train()
    features = torch.randn(batch, 8, frames)
    labels = torch.randint(3, 128, (batch, 8))
    return model, (), dict(input_features=features, labels=labels), lambda out: out.loss


class UNetConditioned(nn.Module):
    """diffusers' UNet2DConditionModel with cross-attention to encoder states, MSE to noise."""

    def __init__(self, size):
        super().__init__()
        from diffusers import UNet2DConditionModel
        channels = (8, 16) if size == "tiny" else (32, 64)
        self.unet = UNet2DConditionModel(
            sample_size=8 if size == "tiny" else 32, in_channels=4, out_channels=4,
            layers_per_block=1, block_out_channels=channels, norm_num_groups=4,
            cross_attention_dim=16, attention_head_dim=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))

    def forward(self, noisy, timestep, encoder_states, noise):
        out = self.unet(noisy, timestep, encoder_hidden_states=encoder_states).sample
        return nn.functional.mse_loss(out, noise)


def unet_conditioned(size="tiny"):
    torch.manual_seed(0)
    model = UNetConditioned(size).train()
    side, batch = (8, 2) if size == "tiny" else (32, 4)
    args = (torch.randn(batch, 4, side, side), torch.tensor([10, 500] * (batch // 2)),
            torch.randn(batch, 6, 16), torch.randn(batch, 4, side, side))
    return model, args, {}, lambda out: out


def _lora(model, targets):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=targets, lora_dropout=0.1))
    with torch.no_grad():  # lora_B starts at zero; give the adapters something to differentiate
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model.train()


def lora_llama(size="tiny"):
    """The regression of the RNG issue: q_proj and v_proj adapters, dropout on both."""
    model, args, kwargs, loss_of = llama(size)
    return _lora(model, ["q_proj", "v_proj"]), args, kwargs, loss_of


def lora_gpt2(size="tiny"):
    model, args, kwargs, loss_of = gpt2(size)
    return _lora(model, ["c_attn", "c_fc"]), args, kwargs, loss_of


class StraightThroughRound(torch.autograd.Function):
    """Forward rounds; backward passes the gradient on unchanged (its own backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad):
        return grad


class ScaledTanh(torch.autograd.Function):
    """A Function that saves tensors and a constant, and has a non-obvious backward."""

    @staticmethod
    def forward(ctx, x, scale):
        y = torch.tanh(x) * scale
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (ctx.scale - y * y / ctx.scale), None


class QuantizedMLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, 1)

    def forward(self, x, target):
        h = ScaledTanh.apply(self.a(x), 2.0)
        h = StraightThroughRound.apply(self.b(h) * 4) / 4
        return nn.functional.mse_loss(self.c(nn.functional.dropout(h, 0.1)), target)


def straight_through(size="tiny"):
    torch.manual_seed(0)
    width, batch = (16, 8) if size == "tiny" else (256, 64)
    return (QuantizedMLP(width).train(), (torch.randn(batch, width), torch.randn(batch, 1)), {},
            lambda out: out)


class SmallCNN(nn.Module):
    def __init__(self, channels):
        super().__init__()
        c = channels
        self.body = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(2 * c, 10))

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.body(x), labels)


def cnn_batchnorm(size="tiny"):
    torch.manual_seed(0)
    channels, side, batch = (4, 8, 4) if size == "tiny" else (32, 32, 16)
    return (SmallCNN(channels).train(), (torch.randn(batch, 3, side, side),
                                         torch.arange(batch) % 10), {}, lambda out: out)


class MLPDropout(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.2)]
        self.body = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x, target):
        return nn.functional.mse_loss(self.body(x), target)


def mlp_dropout(size="tiny"):
    torch.manual_seed(0)
    width, depth, batch = (16, 3, 8) if size == "tiny" else (512, 8, 64)
    return (MLPDropout(width, depth).train(), (torch.randn(batch, width), torch.randn(batch, 1)),
            {}, lambda out: out)


ZOO = {f.__name__: f for f in (
    llama, mistral, qwen2, gpt_neox, gpt2, bert, distilbert, vit, t5, whisper, wav2vec2_ctc,
    unet_conditioned, lora_llama, lora_gpt2, straight_through, cnn_batchnorm, mlp_dropout)}
