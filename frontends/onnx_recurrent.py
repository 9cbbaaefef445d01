"""ONNX `LSTM` and `GRU` (what `nn.LSTM` and `nn.GRU` export as): the recurrence unrolled
over the sequence, one step of the spec's equations per time step, so that the backward
is PyTorch's and a remat-ir plan may recompute any step.

Supported: both layouts, forward/reverse/bidirectional, optional bias and initial states,
LSTM peepholes and `input_forget`, GRU's `linear_before_reset`, `clip`, and the default
activations (sigmoid, tanh, tanh). Refused by name: other activations, and
`sequence_lens` shorter than the sequence (packed sequences).
"""

from __future__ import annotations

import torch

from .onnx_ops import OpError, op

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _check(node, x, sequence_lens):
    kind = node.op_type
    activations = node.attr("activations")
    if activations is not None:
        names = [a.decode() if isinstance(a, bytes) else a for a in activations]
        per_direction = _DEFAULT_ACTIVATIONS[kind]
        if any(n != per_direction[i % len(per_direction)] for i, n in enumerate(names)):
            raise OpError(f"{kind} activations {names} (only the defaults {per_direction})")
    if sequence_lens is not None and any(length != x.shape[0] for length in sequence_lens):
        raise OpError(f"{kind} with sequence_lens shorter than the sequence (packed sequences)")


def _directions(node) -> list[bool]:
    """Per direction, whether it runs the sequence backwards."""
    direction = node.attr("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]


def _clipped(node, value: torch.Tensor) -> torch.Tensor:
    clip = node.attr("clip")
    return value if clip is None else value.clamp(-clip, clip)


@op("LSTM", static=(4,), diff=(0, 1, 2, 3, 5, 6, 7))
def _lstm(node, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    layout = node.attr("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        initial_h = None if initial_h is None else initial_h.transpose(0, 1)
        initial_c = None if initial_c is None else initial_c.transpose(0, 1)
    _check(node, x, sequence_lens)
    hidden = node.attr("hidden_size", r.shape[-1])
    steps, batch = x.shape[0], x.shape[1]
    outputs, last_h, last_c = [], [], []
    for d, backwards in enumerate(_directions(node)):
        h = x.new_zeros(batch, hidden) if initial_h is None else initial_h[d]
        c = x.new_zeros(batch, hidden) if initial_c is None else initial_c[d]
        bias = None if b is None else b[d, :4 * hidden] + b[d, 4 * hidden:]
        pi, po, pf = (None, None, None) if p is None else p[d].chunk(3)
        ys = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            gates = x[t] @ w[d].t() + h @ r[d].t()
            if bias is not None:
                gates = gates + bias
            i, o, f, g = gates.chunk(4, -1)
            if pi is not None:
                i, f = i + pi * c, f + pf * c
            i = torch.sigmoid(_clipped(node, i))
            f = 1 - i if node.attr("input_forget", 0) else torch.sigmoid(_clipped(node, f))
            c = f * c + i * torch.tanh(_clipped(node, g))
            if po is not None:
                o = o + po * c
            h = torch.sigmoid(_clipped(node, o)) * torch.tanh(c)
            ys[t] = h
        outputs.append(torch.stack(ys))
        last_h.append(h)
        last_c.append(c)
    y, y_h, y_c = torch.stack(outputs, 1), torch.stack(last_h), torch.stack(last_c)
    if layout:   # Y as [batch, seq, directions, hidden]; the states batch first
        return y.permute(2, 0, 1, 3), y_h.transpose(0, 1), y_c.transpose(0, 1)
    return y, y_h, y_c


@op("GRU", static=(4,), diff=(0, 1, 2, 3, 5))
def _gru(node, x, w, r, b=None, sequence_lens=None, initial_h=None):
    layout = node.attr("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        initial_h = None if initial_h is None else initial_h.transpose(0, 1)
    _check(node, x, sequence_lens)
    hidden = node.attr("hidden_size", r.shape[-1])
    steps, batch = x.shape[0], x.shape[1]
    before_reset = node.attr("linear_before_reset", 0)
    outputs, last_h = [], []
    for d, backwards in enumerate(_directions(node)):
        h = x.new_zeros(batch, hidden) if initial_h is None else initial_h[d]
        wz, wr, wh = w[d].chunk(3)
        rz, rr, rh = r[d].chunk(3)
        if b is None:
            wb = rb = x.new_zeros(3 * hidden)
        else:
            wb, rb = b[d, :3 * hidden], b[d, 3 * hidden:]
        wbz, wbr, wbh = wb.chunk(3)
        rbz, rbr, rbh = rb.chunk(3)
        ys = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            z = torch.sigmoid(_clipped(node, x[t] @ wz.t() + h @ rz.t() + wbz + rbz))
            reset = torch.sigmoid(_clipped(node, x[t] @ wr.t() + h @ rr.t() + wbr + rbr))
            if before_reset:
                candidate = x[t] @ wh.t() + reset * (h @ rh.t() + rbh) + wbh
            else:
                candidate = x[t] @ wh.t() + (reset * h) @ rh.t() + rbh + wbh
            h = (1 - z) * torch.tanh(_clipped(node, candidate)) + z * h
            ys[t] = h
        outputs.append(torch.stack(ys))
        last_h.append(h)
    y, y_h = torch.stack(outputs, 1), torch.stack(last_h)
    if layout:
        return y.permute(2, 0, 1, 3), y_h.transpose(0, 1)
    return y, y_h
