"""Noise-aware locally adaptive (Lee / local Wiener) filter for linear RGB."""

from __future__ import annotations

from torch import Tensor

from services.pipeline.ops._checks import as_vector, check_image, check_min_size
from services.pipeline.ops.filters import box_mean

_EPS = 1e-10


def denoise_lee(rgb: Tensor, shot: Tensor | float, read: Tensor | float, radius: int = 2,
                strength: float = 1.0, noise_scale: Tensor | None = None) -> Tensor:
    """Shrink each pixel towards its local mean by how much of the local variance is noise.

    ``rgb`` (B, 3, H, W) linear. The noise variance at mean level ``m`` is ``shot * m + read``; ``shot`` and
    ``read`` are scalars or (3,) per channel (after white balance by gain g: ``g * shot`` and
    ``g**2 * read``). ``m`` and the variance ``v`` come from (2r+1)^2 box windows (reflect padding);
    ``out = m + w (x - m)`` with ``w = clamp((v - strength * n) / v, 0, 1)``. Receptive radius ``radius``.
    ``noise_scale`` (B, 1 or 3, H, W), optional: a per-pixel factor on the noise variance (a fused stack's
    1 / merge weight).
    """
    check_image(rgb, 3, "rgb")
    if radius < 1:
        raise ValueError(f"radius must be >= 1, got {radius}")
    check_min_size(rgb, radius, "rgb")
    shot_c = as_vector(shot, rgb, 3, "shot").view(1, 3, 1, 1)
    read_c = as_vector(read, rgb, 3, "read").view(1, 3, 1, 1)
    mean = box_mean(rgb, radius)  # (B, 3, H, W)
    var = box_mean(rgb * rgb, radius) - mean * mean  # (B, 3, H, W)
    noise = shot_c * mean.clamp(min=0.0) + read_c  # (B, 3, H, W)
    if noise_scale is not None:
        noise = noise * box_mean(noise_scale, radius)
    weight = ((var - noise * strength) / var.clamp(min=_EPS)).clamp(0.0, 1.0)
    return mean + weight * (rgb - mean)
