"""Multi-frame stacks: merge a group of frames onto the shared reference, and fuse the groups exactly.

A group's result is a (2, H, W) float32 array: the weighted sum of the aligned, level-normalised mosaics and
the sum of weights. Sums from any partition of the frames add up to the same totals, so fusing two groups of
four equals one group of eight (up to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from services.pipeline.ops.levels import normalize_levels
from services.pipeline.ops.merge import accumulate_frames
from services.raw.meta import RawMeta


def _normalised(raw: np.ndarray, meta: RawMeta, device: torch.device) -> torch.Tensor:
    return normalize_levels(torch.from_numpy(np.asarray(raw)).to(device), meta.black_levels, meta.white_level)


def merge_frame_group(
    reference: tuple[np.ndarray, RawMeta],
    frames: Sequence[tuple[np.ndarray, RawMeta]],
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Align ``frames`` to the reference and accumulate them; returns (2, H, W): [weighted sum, weight]."""
    dev = torch.device(device)
    ref = _normalised(*reference, dev)  # [H, W]
    mosaics = [_normalised(raw, meta, dev) for raw, meta in frames]
    total, weight, _ = accumulate_frames(ref, mosaics, reference[1].cfa)
    return torch.stack([total, weight]).float().cpu().numpy()  # [2, H, W]


def fuse_groups(groups: Sequence[np.ndarray]) -> np.ndarray:
    """Fuse group accumulations into one normalised mosaic (H, W) float32: sum of sums / sum of weights."""
    if not groups:
        raise ValueError("no frame groups to fuse")
    total = np.zeros(groups[0].shape[1:], dtype=np.float64)
    weight = np.zeros_like(total)
    for g in groups:
        total += g[0]
        weight += g[1]
    return (total / np.maximum(weight, 1e-12)).astype(np.float32)
