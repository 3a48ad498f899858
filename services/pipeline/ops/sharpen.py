"""Halo-free unsharp masking."""

from __future__ import annotations

import math

from torch import Tensor

from services.pipeline.ops._checks import check_image, check_min_size
from services.pipeline.ops.filters import gaussian_weights, local_min_max, separable_filter


def sharpen_radius(sigma: float = 1.0) -> int:
    """Receptive radius of :func:`sharpen`: the Gaussian's ``ceil(2 sigma)`` (the 3x3 clamp is inside it)."""
    return max(math.ceil(2.0 * sigma), 1)


def sharpen(rgb: Tensor, amount: float = 0.5, sigma: float = 1.0) -> Tensor:
    """Unsharp mask ``x + amount (x - gauss(x))`` clamped to the 3x3 local min/max of ``x`` (no overshoot).

    ``rgb`` (B, 3, H, W); Gaussian of radius ``ceil(2 sigma)``, reflect padding. Output same shape and dtype.
    """
    check_image(rgb, 3, "rgb")
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    radius = math.ceil(2.0 * sigma)
    check_min_size(rgb, max(radius, 1), "rgb")
    if amount == 0.0:
        return rgb
    blurred = separable_filter(rgb, gaussian_weights(sigma, radius))  # (B, 3, H, W)
    lo, hi = local_min_max(rgb, 1)  # (B, 3, H, W) each
    return (rgb + (rgb - blurred) * amount).clamp(lo, hi)
