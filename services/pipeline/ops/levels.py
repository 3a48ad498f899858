"""Raw levels -> normalised linear camera values."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from services.pipeline.ops._checks import small
from services.pipeline.ops.cfa import site_map


def normalize_levels(raw: Tensor, black: Sequence[float], white: float, *, clip_black: bool = True) -> Tensor:
    """(H, W) raw counts (any int/float dtype) -> float32 ``(raw - black) / (white - black)`` in [0, 1].

    ``black`` holds the black levels of the four 2x2 CFA sites, row-major. The tensor must start at an even
    row and column of the frame so that its sites line up with ``black``. Values below black clip to 0 and
    above white to 1 (saturated). ``clip_black=False`` keeps values below black (negative, at most 1): the noise
    of a dark sample averages out only unclipped (a stack's merged Bayer mosaic,
    :func:`services.pipeline.ops.merge.accumulate_frames`).
    """
    if not isinstance(raw, Tensor) or raw.ndim != 2:
        shape = tuple(raw.shape) if isinstance(raw, Tensor) else type(raw).__name__
        raise ValueError(f"raw must be a (H, W) tensor, got {shape}")
    if len(black) != 4:
        raise ValueError(f"black must hold 4 per-site levels, got {len(black)}")
    if any(float(b) >= float(white) for b in black):
        raise ValueError(f"white level {white} must exceed every black level {tuple(black)}")
    b = small([float(v) for v in black], raw.device, torch.float32).view(2, 2)
    black_map = site_map(b, *raw.shape)  # (H, W)
    out = (raw.to(torch.float32) - black_map) / (float(white) - black_map)
    return out.clamp_(0.0, 1.0) if clip_black else out.clamp_(max=1.0)


def normalize_linear(raw: Tensor, black: Sequence[float], white: float) -> Tensor:
    """(H, W, 3) raw counts of a linear image (any int/float dtype) -> (1, 3, H, W) float32
    ``(raw_c - black_c) / (white - black_c)`` clipped to [0, 1]; ``black`` holds the R, G, B levels (a fourth
    value, LibRaw's second green, is ignored)."""
    if not isinstance(raw, Tensor) or raw.ndim != 3 or raw.shape[2] != 3:
        shape = tuple(raw.shape) if isinstance(raw, Tensor) else type(raw).__name__
        raise ValueError(f"raw must be a (H, W, 3) tensor, got {shape}")
    if len(black) not in (3, 4):
        raise ValueError(f"black must hold the R, G, B levels, got {len(black)} values")
    if any(float(b) >= float(white) for b in black[:3]):
        raise ValueError(f"white level {white} must exceed every black level {tuple(black)}")
    b = small([float(v) for v in black[:3]], raw.device, torch.float32).view(1, 3, 1, 1)
    x = raw.to(torch.float32).permute(2, 0, 1)[None]  # (1, 3, H, W)
    return ((x - b) / (float(white) - b)).clamp_(0.0, 1.0)
