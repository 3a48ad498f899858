"""Planning: cut a frame into row strips, or a stack into frame groups, optionally by unequal GPU shares."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from services.config import Settings
from services.errors import BadInput
from services.export.recipes import Recipe
from services.jobs.plan import (
    JobPlan,
    ShardKind,
    ShardPayload,
    bin_plan,
    file_plan,
    lean_plan,
    proof_plan,
    single_frame_phases,
    stack_phases,
    tile_plan,
    with_decoded_source,
)
from services.pipeline.prepare import PreparedShot


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


# Without a memory figure (CPU workers, older GPU workers): the seed's strip height.
DEFAULT_STRIP_ROWS = 1288
# Peak device bytes per output pixel while a strip renders (a single frame's strip; a stack strip fuses 5-channel
# accumulators and runs the package twice); measured on an H200, docs/PERFORMANCE.md ("Strips sized from memory").
# Stacks: measured 292-313 with 5-channel accumulators; the detail band's 4 more channels add 32 bytes of int64 sums.
STRIP_BYTES_PER_PIXEL = {"frame": 300, "stack": 380}  # measured 259-278 and 292-313 (h200-strip-memory.json)
# At most this many pixels in a strip, whatever the memory: the model's activations (64 channels at half
# resolution, 16 values a pixel) stay under 2**31 elements, the 32-bit index limit of some cuDNN kernels. An 80 MP
# frame is one strip; a 150 MP one two. A guard: frames past it were not run on a GPU here.
MAX_STRIP_PIXELS = 120_000_000


def strip_rows_for(width: int, memory_mb: int, configured: int, *, stack: bool) -> int:
    """Rows per strip: ``configured`` (STRATA_STRIP_ROWS) when set, else as many as fit in ``memory_mb`` of the
    smallest live GPU worker's budget (one strip per GPU for a whole frame when it fits) and in
    :data:`MAX_STRIP_PIXELS`, else :data:`DEFAULT_STRIP_ROWS`. Even (keeps the CFA phase)."""
    if configured > 0:
        return max(2, configured // 2 * 2)
    if memory_mb <= 0:
        return DEFAULT_STRIP_ROWS
    per_row = max(width, 1) * STRIP_BYTES_PER_PIXEL["stack" if stack else "frame"]
    rows = min(int(memory_mb * 2**20 // per_row), MAX_STRIP_PIXELS // max(width, 1))
    return max(2, rows // 2 * 2)


def strip_count(height: int, target_rows: int, n_workers: int, per_worker: int) -> int:
    """Enough strips to keep every worker busy, and none much taller than ``target_rows``."""
    return max(math.ceil(height / max(target_rows, 2)), max(n_workers, 1) * max(per_worker, 1))


def plan_phase_shards(plan: JobPlan, phase: int, *, groups_done: int, strip_rows: int, strips_per_worker: int
                      ) -> list[tuple[ShardKind, ShardPayload]]:
    """The shards of ``phase``: frame groups (one per live GPU worker) or strips (enough to keep every worker
    busy; a stack's strips fuse ``groups_done`` group accumulators). With a split ratio of one share per worker,
    shard i is pinned to the i-th worker (``gpu_slot``) and sized by its share."""
    spec = plan.phases[phase]
    n_workers = plan.n_workers
    use_ratio = list(plan.ratios) if plan.ratios and len(plan.ratios) == n_workers else None
    if spec.kind == ShardKind.FRAME_GROUP:
        groups = plan_frame_groups(len(plan.frames), n_workers, use_ratio)
        return [(ShardKind.FRAME_GROUP, ShardPayload(gpu_slot=i if use_ratio else None, frames=tuple(g)))
                for i, g in enumerate(groups)]
    rows = strip_rows_for(plan.size[1], plan.gpu_memory_mb, strip_rows, stack=spec.groups_phase is not None)
    n = len(use_ratio) if use_ratio else strip_count(plan.height, rows, n_workers, strips_per_worker)
    groups_count = groups_done if spec.groups_phase is not None else None
    return [(ShardKind.STRIP, ShardPayload(gpu_slot=i if use_ratio else None, y0=y0, y1=y1, groups=groups_count))
            for i, (y0, y1) in enumerate(plan_strips(plan.height, n, use_ratio))]


def plan_shot(job_id: str, shot: PreparedShot, recipes: Sequence[Recipe], params: dict[str, Any], settings: Settings,
              *, stack: bool, n_workers: int, gpu_memory_mb: int, batch_lane: bool = False,
              original: str = "", worker_files: bool = False) -> JobPlan:
    """The job's plan once its frames are decoded: phases, the render (with the stack's detail band and the
    raw-sample merge where the settings ask for them), the GPU output work (tiles for the lanes
    ``STRATA_GPU_DEFLATE`` names, proof bins) its recipes need, and the split ratios. ``worker_files``: the GPU
    worker of a strip holding the whole image may write the full-size TIFF itself (``original``: the shot's file
    name it records)."""
    ratios = parse_split_ratio(settings.split_ratio)
    sub_pixel = stack and not shot.pixel_shift
    render = replace(shot.render, raw_merge=sub_pixel and settings.stack_raw_merge,
                     detail_band=sub_pixel and settings.stack_detail_band)
    height, width = shot.frames[0].height, shot.frames[0].width
    tiles = tile_plan(recipes, settings.gpu_deflate == "on" or (settings.gpu_deflate == "batch" and batch_lane))
    bins = bin_plan(recipes, height, width, settings.gpu_encode)
    return JobPlan(frames=shot.frames, render=render, n_workers=n_workers,
                   phases=stack_phases(shot.pixel_shift) if stack else single_frame_phases(job_id),
                   ratios=None if ratios is None else tuple(ratios), size=(height, width), gpu_memory_mb=gpu_memory_mb,
                   tile_spaces=tiles, tile_level=settings.gpu_deflate_level, bin_specs=bins,
                   proof_specs=proof_plan(recipes, bins, height, width, settings.worker_proofs),
                   lean_spaces=lean_plan(recipes, tiles, bins, height, width) if settings.lean_strips else (),
                   file_specs=file_plan(recipes, tiles, original, worker_files and settings.worker_tiffs
                                        and not batch_lane),
                   extra=with_decoded_source(params, shot.frames[0]))
