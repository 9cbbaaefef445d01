"""ONNX models for the ONNX frontend's tests: torch models exported with
`torch.onnx.export(..., dynamo=True)` (what people export today), small hand-built
graphs for single ops, and the model-zoo graphs that ship inside the `onnx` package.

Every torch factory returns (model, example_args, dynamic_shapes, loss_of): the model is
in eval mode (the exported graph is an inference graph: dropout off, BatchNorm on its
running statistics) and has random weights with no two parameters equal, so the
exporter's deduplication of identical initializers cannot merge two parameters.
"""

from __future__ import annotations

import functools
import glob
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def _randomize(model: nn.Module, scale: float = 0.2) -> nn.Module:
    """Distinct random values in every parameter and float buffer (BatchNorm statistics)."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, scale)
        for name, b in model.named_buffers():
            if b.is_floating_point():
                b.uniform_(0.5, 1.5) if name.endswith("running_var") else b.normal_(0, 0.1)
    return model.eval()


class GPT2Logits(nn.Module):
    """GPT-2 returning logits only (the loss is computed outside, on both sides)."""

    def __init__(self, n_layer=2, n_embd=32, seq=16):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging
        logging.set_verbosity_error()
        # Untied embeddings: the exporter folds lm_head's transpose into a new initializer,
        # so a tied weight would become two ONNX parameters that train apart.
        config = GPT2Config(n_layer=n_layer, n_head=2, n_embd=n_embd, vocab_size=128,
                            n_positions=seq, use_cache=False, bos_token_id=0, eos_token_id=0,
                            tie_word_embeddings=False)
        self.gpt = GPT2LMHeadModel(config)

    def forward(self, input_ids):
        return self.gpt(input_ids=input_ids, use_cache=False).logits


def gpt2(batch=4, seq=64):
    torch.manual_seed(0)
    model = _randomize(GPT2Logits(seq=seq))
    ids = torch.randint(0, 128, (batch, seq))
    dynamic = ({0: "batch", 1: "sequence"},)

    def loss_of(logits):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return model, (ids,), dynamic, loss_of


class BertPooled(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32)
        self.bert = BertModel(config)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def bert(batch=2, seq=16):
    torch.manual_seed(1)
    model = _randomize(BertPooled())
    ids = torch.randint(0, 100, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq // 2:] = 0
    dynamic = ({0: "batch", 1: "sequence"}, {0: "batch", 1: "sequence"})
    return model, (ids, mask), dynamic, lambda out: out[0].pow(2).mean() + out[1].sum()


class ResNetLoss(nn.Module):
    """transformers' ResNet with the classification loss inside the graph (int64 labels)."""

    def __init__(self):
        super().__init__()
        from transformers import ResNetConfig, ResNetForImageClassification
        config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                              layer_type="basic", num_labels=3)
        self.resnet = ResNetForImageClassification(config)

    def forward(self, pixels, labels):
        return F.cross_entropy(self.resnet(pixel_values=pixels).logits, labels)


def resnet(batch=4):
    torch.manual_seed(2)
    model = _randomize(ResNetLoss())
    return (model, (torch.randn(batch, 3, 32, 32), torch.arange(batch) % 3),
            ({0: "batch"}, {0: "batch"}), lambda out: out)


class TinyCNN(nn.Module):
    """Conv, ReLU, GELU, residual adds, max and average pooling, Linear, and the loss.

    Deep enough at one resolution that 50% of the store-everything peak is feasible.
    No BatchNorm: in eval mode the exporter folds it into the convolution's weight and
    keeps the weight's name, so the ONNX parameter would not be the torch one.
    """

    def __init__(self, width=8, depth=6):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1, bias=i % 2 == 0)
                                   for i in range(depth))
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2)
        self.fc = nn.Linear(2 * width, 5)

    def forward(self, x, labels):
        x = F.relu(self.stem(x))
        for i, conv in enumerate(self.convs):
            y = conv(x)
            x = F.relu(x + y) if i % 2 else F.gelu(y)
        x = F.gelu(self.down(F.max_pool2d(x, 2)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.cross_entropy(self.fc(x), labels)


def cnn(batch=4):
    torch.manual_seed(3)
    model = _randomize(TinyCNN())
    return (model, (torch.randn(batch, 3, 16, 16), torch.tensor([0, 4, 2, 1])[:batch]),
            ({0: "batch"}, {0: "batch"}), lambda out: out)


class TinyUNet(nn.Module):
    """Down by max pooling, up by `F.interpolate` (`mode`: exported as Resize), a skip
    joined by concatenation: a U-Net's shape."""

    def __init__(self, mode: str, width=8):
        super().__init__()
        self.mode = mode
        self.down1, self.down2 = nn.Conv2d(3, width, 3, padding=1), nn.Conv2d(width, width, 3, padding=1)
        self.up = nn.Conv2d(2 * width, 3, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.down1(x))
        d = F.relu(self.down2(F.max_pool2d(h, 2)))
        options = {} if self.mode == "nearest" else {"align_corners": False}
        u = F.interpolate(d, scale_factor=2, mode=self.mode, **options)
        return self.up(torch.cat([u, h], 1))


def unet(mode: str, batch=4):
    torch.manual_seed(5)
    return (_randomize(TinyUNet(mode)), (torch.randn(batch, 3, 32, 32),), ({0: "batch"},),
            lambda out: out.square().mean())


class MaskedAttention(nn.Module):
    """Self-attention with a causal mask and a scale held as buffers, which the exporter
    marks as such (the Linear weights it folds, transposed, into initializers of its own)."""

    def __init__(self, width=16, seq=8):
        super().__init__()
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.register_buffer("mask", torch.full((seq, seq), -1e4).triu(1))
        self.register_buffer("scale", torch.full((width,), 0.25))

    def forward(self, x):
        q, k, v = (x * self.scale).matmul(self.qkv.weight.t()).add(self.qkv.bias).chunk(3, -1)
        weights = (q @ k.transpose(1, 2) + self.mask).softmax(-1)
        return self.out(weights @ v)


def masked_attention(batch=2):
    torch.manual_seed(7)
    return (_randomize(MaskedAttention()), (torch.randn(batch, 8, 16),), ({0: "batch"},),
            lambda out: out.square().mean())


class Recurrent(nn.Module):
    """Two bidirectional batch-first layers of `kind` (nn.LSTM or nn.GRU) and a head."""

    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(nn, kind)(4, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def recurrent(kind: str, batch=3):
    torch.manual_seed(9)
    return Recurrent(kind), (torch.randn(batch, 5, 4),), ({0: "batch"},), lambda out: out.square().mean()


TORCH_MODELS = {"lstm": functools.partial(recurrent, "LSTM"), "gru": functools.partial(recurrent, "GRU"),
                "masked_attention": masked_attention, "gpt2": gpt2, "cnn": cnn, "bert": bert, "resnet": resnet,
                **{f"unet_{mode}": functools.partial(unet, mode) for mode in ("nearest", "bilinear", "bicubic")}}


def export(model: nn.Module, args: tuple, dynamic_shapes, path: str) -> str:
    """`torch.onnx.export(..., dynamo=True)` with the exporter's defaults, to `path`."""
    import logging
    import warnings
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                                    verbose=False)
    program.save(path)
    return path


def zoo_paths() -> dict[str, str]:
    """The model-zoo graphs shipped in the installed `onnx` package, by model name.

    `onnx/backend/test/data/real/test_*/data.json` only point at these files: the
    zoo architectures (opset 9) with every weight replaced by a `ConstantOfShape` of its
    shape (value 0.02); the trained weights are not shipped.
    """
    import onnx
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return {os.path.basename(p)[len("light_"):-len(".onnx")]: p
            for p in sorted(glob.glob(os.path.join(folder, "light_*.onnx")))}


def rebatched(path: str, batch: int):
    """A zoo graph with batch size `batch` instead of the 1 it was exported with.

    The input's first dimension becomes `batch`, and each `Reshape` whose target shape
    (an initializer) starts with 1 copies the first dimension of its input instead (0 in
    ONNX Reshape), which is the batch in these graphs; ONNX shape inference and the
    frontend's shape check confirm the result. Training runs at batches above 1, where
    activations, not the parameter gradients, dominate memory.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    data = [vi for vi in model.graph.input if vi.name not in inits]
    assert len(data) == 1
    data[0].type.tensor_type.shape.dim[0].dim_value = batch
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_value = batch
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in inits:
            shape = numpy_helper.to_array(inits[node.input[1]]).copy()
            if shape[0] == 1:
                shape[0] = 0
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    return model


def with_random_weights(path: str, seed: int = 0):
    """A zoo graph with each `ConstantOfShape` weight replaced by a random initializer.

    The shipped graphs fill every weight with 0.02, so all 1000 class scores are equal
    and comparing outputs would prove little. Variances are read from the consumer
    (`BatchNormalization` input 4) and drawn positive; other weights are scaled by
    1/sqrt(fan-in) so activations stay finite through 20-120 layers.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    rng = np.random.default_rng(seed)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    variances = {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization"}
    kept, added = [], []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            if node.output[0] in variances:
                value = rng.uniform(0.5, 1.5, shape)
            else:
                fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                value = rng.normal(0, 1 / np.sqrt(fan_in) if len(shape) > 1 else 0.1, shape)
            added.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(added)
    if model.ir_version < 4:  # initializers must be listed as inputs before IR version 4
        model.ir_version = 4
    return model
