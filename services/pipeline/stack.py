"""Multi-frame stacks: merge a group of frames onto the shared reference, fuse the groups exactly, render.

A group's result is an int32 fixed-point accumulator (units of 2**-20, see :mod:`services.pipeline.ops.merge`):
- sub-pixel stacks: (9, H, W) = [weighted sums R, G, B of each render's base, weight, weighted sum of the warped
  Bayer mosaic, the detail band's sums R, G, B and their weight] (``RenderParams.detail_band``, the default;
  :func:`services.pipeline.ops.merge.split_detail`), or (5, H, W) without the detail band (the R, G, B sums of the
  whole renders);
- pixel-shift stacks: (6, H, W) = [weighted sums R, G, B, weights R, G, B];
- sub-pixel stacks with the raw-sample merge (``RenderParams.raw_merge``, off by default): (15 | 11, H, W) = the 9
  or 5 above, then the frames' raw samples kernel-regressed per colour onto the output grid (sums R, G, B, kernel
  weights R, G, B; :func:`services.pipeline.ops.merge.raw_kernel_sums`), blended in at render time where they
  agree (:data:`RAW_MERGE_SHARE`).
Every frame's contribution depends only on that frame, the reference (frame 0) and the shot's shared
parameters, and the reference is counted by the one group that holds frame 0, so sums from any partition of
the frames add up to the same integer totals: fusing 2 groups of 4 is bit-identical to 1 group of 8.

The merge works on normalised camera values before white balance: the gains only steer the demosaic, and every
group gets the same gains from the coordinator (``RenderParams``), so groups cannot disagree on colour. White
balance proper is applied once, after fusion, by the strip renderer (:func:`render_fused`, here: the
single-frame path is :mod:`services.pipeline.render`). Fusion happens in the strips themselves
(:func:`render_stack_strip` reads its rows of every group's accumulator): the fused stack (5|6|11, H, W) float32,
camera RGB, the merge weight(s) and (sub-pixel) the merged Bayer mosaic (and the raw merge), only exists strip
by strip on the GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import torch

from services.config import get_settings
from services.pipeline.models import load_enhancer
from services.pipeline.models.base import ENSEMBLE_ORDER
from services.pipeline.models.classical import DEMOSAIC_NOISE_FACTORS
from services.pipeline.models.registry import frames_package, package_manifest
from services.pipeline.ops import (
    cfa_masks,
    denoise_lee,
    sharpen,
    white_balance,
)
from services.pipeline.ops._checks import small
from services.pipeline.ops.align import shift_estimator
from services.pipeline.ops.cfa import orient, oriented_cfa, unorient
from services.pipeline.ops.filters import box_mean
from services.pipeline.ops.levels import normalize_levels
from services.pipeline.ops.merge import (
    DETAIL_CHANNELS,
    FIXED_POINT_BITS,
    MERGE_NOISE_CAP,
    MERGE_NOISE_FACTOR,
    RAW_MERGE_CHANNELS,
    MergeParams,
    accumulate_frames,
    frame_noise_share,
    merged_rgb,
    pixel_shift_accumulate,
    prepare_reference,
)
from services.pipeline.render import (
    SHARPEN_SIGMA,
    OnDevice,
    RenderParams,
    RowsOut,
    check_strip,
    encode_spaces,
    mosaic_tensor,
    noise_per_channel,
    rows_needed,
)
from services.pipeline.shot import shot_render_params
from services.pipeline.transfer import download, upload
from services.raw.meta import RawMeta

Frame = tuple[np.ndarray, RawMeta]
_PIXEL_SHIFT_TOLERANCE = 0.25  # px: how far measured shifts may be from whole pixels
SHIFT_WINDOW = 1024  # px: the central square the global shifts are measured on (a whole-pixel pattern test)


def _normalised(raw: np.ndarray, meta: RawMeta, device: torch.device, clip_black: bool = True) -> torch.Tensor:
    """Level-normalised mosaic, cropped to even H and W (align and merge work on whole 2x2 CFA cells);
    ``clip_black=False`` keeps values below black (the merge's Bayer sums, :func:`merge_group_tensor`)."""
    arr = np.asarray(raw)
    arr = arr[: arr.shape[0] // 2 * 2, : arr.shape[1] // 2 * 2]
    return normalize_levels(mosaic_tensor(arr, device), meta.black_levels, meta.white_level,  # uint16 on the bus
                            clip_black=clip_black)


def merge_params(params: RenderParams, device: str | torch.device | None = None, stack_size: int = 1) -> MergeParams:
    """The merge parameters implied by the shot's shared render parameters.

    With a ``device``, each frame is demosaiced and denoised by the shot's frames' package (``frames_model``, see
    :func:`stack_params`; else its model package), told
    :data:`MERGE_NOISE_FACTOR` times the noise the whole stack of ``stack_size`` frames will have (per-sample
    noise / ``stack_size``), at most :data:`MERGE_NOISE_CAP` of a frame's own: it removes about what averaging
    would leave and keeps the detail; averaging then takes the rest down, and a light filter after fusion
    (:func:`stack_noise_factors`) finishes. The package beat a pure demosaic and Malvar on the stack benchmark
    (docs/QUALITY.md).
    """
    if stack_size < 1:
        raise ValueError(f"stack_size must be >= 1, got {stack_size}")
    demosaic = None
    if device is not None:
        dev = torch.device(device)
        wanted = get_settings().merge_precision  # STRATA_MERGE_PRECISION, on GPUs; the CPU computes as the strips
        precision = wanted if dev.type == "cuda" else None
        enhancer = load_enhancer(params.camera, dev, package=params.frames_model or params.model, precision=precision)
        # 1: a frame at its own noise (pixel shift)
        told = frame_noise_share(stack_size)
        shot = tuple(g * params.noise_shot * told for g in params.gains)
        read = tuple(g * g * params.noise_read * told for g in params.gains)

        def demosaic(balanced: torch.Tensor, cfa: str) -> torch.Tensor:
            return enhancer.enhance(balanced, cfa, shot, read)

    return MergeParams(cfa=params.cfa, gains=params.gains, shot=params.noise_shot, read=params.noise_read,
                       demosaic=demosaic, rgb_warp=get_settings().stack_warp)


# The frames' companion package (models.registry.FRAMES_PACKAGES, strata_jdd_v2_frames 2.2.0) was trained on the
# average of a stack's renders at whole-pixel offsets, so nothing held its single renders' false colour on fine detail
# down: on a test chart one frame renders 23.1 dB through it against 27.6 through the shot's package (zone plate false
# colour 43 against 27). Averaging takes that out only where the frames sample the scene at different places: a
# tripod stack kept it all (8 frames, low noise: 24.04 dB against 28.37 for frame 0 alone, 29.01 through the shot's
# package), frames at whole-pixel offsets much of it (zone plate, siren, text 2-3.5 dB below the shot's package), while
# the companion's gain on smooth photographs (+0.05..+0.5 dB, whatever the shifts) is small. So a stack whose
# frames' sampling positions concentrate (:func:`sampling_concentration`) renders its frames through the shot's package
# (docs/QUALITY.md): where their CFA phases coincide (the largest mean phasor over the mosaic's periods above
# FRAMES_PACKAGE_MAX_CFA_CONCENTRATION: frames within about half a pixel of each other) or their sub-pixel positions do
# (over the pixel grid's periods above FRAMES_PACKAGE_MAX_GRID_CONCENTRATION: a tripod, whole-pixel offsets). The CFA
# threshold was 0.9 (one measure over all five periods) until session 45 found stacks shifted by up to 0.5 px losing
# up to 2.1 dB without noise and 0.9 dB at mid noise through the companion; over 278 synthetic stacks (5 photographs
# and dead leaves, 2-8 frames, shifts up to 0.25-2 px, no / mid / high noise) the loss against the better package
# each time fell from 51 dB in all to 7.5, the same for CFA thresholds of 0.6-0.7 (docs/QUALITY.md).
FRAMES_PACKAGE_MAX_CFA_CONCENTRATION = 0.65
FRAMES_PACKAGE_MAX_GRID_CONCENTRATION = 0.9
_CFA_PERIODS = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))  # (fy, fx) in cycles per 2 px: the mosaic's rows, columns, diagonal
_GRID_PERIODS = ((2.0, 0.0), (0.0, 2.0))  # the pixel grid's


def sampling_concentration(shifts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """How much the frames' sampling positions (their global shifts (dy, dx), px; frame 0 first) coincide, 0..1,
    as (CFA, grid): the largest magnitude of the frames' mean phasor ``exp(i pi (fy dy + fx dx))`` over the mosaic's
    periods (2 px along rows, columns and the diagonal) and over the pixel grid's (1 px along rows and columns).
    1: every frame samples the scene at the same places (no shift; whole-pixel offsets: the same grid, but CFA
    phases that may differ); near 0: the positions spread evenly."""
    if not shifts:
        raise ValueError("no shifts")
    ys = np.array([s[0] for s in shifts], dtype=np.float64)
    xs = np.array([s[1] for s in shifts], dtype=np.float64)

    def largest(periods: tuple[tuple[float, float], ...]) -> float:
        return float(max(abs(np.exp(1j * np.pi * (fy * ys + fx * xs)).mean()) for fy, fx in periods))

    return largest(_CFA_PERIODS), largest(_GRID_PERIODS)


def samples_in_one_place(shifts: Sequence[tuple[float, float]]) -> bool:
    """Whether the frames shifted by ``shifts`` sample the scene at one place for the companion package's purposes
    (their CFA phases or their sub-pixel positions concentrate): their frames then render through the shot's
    package."""
    cfa, grid = sampling_concentration(shifts)
    return cfa > FRAMES_PACKAGE_MAX_CFA_CONCENTRATION or grid > FRAMES_PACKAGE_MAX_GRID_CONCENTRATION


def stack_params(params: RenderParams, frames: int,
                 shifts: Sequence[tuple[float, float]] | None = None) -> RenderParams:
    """A shot's render parameters for a stack of ``frames``: its size, one orientation (the frames are averaged
    across orientations already, :mod:`services.pipeline.ops.merge`) and the package its frames' model pass uses
    (:func:`~services.pipeline.models.registry.frames_package`, decided here once for every group; a package that
    cannot be read fails here, at ingest, as the shot's own would: ``ModelPackageError``). ``shifts``: the frames'
    global shifts (:func:`frame_shifts`); where their sampling positions concentrate
    (:func:`samples_in_one_place`) the frames render through the shot's package, not the companion.
    None: not measured (the companion where the setting picks it). The shifts are kept (``RenderParams.shifts``, one
    per frame) as the priors of the frames' tile alignment (:func:`~services.pipeline.ops.align.align_frame`)."""
    if shifts is not None and len(shifts) != frames:
        raise ValueError(f"need one shift per frame, got {len(shifts)} for {frames} frames")
    static = shifts is not None and samples_in_one_place(shifts)
    chosen = frames_package(params.model, companion=not static)
    package_manifest(chosen)
    kept = () if shifts is None else tuple((float(dy), float(dx)) for dy, dx in shifts)
    return replace(params, frames=frames, orientations=1, frames_model=chosen, shifts=kept)


def _centre(raw: np.ndarray, size: int) -> np.ndarray:
    """The central window of at most ``size`` x ``size`` pixels, starting on even coordinates (CFA phase)."""
    h, w = raw.shape[:2]
    y0, x0 = max(0, (h - size) // 4 * 2), max(0, (w - size) // 4 * 2)
    return raw[y0 : y0 + size, x0 : x0 + size]


def frame_shifts(reference: Frame, frames: Sequence[Frame]) -> list[tuple[float, float]]:
    """Global shift (dy, dx) of each frame relative to the reference (phase correlation), full-res pixels.

    Measured on the central :data:`SHIFT_WINDOW` pixels square: a global shift needs no more, and on a whole
    50 MP frame the estimate is some 30 times slower, on the coordinator, for every stack. The reference itself
    (the same array) is (0, 0) without an estimate, which is what the estimate gives for identical frames; the
    others against the reference's spectrum taken once (:func:`~services.pipeline.ops.align.shift_estimator`,
    batched transforms), in :func:`shift_threads` groups at once.
    """
    cpu = torch.device("cpu")
    estimate = shift_estimator(_normalised(_centre(reference[0], SHIFT_WINDOW), reference[1], cpu), reference[1].cfa)
    others = [i for i, (raw, _) in enumerate(frames) if raw is not reference[0]]
    groups = [others[k :: shift_threads(len(others))] for k in range(shift_threads(len(others)))]

    def measure(group: list[int]) -> list[tuple[float, float]]:
        return estimate([_normalised(_centre(frames[i][0], SHIFT_WINDOW), frames[i][1], cpu) for i in group])

    shifts = [(0.0, 0.0)] * len(frames)
    with ThreadPoolExecutor(max(1, len(groups)), thread_name_prefix="shift") as pool:
        for group, found in zip(groups, pool.map(measure, groups), strict=True):
            for i, shift in zip(group, found, strict=True):
                shifts[i] = shift
    return shifts


def shift_threads(frames: int) -> int:
    """Threads measuring ``frames`` global shifts at once: the cores torch's own threads leave (a coordinator has
    one or two, STRATA_TORCH_THREADS: there one thread for all 7 other frames of a stack took 0.16-0.28 s of its
    ingest on an H100 host), at most one per frame; one where torch's threads take every core (no contention)."""
    return max(1, min(frames, (os.cpu_count() or 1) // max(1, torch.get_num_threads())))


def pixel_shift_offsets(shifts: Sequence[tuple[float, float]]) -> list[tuple[int, int]] | None:
    """Whole-pixel offsets if ``shifts`` (frame 0 first) are a 4-shot one-pixel pattern, else None.

    A pattern: 4 frames, every shift within 0.25 px of a whole offset in {-1, 0, 1}^2, frame 0 at (0, 0),
    and the four offsets on four different CFA phases (so R, G, G, B land on every site).
    """
    if len(shifts) != 4:
        return None
    offsets = [(round(dy), round(dx)) for dy, dx in shifts]
    near = all(abs(dy - oy) <= _PIXEL_SHIFT_TOLERANCE and abs(dx - ox) <= _PIXEL_SHIFT_TOLERANCE
               for (dy, dx), (oy, ox) in zip(shifts, offsets, strict=True))
    small = all(abs(oy) <= 1 and abs(ox) <= 1 for oy, ox in offsets)
    phases = {(oy % 2, ox % 2) for oy, ox in offsets}
    return offsets if near and small and offsets[0] == (0, 0) and len(phases) == 4 else None


def accumulator_channels(params: RenderParams, *, pixel_shift: bool) -> int:
    """Channels of a frame group's accumulator: 6 in pixel shift; else 5, plus 4 with the detail band, plus 6 with
    the raw-sample merge."""
    if pixel_shift:
        return 6
    return 5 + DETAIL_CHANNELS * params.detail_band + RAW_MERGE_CHANNELS * params.raw_merge


def merge_frame_group(
    reference: Frame,
    frames: Sequence[Frame],
    device: str | torch.device = "cpu",
    *,
    stack_size: int,
    positions: Sequence[int],
    params: RenderParams | None = None,
    pixel_shift: Sequence[tuple[int, int]] | None = None,
    out: np.ndarray | None = None,
    out_ready: Callable[[], object] | None = None,
    keep: Callable[[torch.Tensor], None] | None = None,
) -> np.ndarray:
    """Align ``frames`` to the shared reference and accumulate them: int32 (C, H, W), C from
    :func:`accumulator_channels` (9 by default: the detail band; 6 in pixel shift).

    ``stack_size`` is the number of frames in the whole stack (all groups): every group demosaics with the same
    noise level, so groups stay interchangeable (:func:`merge_params`). ``positions``: each frame's index in the
    whole stack (the planner's frame indices; 0 is the reference), which fixes how its demosaic is oriented
    (:func:`services.pipeline.ops.merge.accumulate_frames`).
    ``params`` are the shot's shared parameters (gains and noise; computed from the reference when None).
    ``pixel_shift`` gives each frame's whole-pixel offset (from :func:`pixel_shift_offsets` on the
    coordinator) and switches to the pixel-shift combine. A frame identical to the reference (frame 0 in
    group 0) counts as the reference. ``out``: where to put the result (C-contiguous int32 of the result's
    shape, e.g. a writable memory map from ``Storage.array_writer``); returned. ``out_ready``: called once the
    merge is computed, before anything is written into ``out`` (waits for :func:`~services.pipeline.transfer.prefault`).
    ``keep``: given the result on the device (int32), for frames of even size (``pipeline.resident``).
    """
    acc = merge_group_tensor(reference, frames, device, stack_size=stack_size, positions=positions, params=params,
                             pixel_shift=pixel_shift)
    h, w = np.asarray(reference[0]).shape
    if out_ready is not None:
        out_ready()
    if out is None:
        out = np.empty((acc.shape[0], h, w), dtype=np.int32)
    if out.shape != (acc.shape[0], h, w):
        raise ValueError(f"out must be {(acc.shape[0], h, w)}, got {out.shape}")
    h2, w2 = acc.shape[1:]
    if (h2, w2) == (h, w):
        if keep is not None:
            keep(acc)
        return download(acc, out)
    part = download(acc)  # odd frame: the last row/column repeats its neighbour's sums and weights
    out[:, :h2, :w2] = part
    out[:, h2:, :w2] = part[:, -1:]
    out[:, :, w2:] = out[:, :, w2 - 1 : w2]
    return out


def merge_group_tensor(
    reference: Frame,
    frames: Sequence[Frame],
    device: str | torch.device = "cpu",
    *,
    stack_size: int,
    positions: Sequence[int],
    params: RenderParams | None = None,
    pixel_shift: Sequence[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """:func:`merge_frame_group`'s result on ``device``, int32 (C, H', W'), left there: the frame's size, or one row
    and column less for a frame of odd size (which the host copy completes)."""
    if len(positions) != len(frames) or any(not 0 <= p < stack_size for p in positions):
        raise ValueError(f"need one stack position in 0..{stack_size - 1} per frame, got {list(positions)} "
                         f"for {len(frames)} frames")
    dev = torch.device(device)
    shared = params or shot_render_params(reference[1], reference[0])
    mp = merge_params(shared, dev, stack_size if pixel_shift is None else 1)
    with torch.inference_mode():
        # below black kept: the Bayer sums average the noise unclipped, the demosaics see it clipped
        # (accumulate_frames; clipped sums lifted and tinted the shadows of high-noise stacks)
        ref = prepare_reference(_normalised(*reference, dev, clip_black=False), mp)
        mosaics = [_normalised(raw, meta, dev, clip_black=False) for raw, meta in frames]
        if pixel_shift is None:
            priors = [shared.shifts[p] for p in positions] if len(shared.shifts) == stack_size else None
            acc = accumulate_frames(ref, mosaics, mp, positions, raw_merge=shared.raw_merge,
                                    shifts=priors, detail=shared.detail_band)  # (5|9|11|15, H, W)
        else:
            acc = pixel_shift_accumulate(ref, mosaics, list(pixel_shift), mp)  # (6, H, W)
        return acc.to(torch.int32)


# ---------------------------------------------------------------------------------------------------------
# Fusion and the fused stack's render


Accumulator = np.ndarray | torch.Tensor  # a stored group (array or memory map) or one kept on the device


def check_groups(groups: Sequence[Accumulator]) -> None:
    """Group accumulators must be int32 fixed point of one (5|6|9|11|15, H, W) shape."""
    if not groups:
        raise ValueError("no frame groups to fuse")
    shapes = {tuple(g.shape) for g in groups}
    if len(shapes) != 1 or groups[0].ndim != 3 or groups[0].shape[0] not in ACCUMULATOR_CHANNELS:
        raise ValueError(f"group accumulators must share one (5|6|9|11|15, H, W) shape, got {sorted(shapes)}")
    dtypes = {str(g.dtype).removeprefix("torch.") for g in groups}
    if dtypes != {"int32"}:
        raise ValueError(f"group accumulators must be int32 fixed point, got {sorted(dtypes)}")


def fuse_rows(groups: Sequence[Accumulator], top: int, bottom: int, device: str | torch.device = "cpu"
              ) -> torch.Tensor:
    """Fuse rows [top, bottom) of the group accumulators (arrays, memory maps or tensors kept on ``device``).

    Returns the fused stack (1, 5|6|11, rows, W) float32: camera RGB = sums / weights (with the detail band, plus
    the detail's sums / their weight: :func:`services.pipeline.ops.merge.merged_rgb`), then the total merge
    weight(s) in frames (1 channel, or R, G, B in pixel shift), which set the fused noise level, and (sub-pixel)
    the merged Bayer mosaic = its sum / the weight; with the raw-sample merge (11 channels) then the raw-merged
    camera RGB = its kernel sums / kernel weights and those weights R, G, B (in samples). The sums are
    added as integers and divided in float64 (IEEE-exact on every device), so any grouping, any device and any
    strip cut give the same bits.
    """
    check_groups(groups)
    dev = torch.device(device)
    total = torch.zeros((groups[0].shape[0], bottom - top, groups[0].shape[2]), dtype=torch.int64, device=dev)
    for g in groups:
        total += g[:, top:bottom].to(dev) if isinstance(g, torch.Tensor) else upload(g[:, top:bottom], dev)
    channels = total.shape[0]
    weights = total[3:6] if channels == 6 else total[3:4]  # (3|1, rows, W)
    divisor = weights.clamp(min=1).to(torch.float64)
    parts = [merged_rgb(total), weights.to(torch.float64) / 2.0**FIXED_POINT_BITS]
    if channels != 6:
        parts.append(total[4:5].to(torch.float64) / divisor)  # (1, rows, W) merged Bayer mosaic
    if channels in (11, 15):
        first = channels - RAW_MERGE_CHANNELS  # 5, or 9 after the detail band
        raw = total[first + 3 : first + 6]  # (3, rows, W) kernel weights
        parts += [total[first : first + 3].to(torch.float64) / raw.clamp(min=1).to(torch.float64),
                  raw.to(torch.float64) / 2.0**FIXED_POINT_BITS]
    return torch.cat(parts).to(torch.float32)[None]


def fuse_groups(groups: Sequence[np.ndarray]) -> np.ndarray:
    """The whole fused stack (5|6|11, H, W) float32 on the CPU (see :func:`fuse_rows`)."""
    check_groups(groups)
    return fuse_rows(groups, 0, groups[0].shape[1])[0].numpy()


RGB_DENOISE_RADIUS = 2
# Fused stack: camera RGB + 1 merge weight + the merged Bayer mosaic (sub-pixel) or + 3 weights (pixel shift);
# with the raw-sample merge (sub-pixel, RenderParams.raw_merge) + the raw-merged camera RGB + its 3 kernel weights.
FUSED_CHANNELS = (5, 6, 11)
# Group accumulators (int32 fixed point): those, or with the detail band 4 more channels after the Bayer sum (9, 15);
# an older layout (4 channels) is unknown.
ACCUMULATOR_CHANNELS = (5, 6, 9, 11, 15)
# Raw-sample merge (multi-frame demosaicking, RenderParams.raw_merge, off by default): the frames' raw samples are
# kernel-regressed per colour onto the output grid (ops.merge.raw_kernel_sums), so sub-pixel shifts sample every
# colour at more places than one mosaic. That image, D, is noisy (few samples per pixel), so it is rendered like a
# pixel-shift image (the package on its four re-mosaicked phases, told RAW_MERGE_NOISE_SHARE of the stack's noise)
# and blended into the A/B result where the two agree (the same rule as B, share up to RAW_MERGE_SHARE), where
# every colour has at least RAW_MERGE_MIN_WEIGHT of kernel weight (less: D's share falls to 0 in proportion) and
# only where the motion test kept every frame (merge weight above frames - 1: D is told the whole stack's noise, and
# where motion was rejected it cost up to 0.27 dB inside the moving object, docs/QUALITY.md).
RAW_MERGE_NOISE_SHARE = 0.5
RAW_MERGE_SHARE = 0.5
RAW_MERGE_MIN_WEIGHT = 1.0
# Sub-pixel stacks are rendered twice and blended (render_fused): A, the fused camera RGB (frames demosaiced one by
# one) through a light Lee filter; B, the fused Bayer mosaic (frames' CFA planes warped onto the reference, averaged)
# through the package at 1/frames of the noise. Their errors are partly independent, so where they agree their
# mean beats either; B's share falls from 1/2 where their local squared difference (window radius BLEND_RADIUS) is
# 0 to nothing at BLEND_TOLERANCE times the modelled noise variance of the average (B aliases on fine detail: half-
# resolution CFA planes cannot be resampled without it). The blend's gain and its tolerance sweep: docs/QUALITY.md.
BLEND_RADIUS = 2
BLEND_TOLERANCE = 3.0
# Where the motion test left the reference alone (an object that moves in every frame: its place in the reference is
# seen by no other frame), A is the reference's own pass, told the stack's share of its noise (the frames' average
# was to take out the rest), and B the package at 1/frames of the noise: that region rendered below the single
# frame on 8 of 10 held-out contents at mid noise, by up to 1.5 dB. Below ALONE_WEIGHT frames of merge weight
# the render moves towards the package's render of the fused Bayer mosaic (there the reference's samples) told one
# frame's noise, in ALONE_ORIENTATIONS orientations (the region then scored -0.8..+1.0 dB against the single frame,
# was -1.5..+0.9; a threshold of 2 and one orientation did less: docs/QUALITY.md, "An object that moves in every
# frame"). Static stacks with noise do not come near it (they render as before, with no extra pass); without noise,
# where every other frame is rejected at fine detail, it takes a few pixels (photos 035, 038, 039: +0.04..+0.08 dB).
ALONE_WEIGHT = 1.5
ALONE_ORIENTATIONS = 2
# Pixel shift: the fused image is re-mosaicked at the four CFA phases, each mosaic enhanced by the package and
# the four estimates averaged. Each holds a quarter of the samples and their errors partly cancel in the
# average, so each is told this share of the fused noise (0.5 beat 0.75 on each of 40 held-out stacks at three
# noise levels, two scales and two CFA phases by +0.02..+0.63 dB; 0.4 lost on one, 0.3 and 0.2 on smooth photographs
# at high noise: docs/QUALITY.md, scripts/experiments/pixel_shift_probe.py).
PIXEL_SHIFT_NOISE_SHARE = 0.5
# ...then the measured samples win back what that estimate smoothed away: a pixel-shift site holds a real sample of
# every colour, so where the estimate differs from the measured image by more than the samples' noise explains
# (the local mean square difference over a window of radius BLEND_RADIUS against this many times the noise
# variance of the measured value), the render moves towards the measurement by the Wiener share
# 1 - tolerance x noise / difference; without noise it is the measurement itself. With the phases told half the noise
# and turned (above), 2 beat 3 on 50 held-out stacks (three noise levels, two scales, two CFA phases) by -0.00..+0.97
# dB, most on fine detail; 1.5 and 1 gained more there but let noise back in on smooth content at high noise (-0.12
# and -2.9 at 2x scale; docs/QUALITY.md).
PIXEL_SHIFT_RESTORE_TOLERANCE = 2.0
_PHASES = ("RGGB", "GRBG", "GBRG", "BGGR")
# ...each phase in an orientation of its own (the self-ensemble's first four, models.base.ENSEMBLE_ORDER: identity,
# 90 degrees, 180, 270), so the errors of the phases that share their green samples differ: on ten held-out stacks
# +0.02..+0.21 dB at low noise, +0.02..+0.15 at mid, -0.01..+0.06 at high, at no cost (every phase in two
# orientations: +0.03..+0.28 at twice the cost; docs/QUALITY.md).
PHASE_TURNS = ENSEMBLE_ORDER[:4]


def _remosaic_enhance(x: torch.Tensor, params: RenderParams, shot: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """(1, 3, H, W) full-RGB white-balanced image -> the mean of the package's output on its four CFA-phase
    mosaics (each pixel keeps the channel the phase samples there), each seen in its own orientation
    (:data:`PHASE_TURNS`) and turned back."""
    enhancer = load_enhancer(params.camera, x.device, package=params.model)
    h, w = x.shape[-2:]
    out = torch.zeros_like(x)
    for cfa, k in zip(_PHASES, PHASE_TURNS, strict=True):
        mosaic = (x * cfa_masks(cfa, h, w, x.device)).sum(dim=1, keepdim=True)  # (1, 1, H, W)
        if k == 0:
            out += enhancer.enhance(mosaic, cfa, shot, read)
        else:  # the package's render is a function of the phase's CFA cells, so strips still stitch
            out += unorient(enhancer.enhance(orient(mosaic, k).contiguous(), oriented_cfa(cfa, k, h, w), shot, read), k)
    return out / len(_PHASES)


def _restore_measured(estimate: torch.Tensor, measured: torch.Tensor, weight: torch.Tensor,
                      params: RenderParams) -> torch.Tensor:
    """Pixel shift: move the denoised ``estimate`` (1, 3, H, W) towards the ``measured`` full-RGB image (both
    white-balanced) per channel by the Wiener share of their local difference that the measurement's noise does
    not explain (:data:`PIXEL_SHIFT_RESTORE_TOLERANCE`). ``weight`` (1, 3, H, W): samples per channel; a site
    with less than one (the reference's demosaiced fallback) keeps the estimate in proportion."""
    dev = estimate.device
    shot, read = (small(v, dev, torch.float32).view(1, 3, 1, 1) for v in noise_per_channel(params))
    variance = (shot * measured.clamp(min=0.0) + read) / weight.clamp(min=1e-3)
    diff = measured - estimate
    energy = box_mean(diff.square(), BLEND_RADIUS)
    unexplained = 1.0 - PIXEL_SHIFT_RESTORE_TOLERANCE * box_mean(variance, BLEND_RADIUS) / energy.clamp(min=1e-20)
    return estimate + unexplained.clamp(0.0, 1.0) * weight.clamp(0.0, 1.0) * diff


def _agreement_share(a: torch.Tensor, b: torch.Tensor, noise: torch.Tensor, top: float) -> torch.Tensor:
    """(1, 1, H, W) share of ``b`` in a blend with ``a``: ``top`` where they agree, falling to 0 as their local
    squared difference (window radius BLEND_RADIUS) reaches BLEND_TOLERANCE x ``noise`` (a variance)."""
    spread = box_mean((b - a).square().sum(dim=1, keepdim=True), BLEND_RADIUS)  # (1, 1, H, W)
    return top * (1.0 - spread / (BLEND_TOLERANCE * noise).clamp(min=1e-12)).clamp(0.0, 1.0)


def _blend_raw(x: torch.Tensor, raw: torch.Tensor, raw_weight: torch.Tensor, weight: torch.Tensor,
               params: RenderParams) -> torch.Tensor:
    """Blend the rendered stack ``x`` (1, 3, H, W, white-balanced) with the raw-sample merge ``raw`` (1, 3, H, W,
    camera RGB) rendered through the package (:data:`RAW_MERGE_NOISE_SHARE`) where they agree, where every
    colour has enough kernel weight ``raw_weight`` (1, 3, H, W) (:data:`RAW_MERGE_MIN_WEIGHT`) and where the merge
    weight ``weight`` (1, 1, H, W, frames) says no frame moved."""
    dev = x.device
    shot, read = (small(v, dev, torch.float32) / params.frames for v in noise_per_channel(params))
    gains = small(params.gains, dev, torch.float32).view(1, 3, 1, 1)
    d = _remosaic_enhance(raw.clamp(min=0.0) * gains, params,  # clipped at black as a frame is (see _blend_bayer)
                          shot * RAW_MERGE_NOISE_SHARE, read * RAW_MERGE_NOISE_SHARE)
    d = sharpen(d, params.sharpen_amount, SHARPEN_SIGMA)
    noise = (shot.view(1, 3, 1, 1) * x.clamp(min=0.0) + read.view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
    confidence = (raw_weight.amin(dim=1, keepdim=True) / RAW_MERGE_MIN_WEIGHT).clamp(0.0, 1.0)  # (1, 1, H, W)
    confidence = confidence * (weight - (params.frames - 1)).clamp(0.0, 1.0)
    return x + confidence * _agreement_share(x, d, noise, RAW_MERGE_SHARE) * (d - x)


def _alone_as_single(x: torch.Tensor, bayer: torch.Tensor, weight: torch.Tensor, params: RenderParams) -> torch.Tensor:
    """Where the merge ``weight`` (1, 1, H, W, in frames) falls below :data:`ALONE_WEIGHT`, move the rendered stack
    ``x`` (1, 3, H, W, white-balanced) towards the package's render of the fused Bayer mosaic (there the reference's
    own samples) told one frame's noise, in :data:`ALONE_ORIENTATIONS` orientations: all the way at weight 1, not
    at all from :data:`ALONE_WEIGHT` up. A strip with no such pixel is returned as it is (no model pass), and a
    pixel's share is its own weight's, so strips still stitch."""
    share = ((ALONE_WEIGHT - weight) / (ALONE_WEIGHT - 1.0)).clamp(0.0, 1.0)  # (1, 1, H, W)
    if not bool((share > 0).any()):
        return x
    dev = x.device
    shot, read = (small(v, dev, torch.float32) for v in noise_per_channel(params))
    enhancer = load_enhancer(params.camera, dev, package=params.model)
    single = enhancer.enhance(white_balance(bayer.clamp(min=0.0), params.gains, params.cfa), params.cfa, shot, read,
                              ALONE_ORIENTATIONS)
    return x + share * (sharpen(single, params.sharpen_amount, SHARPEN_SIGMA) - x)


def _blend_bayer(a: torch.Tensor, bayer: torch.Tensor, params: RenderParams) -> torch.Tensor:
    """Blend the sharpened RGB path ``a`` (1, 3, H, W) with the package's render of the fused Bayer mosaic
    (1, 1, H, W, normalised camera values) where the two agree (see :data:`BLEND_TOLERANCE`).

    The mosaic is the mean of unclipped samples (values below black kept, :func:`merge_group_tensor`): clipped
    at black here, it is what the package was trained on, a mosaic clipped at the noise it is told (1/frames),
    so the package takes the clip's lift in the shadows back out. (The mean of clipped frames kept each frame's
    lift, about the full per-frame noise's, which the package told 1/frames of it read as signal.)"""
    dev = a.device
    shot, read = (small(v, dev, torch.float32) / params.frames for v in noise_per_channel(params))
    enhancer = load_enhancer(params.camera, dev, package=params.model)
    b = enhancer.enhance(white_balance(bayer.clamp(min=0.0), params.gains, params.cfa), params.cfa, shot, read)
    b = sharpen(b, params.sharpen_amount, SHARPEN_SIGMA)  # (1, 3, H, W)
    noise = (shot.view(1, 3, 1, 1) * a.clamp(min=0.0) + read.view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
    return a + _agreement_share(a, b, noise, 0.5) * (b - a)


def render_fused(fused: torch.Tensor, params: RenderParams,
                 noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """The fused stack rendered in the primary output space (:func:`render_fused_spaces`)."""
    return render_fused_spaces(fused, replace(params, extra_spaces=()), noise_factors)[0]


@torch.inference_mode()
def render_fused_spaces(fused: torch.Tensor, params: RenderParams,
                        noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0), rows: RowsOut | None = None
                        ) -> list[np.ndarray]:
    """Render a fused stack (1, 5|6|11, H, W) float32 on its device to one (H, W, 3) uint16 image per output space
    (primary first, :func:`~services.pipeline.render.encode_spaces`): camera RGB in [0, 1], the
    merge weight of each pixel in frames and the merged Bayer mosaic (sub-pixel stacks), or R, G, B weights
    (pixel shift). :func:`render_fused_linear`, then colour and the output transfer."""
    x = render_fused_linear(fused, params, noise_factors)
    return encode_spaces(x, params, rows)  # matrix, transfer and codes per output space


def render_fused_linear(fused: torch.Tensor, params: RenderParams,
                        noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> torch.Tensor:
    """A fused stack (1, 5|6|11, H, W) rendered to white-balanced camera RGB (1, 3, H, W), before colour: white
    balance -> denoise -> sharpen (:func:`render_fused_spaces`). ``noise_factors`` scale the shot's
    per-sample noise model per channel (see :func:`stack_noise_factors`). Sub-pixel stacks
    (5 channels): the Lee filter at that noise over each pixel's merge weight (fewer frames where motion was
    rejected, so more smoothing there), blended with the package's render of the merged Bayer mosaic where the
    two agree (:data:`BLEND_TOLERANCE`); with the raw-sample merge (11 channels) that result is blended with the
    package's render of the raw-merged image where they agree (:func:`_blend_raw`); where the motion test left the
    reference alone, towards a single frame's render (:func:`_alone_as_single`). Pixel shift (6 channels): the
    package on the four re-mosaicked phases (:data:`PIXEL_SHIFT_NOISE_SHARE`), then moved towards the measured
    samples where they differ by more than their noise (:func:`_restore_measured`).
    """
    if fused.ndim != 4 or fused.shape[0] != 1 or fused.shape[1] not in FUSED_CHANNELS:
        raise ValueError(f"fused stack must be (1, 5|6|11, H, W): RGB + merge weights (+ Bayer (+ raw merge)), "
                         f"got {tuple(fused.shape)}")
    dev = fused.device
    gains = small(params.gains, dev, torch.float32).view(1, 3, 1, 1)
    pixel_shift = fused.shape[1] == 6
    x, weight = fused[:, :3].float() * gains, fused[:, 3:6 if pixel_shift else 4].float()
    factors = small(noise_factors, dev, torch.float32)  # (3,)
    shot, read = (small(v, dev, torch.float32) * factors for v in noise_per_channel(params))
    if pixel_shift:
        estimate = _remosaic_enhance(x, params, shot * PIXEL_SHIFT_NOISE_SHARE, read * PIXEL_SHIFT_NOISE_SHARE)
        x = _restore_measured(sharpen(estimate, params.sharpen_amount, SHARPEN_SIGMA), x, weight, params)
    else:
        x = denoise_lee(x, shot, read, radius=RGB_DENOISE_RADIUS, noise_scale=1.0 / weight.clamp(min=1.0))
        x = _blend_bayer(sharpen(x, params.sharpen_amount, SHARPEN_SIGMA), fused[:, 4:5].float(), params)
        if fused.shape[1] == 11:
            x = _blend_raw(x, fused[:, 5:8].float(), fused[:, 8:11].float(), weight, params)
        x = _alone_as_single(x, fused[:, 4:5].float(), weight, params)
    return x


def render_rgb(fused: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
               noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Render a whole fused stack (5|6|11, H, W) float32 (:func:`fuse_groups`) to (H, W, 3)
    uint16; see :func:`render_fused`."""
    if fused.ndim != 3 or fused.shape[0] not in FUSED_CHANNELS:
        raise ValueError(f"fused stack must be (5|6|11, H, W): RGB + merge weights (+ Bayer (+ raw merge)), got "
                         f"{fused.shape}")
    x = torch.from_numpy(np.ascontiguousarray(fused, dtype=np.float32)).to(torch.device(device))[None]
    return render_fused(x, params, noise_factors)


def render_stack_strip(groups: Sequence[np.ndarray], y0: int, y1: int, params: RenderParams,
                       device: str | torch.device = "cpu", *, pixel_shift: bool) -> np.ndarray:
    """Rows [y0, y1) of the stack in the primary output space (:func:`render_stack_strip_spaces`)."""
    return render_stack_strip_spaces(groups, y0, y1, replace(params, extra_spaces=()), device,
                                     pixel_shift=pixel_shift)[0]


def render_stack_strip_spaces(groups: Sequence[Accumulator], y0: int, y1: int, params: RenderParams,
                              device: str | torch.device = "cpu", *, pixel_shift: bool,
                              into: Sequence[np.ndarray] | None = None, ready: Callable[[], object] | None = None,
                              on_device: OnDevice | None = None) -> list[np.ndarray]:
    """Rows [y0, y1) of the stack's final image, one (y1 - y0, W, 3) uint16 array per output space (primary
    first), straight from the group accumulators.

    Fuses only the rows the strip needs (its halo included) on ``device``, so no whole fused image is ever
    built on the coordinator; stitched strips equal :func:`render_rgb` of :func:`fuse_groups`. ``into``,
    ``ready`` and ``on_device``: as for :func:`~services.pipeline.render.render_strip_spaces`.
    """
    check_groups(groups)
    h = groups[0].shape[1]
    check_strip(y0, y1, h)
    # the blend windows: B's, and the raw merge's on top of it (its difference to the A/B result)
    blends = 1 if pixel_shift else 2 if groups[0].shape[0] == 11 else 1  # pixel shift: the restore's window
    top, bottom = rows_needed(y0, y1, h, params, blends * BLEND_RADIUS)
    fused = fuse_rows(groups, top, bottom, device)
    return render_fused_spaces(fused, params, stack_noise_factors(pixel_shift),
                               RowsOut(y0 - top, y1 - top, into, ready, on_device))


# The frames were already denoised (at MERGE_NOISE_FACTOR x the stack's noise), so the filter after fusion takes out
# only this share of the (interpolated) noise left over the merge weight (stack benchmark: 0.3 beat 0.5 and 0.7 with
# the factor at 2, and 0.5 beat 0 and 1 with it at 1; with the frames' package trained on stacks, 2.2.0, 0.15 beat
# 0.3 by +0.00..+0.10 dB at low, mid and high noise, no case lost; 0 and 0.6 did worse: docs/QUALITY.md).
STACK_RESIDUAL_NOISE = 0.15


def stack_noise_factors(pixel_shift: bool) -> tuple[float, float, float]:
    """Per-channel factors on the shot's per-sample noise model for rendering the fused stack.

    Sub-pixel stacks: :data:`STACK_RESIDUAL_NOISE` times the interpolation's variance factors (the renderer
    divides by each pixel's merge weight). Pixel shift: one measured sample of R and B per site, two of G.
    """
    if pixel_shift:
        return (1.0, 0.5, 1.0)
    return tuple(STACK_RESIDUAL_NOISE * f for f in DEMOSAIC_NOISE_FACTORS)  # type: ignore[return-value]


__all__ = [
    "ALONE_ORIENTATIONS",
    "ALONE_WEIGHT",
    "Accumulator",
    "BLEND_RADIUS",
    "BLEND_TOLERANCE",
    "FRAMES_PACKAGE_MAX_CFA_CONCENTRATION",
    "FRAMES_PACKAGE_MAX_GRID_CONCENTRATION",
    "FUSED_CHANNELS",
    "MERGE_NOISE_CAP",
    "MERGE_NOISE_FACTOR",
    "PHASE_TURNS",
    "PIXEL_SHIFT_NOISE_SHARE",
    "RAW_MERGE_MIN_WEIGHT",
    "RAW_MERGE_NOISE_SHARE",
    "RAW_MERGE_SHARE",
    "RGB_DENOISE_RADIUS",
    "STACK_RESIDUAL_NOISE",
    "accumulator_channels",
    "check_groups",
    "fuse_groups",
    "fuse_rows",
    "frame_shifts",
    "merge_frame_group",
    "merge_group_tensor",
    "merge_params",
    "pixel_shift_offsets",
    "render_fused",
    "render_fused_linear",
    "render_fused_spaces",
    "render_rgb",
    "render_stack_strip",
    "samples_in_one_place",
    "sampling_concentration",
    "stack_params",
    "render_stack_strip_spaces",
    "stack_noise_factors",
]
