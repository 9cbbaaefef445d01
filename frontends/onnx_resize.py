"""ONNX `Resize` (and `Upsample`, which the version converter turns into it): one
interpolation per resized axis, each output position reading the input positions its
coordinate transformation gives, with the spec's weights.

Why not `F.interpolate`: it implements a few (mode, coordinate transformation) pairs of
the spec's dozens, each with its own rounding, so matching onnxruntime would mean a
table of special cases; gathering along each axis with the weights the spec defines
covers every pair with one formula, and its backward (a scatter-add of the weighted
gradient) is PyTorch's. The positions and weights depend on shapes only, which are
static: computed once per axis (`_taps`, cached: the module's own eager calls, in eval
mode, ran the Python loop at every call), with coordinates in float32 as onnxruntime
computes them (`_source`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .onnx_ops import OpError, _axis, op

_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")


def _source(x: int, size: int, out: int, scale: float, how: str, roi: tuple[float, float],
            precision=np.float32) -> float:
    """The input coordinate of output position `x` (the spec's coordinate transformation),
    computed in float32 in onnxruntime's order of operations: where the exact value is a
    whole number, double precision can land just below it and nearest rounding then picks
    the position before onnxruntime's (a 0.6 scale read row 1 where onnxruntime reads 2)."""
    f = precision
    xr, scale, n, m = f(x), f(scale), f(size), f(out)
    if how == "half_pixel":
        return float((xr + f(0.5)) / scale - f(0.5))
    if how == "half_pixel_symmetric":
        adjustment = m / (scale * n)
        offset = (n / f(2)) * (f(1) - adjustment)
        return float(offset + (xr + f(0.5)) / scale - f(0.5))
    if how == "pytorch_half_pixel":
        return float((xr + f(0.5)) / scale - f(0.5)) if out > 1 else 0.0
    if how == "align_corners":
        return 0.0 if out == 1 else float(xr * (n - f(1)) / (m - f(1)))
    if how == "asymmetric":
        return float(xr / scale)
    start, end = f(roi[0]), f(roi[1])   # tf_crop_and_resize
    if out > 1:
        return float(start * (n - f(1)) + (xr * (end - start) * (n - f(1))) / (m - f(1)))
    return float(f(0.5) * (start + end) * (n - f(1)))


def _nearest(coordinate: float, how: str) -> int:
    if how == "floor":
        return math.floor(coordinate)
    if how == "ceil":
        return math.ceil(coordinate)
    if coordinate == math.floor(coordinate) + 0.5:   # a tie
        return math.floor(coordinate) if how == "round_prefer_floor" else math.ceil(coordinate)
    return math.floor(coordinate + 0.5)


def _cubic_weights(t: float, a: float) -> list[float]:
    """The spec's cubic convolution weights of the 4 taps at floor - 1 .. floor + 2."""
    def w(d: float) -> float:
        d = abs(d)
        if d <= 1:
            return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
        if d < 2:
            return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
        return 0.0
    return [w(t + 1), w(t), w(1 - t), w(2 - t)]


def _taps(node, size: int, out: int, scale: float, roi: tuple[float, float]):
    """Per output position along one axis: ((input position, weight), ...), and whether it
    lies outside the input (tf_crop_and_resize's extrapolation)."""
    return _axis_taps(node.attr("mode", "nearest"), node.attr("coordinate_transformation_mode", "half_pixel"),
                      node.attr("nearest_mode", "round_prefer_floor"), node.attr("cubic_coeff_a", -0.75),
                      bool(node.attr("exclude_outside", 0)), size, out, scale, roi)


@functools.lru_cache(maxsize=256)
def _axis_taps(mode: str, how: str, rounding: str, cubic_a: float, exclude_outside: bool,
               size: int, out: int, scale: float, roi: tuple[float, float]):
    taps, outside = [], []
    for x in range(out):
        c = _source(x, size, out, scale, how, roi)
        outside.append(how == "tf_crop_and_resize" and not 0 <= c <= size - 1)
        if mode == "nearest":
            taps.append(((min(max(_nearest(c, rounding), 0), size - 1), 1.0),))
            continue
        base = math.floor(c)
        t = float(np.float32(c) - np.float32(base))
        if mode == "linear":
            found = [(base, 1 - t), (base + 1, t)]
        else:
            found = [(base - 1 + k, w) for k, w in enumerate(_cubic_weights(t, cubic_a))]
            if exclude_outside:
                found = [(p, w) for p, w in found if 0 <= p < size]
                total = sum(w for _, w in found)
                found = [(p, w / total) for p, w in found]
        # Positions beyond the input read its edge, as the spec's reference pads it.
        taps.append(tuple((min(max(p, 0), size - 1), w) for p, w in found))
    return tuple(taps), tuple(outside)


def _resize_axis(x: torch.Tensor, axis: int, taps, outside, extrapolation: float) -> torch.Tensor:
    width = max(len(t) for t in taps)
    shape = [1] * x.dim()
    shape[axis] = len(taps)
    y = None
    for k in range(width):
        positions = torch.tensor([t[k][0] if k < len(t) else 0 for t in taps], device=x.device)
        picked = x.index_select(axis, positions)
        if width == 1:
            y = picked
            break
        weights = torch.tensor([t[k][1] if k < len(t) else 0.0 for t in taps], dtype=torch.float64)
        term = picked * weights.to(x.dtype).to(x.device).reshape(shape)
        y = term if y is None else y + term
    if any(outside):
        mask = torch.tensor(outside, device=x.device).reshape(shape)
        y = torch.where(mask, torch.tensor(extrapolation, dtype=y.dtype, device=y.device), y)
    return y


def _output_sizes(node, x: torch.Tensor, axes: list[int], scales, sizes):
    """(output size, scale) per resized axis, from `scales` or `sizes` (with
    `keep_aspect_ratio_policy`). The region of interest does not change the size given
    by scales: floor(size * scale), as onnxruntime, shape inference and the reference
    evaluator compute it (the spec's text multiplies by the region's extent)."""
    spatial = [x.shape[a] for a in axes]
    if sizes:
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        # Scales in float32, as onnxruntime computes them.
        if policy == "stretch":
            return list(sizes), [float(np.float32(o) / np.float32(i)) for o, i in zip(sizes, spatial)]
        pick = min if policy == "not_larger" else max
        scale = pick(np.float32(o) / np.float32(i) for o, i in zip(sizes, spatial))
        # The spec rounds half away from zero (std::round), not Python's half to even.
        return [int(math.floor(float(scale * np.float32(i)) + 0.5)) for i in spatial], [float(scale)] * len(axes)
    if not scales:
        raise OpError("Resize with neither scales nor sizes")
    # In float32, as onnxruntime computes it (10 * 0.7 is 7 there, 6.999... in double).
    return [int(math.floor(np.float32(i) * np.float32(f))) for i, f in zip(spatial, scales)], list(scales)


def _boxes(roi, axes: list[int], rank: int, crop: bool) -> list[tuple[float, float]]:
    """Each resized axis's region of interest (start, end), read only for
    tf_crop_and_resize: `roi` holds the starts then the ends, of every axis or of `axes`."""
    if not crop or not roi:
        return [(0.0, 1.0)] * len(axes)
    n = len(roi) // 2
    starts, ends = [float(v) for v in roi[:n]], [float(v) for v in roi[n:]]
    if n == rank and len(axes) != rank:
        return [(starts[a], ends[a]) for a in axes]
    return list(zip(starts, ends))


@op("Resize", static=(1, 2, 3), diff=(0,))
def _resize(node, x, roi=None, scales=None, sizes=None):
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise OpError(f"Resize mode {mode!r}")
    how = node.attr("coordinate_transformation_mode", "half_pixel")
    if how not in _TRANSFORMS:
        raise OpError(f"Resize coordinate_transformation_mode {how!r}")
    if mode != "nearest" and not x.is_floating_point():
        raise OpError(f"Resize mode {mode!r} on {x.dtype} (integer interpolation rounds as the "
                      f"runtime chooses)")
    axes = node.attr("axes")
    axes = list(range(x.dim())) if axes is None else [_axis(a, x.dim()) for a in axes]
    boxes = _boxes(_numbers(roi), axes, x.dim(), how == "tf_crop_and_resize")
    outs, factors = _output_sizes(node, x, axes, _numbers(scales), _numbers(sizes))
    if node.attr("antialias", 0) and mode != "nearest" and any(f < 1 for f in factors):
        raise OpError("Resize with antialias=1 downsampling (its filter widens with the scale)")
    extrapolation = float(node.attr("extrapolation_value", 0.0))
    for axis, out, factor, box in zip(axes, outs, factors, boxes):
        size = x.shape[axis]
        if out == 0 or size == 0:
            raise OpError(f"Resize of an axis of size {size} to {out}")
        if out == size and factor != 1:
            # onnxruntime returns such an axis as it is; the spec (and torch, which exported
            # it) interpolates with the scale (found by a review: up to 1.7 apart).
            raise OpError(f"Resize by scale {factor:g} of an axis of size {size} that keeps its "
                          f"size (onnxruntime leaves it as it is, the spec interpolates)")
        if out == size:
            if how == "tf_crop_and_resize" and box != (0.0, 1.0):
                # onnxruntime leaves an unscaled axis as it is; the spec's reference crops it.
                raise OpError(f"Resize tf_crop_and_resize with a region of interest {box} on "
                              f"an axis it does not scale (onnxruntime ignores the region there, "
                              f"the spec's reference crops)")
            continue   # every transformation maps an unscaled axis onto itself
        taps, outside = _taps(node, size, out, factor, box)
        x = _resize_axis(x, axis, taps, outside, extrapolation)
    return x


def _numbers(value) -> list | None:
    """A static input as a list of numbers; None or empty where it is left out."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [value]
    return list(value) or None

