"""Random small networks of random ops over (batch, width) tensors, for the differential
tests of both backends: elementwise ops, norms, matrix products, and the shapes that
break rematerialization when something is wrong (views of one allocation read by
several ops, in-place writes, nodes with several outputs, saved indices and masks,
buffers updated in place, random draws, assignments through a mask of the data, indices
of the data saved for the backward, ties), regions under no_grad, enable_grad and
inference_mode, and custom autograd Functions whose backward is not their derivative or
whose forward draws."""

from __future__ import annotations

import random
import warnings

import torch
from hypothesis import strategies as st


_UNARY = ("relu", "tanh", "gelu", "dropout", "layer_norm", "softmax", "linear", "sigmoid_mul",
          # aliasing, mutation, several outputs, saved integers and masks, buffers, draws:
          "chunk_mul", "slice_scale", "inplace_relu", "max_shift", "cumsum", "batch_norm",
          "permute_columns", "rand_add", "detach_mul", "channel_norm",
          # grad modes inside the forward, custom Functions with backwards of their own:
          "no_grad_mul", "inference_mul", "straight_through", "function_square", "function_dropout",
          # saved indices of the data (ties, sorts, gathers), shifted and strided views:
          "topk_scatter", "amax_ties", "sort_cummax", "logsumexp", "roll_flip", "var_scale",
          "embed_argmax", "unfold_prod", "abs_pow",
          # a parameter written in place under no_grad, then read twice; a hook's weight:
          "decay_linear", "weight_norm_linear",
          # a stacked LSTM (oneDNN's layer on CPU, its workspace read by its backward), a
          # GRU, a convolution, linear upsampling and a group norm (kernels eager runs on
          # its own paths: oneDNN, eager's GRU code, eager's upsampling kernel):
          "lstm", "gru", "conv", "upsample", "group_norm",
          # LayerDrop off, its number drawn from Python's generator (MusicGen's):
          "python_layer_drop",
          # sizes the input's values decide (rows a mask of the input selects, rows repeated
          # by counts read from it): read as eager's at lowering (`input_sizes`):
          "input_rows", "input_repeats",
          # padding by amounts read from an integer buffer (Encodec's convolutions): read
          # as eager's, from the buffer's values at every call (`input_sizes`):
          "buffer_pad",
          # a buffer the forward updates from the data, whose new value no output reads (an
          # EMA of features, as after a network's last block: hunt80 F2), once or more:
          "ema_buffer")
_BINARY = ("add", "mul", "matmul_t", "cat_linear", "where", "slice_assign", "mean_scale",
           "mask_assign", "view_inplace", "clamp_between", "attention", "index_add", "cross_entropy")


class _StraightThrough(torch.autograd.Function):
    """Rounds to quarters; passes the gradient on unchanged (round's derivative is zero)."""

    @staticmethod
    def forward(ctx, x):
        return (x * 4).round() / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class _SquareTimesThree(torch.autograd.Function):
    """Squares; its backward (3 g x) is not the square's derivative, and reads a saved input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * grad * x


class _Dropout(torch.autograd.Function):
    """Inverted dropout drawing its mask in its forward and saving it for its backward."""

    @staticmethod
    def forward(ctx, x):
        keep = (torch.rand_like(x) > 0.3).to(x.dtype)
        ctx.save_for_backward(keep)
        return x * keep / 0.7

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep / 0.7


class RandomNet(torch.nn.Module):
    """A random program over (batch, width) tensors: each step applies an op to earlier
    results; the loss sums the squares of the results nothing else read (with `heads`,
    the forward returns those results, one output each, for the caller's loss)."""

    def __init__(self, program: list[tuple[str, tuple[int, ...]]], width: int, heads: bool = False):
        super().__init__()
        self.program, self.heads = program, heads
        self.linears = torch.nn.ModuleList(torch.nn.Linear(width, width)
                                           for op, _ in program if op == "linear")
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width)
                                         for op, _ in program if op == "layer_norm")
        # cat_linear: Linear over two results side by side. Its backward hands each its
        # gradient as a slice of one tensor, which the lowering may copy out of it
        # (frontends/view_compaction.py) when one is read long after the other.
        self.cat_linears = torch.nn.ModuleList(torch.nn.Linear(2 * width, width)
                                               for op, _ in program if op == "cat_linear")
        # batch_norm: running statistics are buffers the step updates in place.
        self.batch_norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(width)
                                               for op, _ in program if op == "batch_norm")
        # channel_norm: BatchNorm1d over a (batch, length, channels) view transposed to
        # channels first, as PatchTST normalizes, then a dropout over it transposed back:
        # its CPU kernel lays out its result otherwise than its fake kernel, and eager
        # draws the mask in that layout (frontends/kernel_layouts.py).
        self.channels = 2 if width % 2 == 0 else 1
        self.channel_norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(self.channels)
                                                 for op, _ in program if op == "channel_norm")
        # lstm: two stacked LSTM layers over the width read as a sequence of `channels`-wide
        # steps. Eager's CPU LSTM runs oneDNN's layer, whose backward reads a workspace the
        # forward returns (frontends/rnn_workspaces.py, runtimes/grad_mode_kernels.py).
        self.lstms = torch.nn.ModuleList(torch.nn.LSTM(self.channels, self.channels, num_layers=2,
                                                       batch_first=True)
                                         for op, _ in program if op == "lstm")
        self.grus = torch.nn.ModuleList(torch.nn.GRU(self.channels, self.channels, batch_first=True)
                                        for op, _ in program if op == "gru")
        # conv: a 3x3 convolution (one channel in, two out, padded) over the width read as
        # a `channels` x (width / channels) image; the two channels are summed back.
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(1, 2, 3, padding=1)
                                         for op, _ in program if op == "conv")
        self.group_norms = torch.nn.ModuleList(torch.nn.GroupNorm(1, self.channels)
                                               for op, _ in program if op == "group_norm")
        # mask_assign: a trainable row put where a mask of the data says (`x[mask] = row`,
        # whose backward sums the gradient's masked rows: frontends/masked_assign.py).
        if any(op == "mask_assign" for op, _ in program):
            self.mask_row = torch.nn.Parameter(torch.randn(width))
        # embed_argmax: an embedding looked up at indices of the data (its backward
        # accumulates rows that the indices repeat).
        self.embeds = torch.nn.ModuleList(torch.nn.Embedding(width, width)
                                          for op, _ in program if op == "embed_argmax")
        # decay_linear: a Linear whose weight the forward decays in place under no_grad (as
        # a clamp or nn.Embedding's max_norm writes), then read by the Linear and a product:
        # the write is an update copied in after the forward, the gradient two reads' sum.
        self.decay_linears = torch.nn.ModuleList(torch.nn.Linear(width, width)
                                                 for op, _ in program if op == "decay_linear")
        # weight_norm_linear: a Linear under the hook-based `torch.nn.utils.weight_norm`,
        # whose pre-hook computes the weight from `weight_g` and `weight_v` at every call.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # its deprecation
            self.weight_norm_linears = torch.nn.ModuleList(
                torch.nn.utils.weight_norm(torch.nn.Linear(width, width))
                for op, _ in program if op == "weight_norm_linear")
        # buffer_pad: a shift by padding amounts held in an integer buffer.
        if any(op == "buffer_pad" for op, _ in program):
            self.register_buffer("pad_total", torch.tensor(3), persistent=False)
        if any(op == "ema_buffer" for op, _ in program):
            self.register_buffer("ema", torch.zeros(width))
        # permute_columns: an index with a constant permutation (its backward scatters).
        self.register_buffer("permutation", torch.randperm(width, generator=torch.Generator().manual_seed(width)))

    def forward(self, x):
        values = self.values(x)
        returned = output_values(self.program)
        if self.heads:
            return tuple(values[i] for i in returned)
        return sum((values[i] * values[i]).sum() for i in returned)

    def values(self, x) -> list:
        """The input, then each op's result."""
        values, linears, norms = [x], iter(self.linears), iter(self.norms)
        cat_linears, batch_norms = iter(self.cat_linears), iter(self.batch_norms)
        decay_linears, weight_norm_linears = iter(self.decay_linears), iter(self.weight_norm_linears)
        channel_norms, embeds, lstms = iter(self.channel_norms), iter(self.embeds), iter(self.lstms)
        grus, convs, group_norms = iter(self.grus), iter(self.convs), iter(self.group_norms)
        half = x.shape[-1] // 2
        for op, inputs in self.program:
            a = values[inputs[0]]
            b = values[inputs[-1]]
            if op == "relu":
                y = torch.relu(a)
            elif op == "tanh":
                y = torch.tanh(a)
            elif op == "gelu":
                y = torch.nn.functional.gelu(a)
            elif op == "dropout":
                y = torch.nn.functional.dropout(a, 0.3, training=True)
            elif op == "layer_norm":
                y = next(norms)(a)
            elif op == "softmax":
                y = torch.softmax(a, dim=-1)
            elif op == "linear":
                y = next(linears)(a)
            elif op == "weight_norm_linear":
                y = next(weight_norm_linears)(a)
            elif op == "decay_linear":
                decayed = next(decay_linears)
                with torch.no_grad():
                    decayed.weight.mul_(0.99)
                y = decayed(a) + a @ decayed.weight
            elif op == "sigmoid_mul":
                y = a * torch.sigmoid(a)
            elif op == "add":
                y = a + b
            elif op == "mul":
                y = a * b
            elif op == "cat_linear":
                y = next(cat_linears)(torch.cat([a, b], dim=-1))
            elif op == "chunk_mul":  # one node, two views; each read by another op
                p, q = a.chunk(2, dim=-1)
                y = torch.cat([p * q, q.tanh()], dim=-1)
            elif op == "slice_scale":  # slices of one tensor, each scaled
                y = torch.cat([a[:, :half] * 2, a[:, half:] * 0.5], dim=-1)
            elif op == "inplace_relu":  # in-place op on a fresh intermediate
                y = a * 1.5
                y.relu_()
            elif op == "max_shift":  # two outputs, the indices saved for the backward
                top, _ = a.max(dim=-1, keepdim=True)
                y = a - top
            elif op == "cumsum":
                y = a.cumsum(dim=-1)
            elif op == "batch_norm":
                y = next(batch_norms)(a)
            elif op == "ema_buffer":
                with torch.no_grad():
                    self.ema.mul_(0.9).add_(a.detach().float().mean(0), alpha=0.1)
                y = a * 1.5
            elif op == "channel_norm":
                channels_first = a.unflatten(-1, (-1, self.channels)).transpose(1, 2)
                normed = next(channel_norms)(channels_first).transpose(1, 2)
                y = torch.nn.functional.dropout(normed, 0.3, training=True).reshape(a.shape)
            elif op in ("lstm", "gru"):
                rnn = next(lstms if op == "lstm" else grus)
                # On CUDA eager runs cuDNN's RNN, which lowering refuses (cudnn_rnns.py).
                y = (rnn(a.unflatten(-1, (-1, self.channels)))[0].reshape(a.shape)
                     if a.device.type == "cpu" else a * 1.0)
            elif op == "conv":
                image = next(convs)(a.unflatten(-1, (self.channels, -1))[:, None])
                y = (image[:, 0] + image[:, 1]).reshape(a.shape)
            elif op == "upsample":  # eager's kernel; every other sample of twice the width
                y = torch.nn.functional.interpolate(a[:, None], scale_factor=2, mode="linear")[:, 0, ::2] * a
            elif op == "group_norm":
                y = next(group_norms)(a.unflatten(-1, (self.channels, -1))).reshape(a.shape)
            elif op == "permute_columns":
                y = a[:, self.permutation] * a
            elif op == "rand_add":  # a random op that is not dropout
                y = a + torch.rand_like(a)
            elif op == "python_layer_drop":  # drawn at every step, never skips (`python_draws`)
                y = a if self.training and random.uniform(0, 1) < 0.0 else torch.tanh(a)
            # Sizes read from the input's values whose count every input gives alike (the
            # rows above the median; ranks modulo 3), where the rows vary: tests that train
            # a graph on other inputs run it, as a real loader's batches would.
            elif op == "input_rows":   # a loss over the rows the input marks (x[mask])
                y = a + a[x[:, 0] > x[:, 0].median()].sum(0, keepdim=True) * 0.5
            elif op == "buffer_pad":   # F.pad by integer tensors, sliced by one (`__index__`)
                right = self.pad_total // 2
                left = self.pad_total - right
                y = a * torch.nn.functional.pad(a, (left, right))[:, right:right + a.shape[-1]]
            elif op == "input_repeats":   # each row repeated 0 to 2 times, by its rank
                counts = x[:, 0].argsort().argsort() % 3
                y = a + a.repeat_interleave(counts, dim=0).square().mean(0, keepdim=True)
            elif op == "detach_mul":
                y = a * a.detach().sigmoid()
            elif op == "no_grad_mul":  # a factor without a gradient, grad mode back on inside
                with torch.no_grad():
                    factor = a.sigmoid()
                    with torch.enable_grad():
                        y = a * 0.5
                y = y * factor
            elif op == "inference_mul":  # inference mode: no gradient, as no_grad
                with torch.inference_mode():
                    factor = a.tanh()
                y = a * factor.clone()
            elif op == "straight_through":
                y = _StraightThrough.apply(a)
            elif op == "function_square":
                y = _SquareTimesThree.apply(a)
            elif op == "function_dropout":  # a draw inside a Function, its mask saved
                y = _Dropout.apply(a)
            elif op == "where":  # a boolean mask saved for the backward
                y = torch.where(a > 0, a, b * 0.5)
            elif op == "slice_assign":  # a write into a slice of a copy
                y = a.clone()
                y[:, :half] = b[:, :half] * 3
            elif op == "mean_scale":  # broadcast: the backward sums over the width
                y = a * b.mean(dim=-1, keepdim=True)
            elif op == "mask_assign":
                y = a * 1.0
                y[b[:, 0] > 0] = self.mask_row.to(y.dtype)
            elif op == "topk_scatter":  # saved indices of the data, scattered back
                top, where = a.topk(half, dim=-1)
                y = torch.zeros_like(a).scatter_add(-1, where, top * 2)
            elif op == "amax_ties":  # clamped: ties, among which amax shares its gradient
                y = a * a.clamp(-0.5, 0.5).amax(dim=-1, keepdim=True)
            elif op == "sort_cummax":
                y = a.sort(dim=0, stable=True).values.cummax(dim=-1).values
            elif op == "logsumexp":
                y = a - a.logsumexp(dim=-1, keepdim=True)
            elif op == "roll_flip":
                y = a.roll(1, dims=-1).flip(0) * a
            elif op == "var_scale":
                y = a / (a.var(dim=-1, keepdim=True) + 1).sqrt()
            elif op == "embed_argmax":
                y = next(embeds)(a.argmax(dim=-1)) + a
            elif op == "unfold_prod":  # overlapping windows: a strided view of one storage
                y = torch.nn.functional.pad(a.unfold(-1, 2, 1).prod(-1), (0, 1))
            elif op == "abs_pow":
                y = a.abs().pow(1.5)
            elif op == "view_inplace":  # an in-place product into a view of a fresh result
                y = a * 1.0
                y[:, half:].mul_(b[:, half:])
            elif op == "clamp_between":  # bounds that are tensors needing gradients
                y = a.clamp(min=b - 0.5, max=b + 0.5)
            elif op == "attention":  # the fused kernel, its log-sum-exp saved
                y = torch.nn.functional.scaled_dot_product_attention(a[None], b[None], b[None])[0]
            elif op == "index_add":  # an in-place accumulation at constant indices
                y = a.clone()   # of a's dtype: under autocast b may be another (a linear's)
                y.index_add_(1, self.permutation[:half], b[:, :half].to(y.dtype), alpha=0.5)
            elif op == "cross_entropy":  # targets from the data
                y = torch.nn.functional.cross_entropy(a, b.argmax(dim=-1), reduction="none")[:, None] * a
            else:
                y = a @ b.t() @ b / a.shape[-1]
            values.append(y)
        return values


def output_values(program: list) -> list[int]:
    """Indices of the values the network returns (or sums into its loss): those no op of
    `program` reads. Value 0 is the input; op k makes value k + 1."""
    read = {i for _, inputs in program for i in inputs}
    return [i for i in range(1, len(program) + 1) if i not in read]


@st.composite
def programs(draw):
    program = []
    for i in range(draw(st.integers(2, 9))):
        if draw(st.booleans()):
            program.append((draw(st.sampled_from(_UNARY)), (draw(st.integers(0, i)),)))
        else:
            program.append((draw(st.sampled_from(_BINARY)),
                            (draw(st.integers(0, i)), draw(st.integers(0, i)))))
    # Something to train: a linear whose result nothing else reads is part of the output,
    # so the step has a gradient. One read only by ops without a gradient did not (soak,
    # 2026-12-03: [linear, cross_entropy] reads the linear's result through argmax alone,
    # and lowering refused the network, rightly, as computing no gradient).
    if not any(program[i - 1][0] == "linear" for i in output_values(program)):
        program.append(("linear", (len(program),)))
    return program


def lowered_under(forward_context, model: torch.nn.Module, args: tuple):
    """`model` lowered under `forward_context()` (autocast), or None, with the hypothesis
    event saying why, where remat-ir says its gradients' last bits may differ from
    eager's (an input read through several autocast casts and directly: `autocast_casts`
    warns) or refuses the graph (a `decay_linear` weight, written in the forward, whose
    new value autocast casts)."""
    from hypothesis import event

    from remat_ir.frontends.torch import LoweringError
    from remat_ir.lowering import lower_torch

    with forward_context(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            graph = lower_torch(model, args, cost_model="flops")
        except LoweringError as refused:
            if "autocast casts its new value" not in str(refused):
                raise
            event("a written parameter cast by autocast (refused)")
            return None
        except RuntimeError as failed:
            # oneDNN's bfloat16 LSTM has no kernel for some sizes on some CPUs (eager's
            # forward raises it too: an LSTM two wide under CPU autocast, drawn since the
            # op list grew on 2026-12-07): nothing to compare on this machine.
            if "could not create a primitive descriptor" not in str(failed):
                raise
            event("a oneDNN kernel this CPU lacks (eager fails too)")
            return None
    if any("also used otherwise" in str(w.message) for w in caught):
        event("autocast cache not replicated (warned)")
        return None
    return graph

