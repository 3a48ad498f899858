"""Planning: cut a frame into row strips, or a stack into frame groups, optionally by unequal GPU shares."""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.errors import BadInput


def parse_split_ratio(text: str | None) -> list[float] | None:
    """``"0.6,0.4"`` -> ``[0.6, 0.4]`` (normalised); None or empty -> None."""
    if not text:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise BadInput(f"split_ratio must be comma-separated numbers, got {text!r}") from exc
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        raise BadInput(f"split_ratio must be positive numbers, got {text!r}")
    total = sum(values)
    return [v / total for v in values]


def _apportion(total: int, weights: Sequence[float], unit: int = 1) -> list[int]:
    """Split ``total`` (a multiple of ``unit`` except maybe the tail) into parts proportional to ``weights``."""
    units = total // unit
    scale = sum(weights)
    raw = [w / scale * units for w in weights]
    parts = [int(math.floor(r)) for r in raw]
    # Largest remainders get the leftover units.
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - parts[i], reverse=True)[: units - sum(parts)]:
        parts[i] += 1
    sizes = [p * unit for p in parts]
    sizes[-1] += total - units * unit
    return sizes


def plan_strips(height: int, n_strips: int, ratios: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """Row ranges ``[y0, y1)`` covering ``height``; every cut is on an even row so the CFA phase holds.

    With ``ratios`` (one per strip) the strips get those shares of the rows, for GPUs of unequal speed.
    """
    if height < 2:
        raise BadInput(f"frame too small to plan: {height} rows")
    n_strips = max(1, min(n_strips, height // 2))
    weights = list(ratios) if ratios else [1.0] * n_strips
    sizes = [s for s in _apportion(height, weights, unit=2) if s > 0]
    bounds, y = [], 0
    for s in sizes:
        bounds.append((y, y + s))
        y += s
    return bounds


def plan_frame_groups(n_frames: int, n_groups: int, ratios: Sequence[float] | None = None) -> list[list[int]]:
    """Contiguous groups of frame indices, one per GPU (never cutting a frame); frame 0 is in group 0."""
    n_groups = max(1, min(n_groups, n_frames))
    weights = list(ratios)[:n_groups] if ratios and len(ratios) >= n_groups else [1.0] * n_groups
    sizes = [max(s, 0) for s in _apportion(n_frames, weights)]
    groups, i = [], 0
    for s in sizes:
        if s:
            groups.append(list(range(i, i + s)))
            i += s
    return groups


def strip_count(height: int, target_rows: int, n_workers: int, per_worker: int) -> int:
    """Enough strips to keep every worker busy, and none much taller than ``target_rows``."""
    return max(math.ceil(height / max(target_rows, 2)), max(n_workers, 1) * max(per_worker, 1))
