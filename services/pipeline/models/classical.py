"""The classical enhancement: Malvar-He-Cutler demosaic then the noise-aware Lee filter (no weights).

The fallback when no learned package is available, and the baseline the learned one is measured against.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from services.pipeline.models.base import Enhancer
from services.pipeline.models.manifest import Manifest
from services.pipeline.ops import MALVAR_RADIUS, demosaic_malvar, denoise_lee
from services.pipeline.ops._checks import small

ARCHITECTURE = "classical"
DENOISE_RADIUS = 2
# Malvar interpolation averages neighbours, so the 5x5 local variance of demosaiced noise is below the
# mosaic's ``shot * m + read``: measured on flat fields with equal noise in all channels, 0.86 (R, B) and
# 0.71 (G). The mosaic's noise model is scaled by these (R, G, B) before the Lee filter.
DEMOSAIC_NOISE_FACTORS: tuple[float, float, float] = (0.86, 0.71, 0.86)


def classical_receptive_field(config: dict[str, Any]) -> int:
    """Malvar (2) + Lee (``denoise_radius``, default 2) in full-resolution pixels."""
    return MALVAR_RADIUS + int(config.get("denoise_radius", DENOISE_RADIUS))


class ClassicalEnhancer(Enhancer):
    """Malvar demosaic + Lee denoise, exactly the ops the renderer used before model packages existed."""

    def __init__(self, manifest: Manifest, device: torch.device) -> None:
        super().__init__(manifest, device, torch.float32)
        self.denoise_radius = int(manifest.config.get("denoise_radius", DENOISE_RADIUS))
        self.noise_factors = tuple(float(f) for f in manifest.config.get("noise_factors", DEMOSAIC_NOISE_FACTORS))

    def _enhance(self, mosaic: Tensor, cfa: str, shot: Tensor, read: Tensor) -> Tensor:
        factors = small(self.noise_factors, mosaic.device, mosaic.dtype)  # (3,)
        rgb = demosaic_malvar(mosaic, cfa)  # (B, 3, H, W)
        return denoise_lee(rgb, factors * shot, factors * read, radius=self.denoise_radius)


def build_classical(manifest: Manifest, weights: dict[str, Tensor] | None, device: torch.device,
                    compute_dtype: torch.dtype) -> ClassicalEnhancer:
    """Architecture builder (no weights; always float32: the filters are cheap and exactness matters)."""
    del weights, compute_dtype
    return ClassicalEnhancer(manifest, device)


__all__ = ["ARCHITECTURE", "DEMOSAIC_NOISE_FACTORS", "ClassicalEnhancer", "build_classical",
           "classical_receptive_field"]
