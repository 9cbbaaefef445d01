"""`torch.istft` traced as eager computes it.

Why: `istft` is a composite op (no backward of its own; autograd differentiates what it
calls), and PyTorch registers a Python version of it (`torch._refs.istft`) that tracing
runs instead of eager's C++ one. The Python version transposes the complex spectrum
where eager's transposes its real view and views that as complex again; the backward of
that real view hands the gradient on contiguous (`view_as_real`'s backward), and the
complex products before it (a mask, a nonlinearity on the spectrum) then run over other
strides, whose vector code rounds otherwise. An stft, a complex nonlinearity and an
istft trained 1e-7 to 2.3e-6 (relative) off eager's gradients, as under `torch.compile`.

So while tracing, `aten.istft` runs `istft` below: eager's C++ composite (ATen's
SpectralOps) op for op. Its one check on values (that the window's overlap-add has no
zero, where eager reads `min() < 1e-11` and raises), which keeps eager's C++ version from
being traced, is traced as a `remat_ir.value_check` raising eager's RuntimeError at every
step (`torchlib/value_checks.py`); PyTorch's Python version leaves it out, and the step
divided by zero where eager raises. `torch.stft`'s Python version takes the same ops'
bits as eager's (frames by `unfold` where eager's use `as_strided`; 58 configurations of
n_fft 8-30, hops 1-5, centring and padding mode, with and without an istft after it,
bitwise) and is kept.
"""

from __future__ import annotations

import warnings

import torch
from torch._C import DispatchKey

aten = torch.ops.aten
#: By ATen's `fft_norm_mode`: no scaling, 1/sqrt(n), 1/n.
_BY_ROOT_N, _BY_N = 1, 2


def istft(input: torch.Tensor, n_fft: int, hop_length: int | None = None,
          win_length: int | None = None, window: torch.Tensor | None = None, center: bool = True,
          normalized: bool = False, onesided: bool | None = None, length: int | None = None,
          return_complex: bool = False) -> torch.Tensor:
    """ATen's `istft`, whose ops and their order it keeps (the argument checks raise what
    eager's do, as `RuntimeError`s; the check on the window's values runs at every step)."""
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    torch._check(window is None or window.device == input.device,
                 lambda: f"istft input and window must be on the same device but got self on "
                         f"{input.device} and window on {window.device}")
    torch._check(input.is_complex(), lambda: "istft requires a complex-valued input tensor matching "
                                             "the output from stft with return_complex=True.")
    real = aten.view_as_real(input.resolve_conj())
    dims, frames, fft_size = real.dim(), real.size(-2), real.size(-3)
    signal = n_fft + hop * (frames - 1)
    torch._check(real.numel() > 0, lambda: "istft: input tensor cannot be empty.")
    torch._check(dims in (3, 4), lambda: f"istft: expected a tensor with 3 or 4 dimensions, but got {dims}")
    sided = (fft_size != n_fft) if onesided is None else onesided
    torch._check(fft_size == (n_fft // 2 + 1 if sided else n_fft),
                 lambda: f"istft: expected the frequency dimension (3rd to the last) of the input "
                         f"tensor to match {'n_fft / 2 + 1' if sided else 'n_fft'} when onesided="
                         f"{sided}, but got {fft_size}")
    torch._check(0 < hop <= win, lambda: "istft: expected 0 < hop_length <= win_length")
    torch._check(0 < win <= n_fft, lambda: "istft: expected 0 < win_length <= n_fft")
    torch._check(window is None or (window.dim() == 1 and window.size(0) == win),
                 lambda: "istft: Invalid window shape. window has to be 1D and length of `win_length`")
    window_ = window if window is not None else torch.ones(win, dtype=real.dtype, device=real.device)
    if win != n_fft:   # centred by zeros on both sides
        left = (n_fft - win) // 2
        window_ = aten.constant_pad_nd(window_, [left, n_fft - win - left], 0)
    if dims == 3:
        real = real.unsqueeze(0)
    spectrum = aten.view_as_complex(real.transpose(1, 2))   # (channel, frames, fft_size)
    norm = _BY_ROOT_N if normalized else _BY_N
    if return_complex:
        torch._check(not sided, lambda: "Cannot have onesided output if window or input is complex")
        frames_ = aten._fft_c2c(spectrum, [spectrum.dim() - 1], norm, False)
    else:
        torch._check(window is None or not window.is_complex(),
                     lambda: "Complex windows are incompatible with return_complex=False")
        if not sided:
            spectrum = aten.slice(spectrum, -1, 0, n_fft // 2 + 1)
        frames_ = aten._fft_c2r(spectrum, [spectrum.dim() - 1], norm, n_fft)
    windowed = frames_ * window_.view(1, 1, n_fft)
    y = aten.unfold_backward(windowed, [windowed.size(0), signal], 1, n_fft, hop)
    envelope = aten.unfold_backward(window_.pow(2).expand(1, frames, n_fft), [1, signal], 1, n_fft, hop)
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else (-(n_fft // 2) if center else signal)
    y, envelope = aten.slice(y, 1, start, end, 1), aten.slice(envelope, 1, start, end, 1)
    torch.ops.remat_ir.value_check(torch.logical_not(envelope.abs().min().lt(1e-11)),
                                   "istft: window overlap add min: 1 (the window's overlap-add has a "
                                   "zero: a hop_length longer than the window's non-zero part)",
                                   "RuntimeError")   # read and raised, as eager's check is
    y = y / envelope
    if dims == 3:
        y = y.squeeze(0)
    if end > signal:
        warnings.warn("The length of signal is shorter than the length parameter. Result is being "
                      "padded with zeros in the tail. Please check your center and hop_length settings.")
        y = aten.constant_pad_nd(y, [0, end - signal], 0)
    return y


#: Op -> the Python kernel tracing runs for it (under `KEY`).
KERNELS = {aten.istft.default: istft}
KEY = DispatchKey.CompositeImplicitAutograd
