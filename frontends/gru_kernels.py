"""eager's CPU GRU, written so that its trace computes eager's bits.

Why: eager's CPU GRU cell (ATen's `GRUCell`) adds the gate pre-activations in place
into column blocks of the hidden projection, `hgates[:, :H].add_(igates[:, :H])`, then
applies `sigmoid_` to that block, a view whose rows are `3H` apart. Traced, the in-place
add becomes an add whose result is a fresh contiguous tensor, and the sigmoid runs over
it as one flat loop, where eager's runs row by row. A CPU kernel runs a row shorter than
its vector width (32 floats with AVX-512) through its scalar code, which rounds otherwise
than the vectorized code: `nn.GRUCell(16, 16)` on a batch of 32 computed outputs 6e-8
and gradients 1.5e-7 off eager's, a stacked `nn.GRU` 2e-7.

So while tracing, `aten.gru.input` and `aten.gru_cell` run these Python versions of
ATen's CPU code (`FullLayer`, `FullBidirectionalLayer`, `apply_layer_stack`, dropout
between layers included), op for op, except that the two sigmoid gates are computed from
one add over both blocks and read as column slices, so each sigmoid reads rows `2H` apart
and loops row by row as eager's does. Other devices, and packed sequences
(`aten.gru.data`), keep eager's C++ composite (`torch.py`'s `_eager_kernels`).
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey


def _cell(gates_i: torch.Tensor, hidden: torch.Tensor, w_hh: torch.Tensor,
          b_hh: torch.Tensor | None) -> torch.Tensor:
    """One step of ATen's CPU `GRUCell` on the input's projection `gates_i` (N, 3H)."""
    size = hidden.shape[-1]
    gates_h = torch.nn.functional.linear(hidden, w_hh, b_hh)
    # eager: the reset and input blocks of gates_h += those of gates_i, then sigmoid_
    # on each block (a strided view); one add over both blocks computes the same sums.
    summed = gates_h[:, :2 * size] + gates_i[:, :2 * size]
    reset = summed[:, :size].sigmoid()
    update = summed[:, size:].sigmoid()
    new = (gates_i[:, 2 * size:] + gates_h[:, 2 * size:] * reset).tanh()
    return (hidden - new) * update + new


def _layer(inputs: torch.Tensor, hidden: torch.Tensor, weights: list[torch.Tensor],
           reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's `FullLayer` on CPU: the input projection of every step at once, then the
    cells in order (reversed for a bidirectional layer's second direction)."""
    w_ih, w_hh, b_ih, b_hh = (weights + [None, None])[:4]
    steps = list(torch.nn.functional.linear(inputs, w_ih, b_ih).unbind(0))
    outputs = []
    for step in (reversed(steps) if reverse else steps):
        hidden = _cell(step, hidden, w_hh, b_hh)
        outputs.append(hidden)
    if reverse:
        outputs.reverse()
    return torch.stack(outputs, 0), hidden


def gru_input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
              batch_first):
    """`aten.gru.input` as ATen computes it on CPU (module docstring)."""
    if input.device.type != "cpu":
        return torch.ops.aten.gru.input._op_dk(
            DispatchKey.CompositeImplicitAutograd, input, hx, params, has_biases, num_layers,
            dropout, train, bidirectional, batch_first)
    per_direction = 4 if has_biases else 2
    groups = [list(params[i:i + per_direction]) for i in range(0, len(params), per_direction)]
    hiddens = hx.unbind(0)
    directions = 2 if bidirectional else 1
    layer_input = input.transpose(0, 1) if batch_first else input
    finals = []
    for layer in range(num_layers):
        forward, final = _layer(layer_input, hiddens[directions * layer],
                                groups[directions * layer])
        finals.append(final)
        if bidirectional:
            backward, final = _layer(layer_input, hiddens[2 * layer + 1], groups[2 * layer + 1],
                                     reverse=True)
            finals.append(final)
            forward = torch.cat([forward, backward], forward.dim() - 1)
        layer_input = forward
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(finals, 0)


def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """`aten.gru_cell` as ATen computes it on CPU (module docstring)."""
    if input.device.type != "cpu":
        return torch.ops.aten.gru_cell.default._op_dk(
            DispatchKey.CompositeImplicitAutograd, input, hx, w_ih, w_hh, b_ih, b_hh)
    return _cell(torch.nn.functional.linear(input, w_ih, b_ih), hx, w_hh, b_hh)


#: The overloads traced through these versions, with their kernels.
KERNELS = {torch.ops.aten.gru.input: gru_input, torch.ops.aten.gru_cell.default: gru_cell}
