"""Raw levels -> normalised linear camera values."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from services.pipeline.ops.cfa import site_map


def normalize_levels(raw: Tensor, black: Sequence[float], white: float) -> Tensor:
    """(H, W) raw counts (any int/float dtype) -> float32 ``(raw - black) / (white - black)`` in [0, 1].

    ``black`` holds the black levels of the four 2x2 CFA sites, row-major. The tensor must start at an even
    row and column of the frame so that its sites line up with ``black``. Values below black clip to 0 and
    above white to 1 (saturated).
    """
    if not isinstance(raw, Tensor) or raw.ndim != 2:
        shape = tuple(raw.shape) if isinstance(raw, Tensor) else type(raw).__name__
        raise ValueError(f"raw must be a (H, W) tensor, got {shape}")
    if len(black) != 4:
        raise ValueError(f"black must hold 4 per-site levels, got {len(black)}")
    if any(float(b) >= float(white) for b in black):
        raise ValueError(f"white level {white} must exceed every black level {tuple(black)}")
    b = torch.tensor([float(v) for v in black], dtype=torch.float32, device=raw.device).view(2, 2)
    black_map = site_map(b, *raw.shape)  # (H, W)
    return ((raw.to(torch.float32) - black_map) / (float(white) - black_map)).clamp_(0.0, 1.0)
