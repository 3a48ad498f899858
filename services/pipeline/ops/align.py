"""Tile-based coarse-to-fine alignment of Bayer frames (HDR+, Hasinoff et al. 2016), pure torch.

Alignment runs on full-resolution grey images (H, W): :func:`mosaic_grey` makes one from a Bayer mosaic by
Malvar demosaicing, which keeps the image free of the CFA aliasing that biases sub-pixel estimates on the
2x2-binned luma. A Gaussian pyramid (level 1 is the half-res luma) is searched from
the coarsest level down: each tile tests integer displacements within ``search_radius`` of the displacement
handed down from the level above (L2 cost, a 3x3 median over tiles removes isolated wrong vectors); the
finest level is searched +-1 px and refined to sub-pixel precision with damped, symmetric-gradient
Lucas-Kanade iterations whose normal equations are pooled over each tile's 3x3 tile neighbourhood (robust to
noise, still local). Given the frame's global shift (a prior), the search starts from it and a tile keeps
another displacement only where that matches clearly better. Memory: a few full-size float32 planes plus
(T+2r)^2/T^2 of one per search level.

:func:`estimate_shift` measures one global translation by phase correlation of the 2x2-binned luma (stacks
use it to recognise pixel-shift patterns and as a first look at the shifts).

Flow convention, as in :mod:`services.pipeline.ops.merge`: flow ``(dy, dx)`` at a pixel means
``frame(y + dy, x + dx) ~ reference(y, x)``; it is returned in full-resolution pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from services.pipeline.ops import lanczos_gpu
from services.pipeline.ops._checks import check_mosaic, small
from services.pipeline.ops.cfa import cfa_channels, split_sites
from services.pipeline.ops.demosaic import demosaic_malvar

_PYRAMID_TAPS = (1.0 / 16, 4.0 / 16, 6.0 / 16, 4.0 / 16, 1.0 / 16)  # binomial ~ Gaussian sigma 1
_MIN_LEVEL_SIZE = 32  # stop the pyramid when a level gets this small (pixels)
_DAMPING = 0.05  # LK damping, fraction of the median tile texture
_ZERO_BIAS = 1e-4  # relative cost penalty per squared pixel of displacement: ties resolve to no motion
# With a global shift (align_frame's prior), a tile's own best displacement must cost less than this share of the
# global one's: a repeat of a periodic texture matches about as well as the right place (the chart's red weave at
# whole-pixel offsets locked onto another repeat, docs/QUALITY.md); a moving object's tiles are far below it.
_PRIOR_MARGIN = 0.75

# warp(mode=...)'s Lanczos kernels and their lobes a (taps per axis and pass: 2a)
LANCZOS_MODES = {"lanczos3": 3, "lanczos4": 4, "lanczos5": 5}
_WARP_ROWS = 512  # output rows per pass of the Lanczos warp

_SLOPE_BAND = 0.35  # cycles per binned pixel used by the phase-slope fit (above it CFA aliasing grows)
_SLOPE_ITERATIONS = 3
# Bins within this radius of DC are left out of the phase-slope fit: the Hann window stays put while the content
# moves, so the lowest frequencies carry the window's (zero) shift; on smooth content they dominated the fit and
# pulled a 1 px shift to 0.4 px (an upsampled photograph), which hid pixel-shift patterns.
_SLOPE_MIN_BINS = 3
# The phase-slope fit's normal matrix is inverted as a pseudo-inverse: a window without texture (a backdrop clipped
# flat) made it singular and failed the stack's ingest; directions it cannot see get no step (relative cut-off).
_SLOPE_RTOL = 1e-9
_SHIFT_DECIMALS = 4  # estimates are rounded: identical frames give exactly (0, 0)
# The estimate is then refined at full resolution with the frame's window moved by the estimate, this many times
# (:func:`_follow_window`): with the window fixed, content that moves under it still pulled shifts towards 0 (a
# one-pixel pixel-shift pattern measured at 0.63-0.84 px on a photograph, undetected; random shifts up to 0.36 px
# off, session 49), and the 2x2-binned luminance changes with the CFA phase at colour edges.
_WINDOW_ITERATIONS = 3
# ...with a Tukey window, cosine tapers over this share of it (half at each end): a Hann window (1.0) leaves the
# window's edges out, and a scene whose one direction is told only there (towers against a sky, a horizon at the
# bottom) measured 0.4-0.6 px off at mid noise. Its phase-slope fit weighs each bin by the cross-power's magnitude,
# not its square (which let a few strong low-frequency bins decide: a smooth photograph 0.25-0.30 px off at high
# noise). Together every test scene stayed within 0.035 px at mid noise, 0.11 at high (session 49).
_WINDOW_TAPER = 0.25
_FULL_SLOPE_BAND = _SLOPE_BAND / 2  # the same band in full-resolution cycles per pixel


@dataclass(frozen=True)
class AlignParams:
    """Tile size (pixels of each level), integer search radius per level, pyramid depth, LK iterations."""

    tile_size: int = 32
    search_radius: int = 4
    levels: int | None = None  # None: as many as keep the coarsest level >= 32 pixels, at most 5
    lk_iterations: int = 3

    def __post_init__(self) -> None:
        if self.tile_size < 4 or self.search_radius < 1 or self.lk_iterations < 0:
            raise ValueError(f"bad alignment parameters {self}")



def mosaic_grey(mosaic: Tensor, cfa: str) -> Tensor:
    """(H, W) normalised mosaic -> (H, W) float32 grey: the mean of its Malvar-demosaiced R, G, B."""
    check_mosaic(mosaic, "mosaic", min_size=16)
    rgb = demosaic_malvar(mosaic.to(torch.float32)[None, None], cfa)  # (1, 3, H, W)
    return rgb[0].mean(dim=0)  # (H, W)


def _blur(image: Tensor) -> Tensor:
    """Separable binomial blur of (h, w), replicate borders."""
    k = small(_PYRAMID_TAPS, image.device, image.dtype)
    x = F.pad(image[None, None], (2, 2, 2, 2), mode="replicate")  # (1, 1, h+4, w+4)
    x = F.conv2d(x, k.view(1, 1, 5, 1))  # (1, 1, h, w+4)
    return F.conv2d(x, k.view(1, 1, 1, 5))[0, 0]  # (h, w)


def grey_pyramid(grey: Tensor, levels: int | None = None) -> list[Tensor]:
    """Gaussian pyramid of a (H, W) grey image: [level 0 (H, W), level 1 (H/2, W/2) 2x2 means, ...]."""
    check_mosaic(grey, "grey", min_size=16)
    h, w = grey.shape
    pyramid = [grey.to(torch.float32)]
    pyramid.append(pyramid[0].reshape(h // 2, 2, w // 2, 2).mean(dim=(1, 3)))  # (H/2, W/2)
    max_levels = 5 if levels is None else max(levels, 2)
    while len(pyramid) < max_levels and min(pyramid[-1].shape) >= 2 * _MIN_LEVEL_SIZE:
        pyramid.append(_blur(pyramid[-1])[::2, ::2].contiguous())
    return pyramid


def _tile_grid(shape: tuple[int, ...] | torch.Size, tile: int) -> tuple[int, int]:
    return math.ceil(shape[0] / tile), math.ceil(shape[1] / tile)


def _pad_to_tiles(image: Tensor, tile: int) -> Tensor:
    ny, nx = _tile_grid((image.shape[0], image.shape[1]), tile)
    pad = (0, nx * tile - image.shape[1], 0, ny * tile - image.shape[0])
    return F.pad(image[None, None], pad, mode="replicate")[0, 0]  # (ny*T, nx*T)


def _tile_costs(reference: Tensor, frame: Tensor, init: Tensor, tile: int, radius: int) -> Tensor:
    """L2 cost (ny, nx, (2r+1)^2) of every integer displacement within ``radius`` of ``init`` (ny, nx, 2) long,
    row-major from (-r, -r), for each tile of ``reference``."""
    ref = _pad_to_tiles(reference, tile)
    ny, nx = ref.shape[0] // tile, ref.shape[1] // tile
    ref_tiles = ref.reshape(ny, tile, nx, tile).permute(0, 2, 1, 3)  # [ny, nx, T, T]
    h, w = frame.shape
    span = torch.arange(-radius, tile + radius, device=frame.device)  # (T+2r,)
    origin_y = torch.arange(ny, device=frame.device)[:, None] * tile + init[..., 0]  # (ny, nx)
    origin_x = torch.arange(nx, device=frame.device)[None, :] * tile + init[..., 1]  # (ny, nx)
    rows = (origin_y[..., None] + span).clamp(0, h - 1)  # [ny, nx, T+2r]
    cols = (origin_x[..., None] + span).clamp(0, w - 1)  # [ny, nx, T+2r]
    windows = frame[rows[..., :, None], cols[..., None, :]]  # [ny, nx, T+2r, T+2r]
    side = 2 * radius + 1
    costs = torch.empty(ny, nx, side, side, dtype=reference.dtype, device=reference.device)
    for i in range(side):  # one row of candidates at a time: side kernels, not side^2 (coarse levels are tiny)
        candidates = windows[:, :, i : i + tile, :].unfold(-1, tile, 1)  # [ny, nx, T, side, T] (a view)
        costs[:, :, i] = (candidates - ref_tiles[:, :, :, None, :]).square().sum(dim=(2, 4))  # [ny, nx, side]
    return costs.view(ny, nx, side * side)


def _search(reference: Tensor, frame: Tensor, init: Tensor, tile: int, radius: int,
            prior: Tensor | None = None) -> Tensor:
    """Best integer displacement per tile within ``radius`` of ``init`` (ny, nx, 2) long; returns (ny, nx, 2).

    ``prior`` (2,) long: the frame's global displacement at this level. A tile keeps its best displacement only
    where that costs less than :data:`_PRIOR_MARGIN` times the prior's; elsewhere it takes the prior (a periodic
    texture matches another repeat of itself about as well as the right one, see :func:`align_frame`)."""
    costs = _tile_costs(reference, frame, init, tile, radius)  # (ny, nx, side^2)
    side = 2 * radius + 1
    offsets = torch.arange(-radius, radius + 1, device=frame.device)
    oy, ox = torch.meshgrid(offsets, offsets, indexing="ij")  # (side, side)
    penalty = (oy.square() + ox.square()).flatten().to(costs.dtype) * _ZERO_BIAS  # (side^2,)
    costs = costs * (1.0 + penalty)
    best = costs.argmin(dim=-1)  # (ny, nx)
    found = init + torch.stack([best // side - radius, best % side - radius], dim=-1)  # (ny, nx, 2)
    if prior is None:
        return found
    at_prior = prior.view(1, 1, 2).expand_as(init)  # (ny, nx, 2)
    prior_cost = _tile_costs(reference, frame, at_prior, tile, 0)[..., 0]  # (ny, nx)
    best_cost = costs.gather(-1, best[..., None])[..., 0]  # (ny, nx)
    keep = best_cost < _PRIOR_MARGIN * prior_cost  # (ny, nx): clearly better than the global displacement
    return torch.where(keep[..., None], found, at_prior)


def _upsample_tiles(flow: Tensor, fine_grid: tuple[int, int]) -> Tensor:
    """Coarse-level tile flow (ny, nx, 2) -> the next finer level's tile grid, values doubled, rounded."""
    ny, nx = fine_grid
    cy, cx = flow.shape[0], flow.shape[1]
    # Fine tile i has its centre at coarse tile coordinate (i + 0.5) / 2 - 0.5 (same tile size in pixels).
    gy = ((torch.arange(ny, device=flow.device, dtype=torch.float32) + 0.5) / 2) / cy * 2 - 1  # (ny,)
    gx = ((torch.arange(nx, device=flow.device, dtype=torch.float32) + 0.5) / 2) / cx * 2 - 1  # (nx,)
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], dim=-1)[None]  # (1, ny, nx, 2) as (x, y)
    src = flow.permute(2, 0, 1)[None].to(torch.float32)  # (1, 2, cy, cx)
    up = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)[0]  # (2, ny, nx)
    return torch.round(2.0 * up).permute(1, 2, 0).long()  # (ny, nx, 2)


def tiles_to_pixels(flow: Tensor, tile: int, shape: tuple[int, int]) -> Tensor:
    """Per-tile flow (ny, nx, 2) -> per-pixel (2, h, w), bilinear between tile centres (smooth, no seams)."""
    ny, nx = flow.shape[0], flow.shape[1]
    src = flow.permute(2, 0, 1)[None].to(torch.float32)  # (1, 2, ny, nx)
    up = F.interpolate(src, size=(ny * tile, nx * tile), mode="bilinear", align_corners=False)  # (1, 2, ..)
    return up[0, :, : shape[0], : shape[1]]  # (2, h, w)


def warp(image: Tensor, flow: Tensor, mode: str = "bilinear") -> tuple[Tensor, Tensor]:
    """Sample (C, h, w) ``image`` at ``(y + flow_y, x + flow_x)``; ``flow`` (2, h, w) in its pixels.

    ``mode``: ``grid_sample``'s ("bilinear", "bicubic", "nearest") or one of :data:`LANCZOS_MODES` ("lanczos3",
    "lanczos4", "lanczos5": :func:`_warp_lanczos`). Returns the warped image (C, h, w) and a validity mask (h, w)
    float: 1 where the sample lies inside.
    """
    c, h, w = image.shape
    ys = torch.arange(h, device=image.device, dtype=torch.float32)[:, None] + flow[0]  # (h, w)
    xs = torch.arange(w, device=image.device, dtype=torch.float32)[None, :] + flow[1]  # (h, w)
    valid = ((ys >= 0) & (ys <= h - 1) & (xs >= 0) & (xs <= w - 1)).to(torch.float32)  # (h, w)
    if mode in LANCZOS_MODES:
        return _warp_lanczos(image, flow, LANCZOS_MODES[mode]), valid
    grid = torch.stack([(xs + 0.5) / w * 2 - 1, (ys + 0.5) / h * 2 - 1], dim=-1)[None]  # (1, h, w, 2)
    out = F.grid_sample(image[None].to(torch.float32), grid, mode=mode, padding_mode="border",
                        align_corners=False)[0]  # (C, h, w)
    return out, valid


def _warp_lanczos(image: Tensor, flow: Tensor, a: int, fused: bool = True) -> Tensor:
    """:func:`warp` with a Lanczos-``a`` kernel, borders replicated: (C, h, w) float32.

    Bicubic interpolation (``grid_sample``'s, a = -0.75) attenuates detail near the finest scale by an amount that
    depends on each frame's fractional shift, so a stack of frames at random sub-pixel shifts averaged it away (an
    exactly rendered zone plate, docs/QUALITY.md); Lanczos keeps more of it, the more lobes the more. Separable: a
    pass along the rows, then one down the columns, 2a taps each (the 2a x 2a product kernel, exactly, wherever the
    flow is constant over the taps). The row pass at source row ``r`` interpolates at the column offset of the
    output pixel that reads row ``r`` (the flow's column part taken ``round(flow_y)`` rows up), so a smooth flow of
    any size warps as the product kernel would to within its change over a few pixels. On a CUDA device (``fused``,
    Triton importable) both passes run as fused kernels (:mod:`.lanczos_gpu`, the same arithmetic); otherwise as
    torch operations, :data:`_WARP_ROWS` rows at a time."""
    if fused and lanczos_gpu.available(image):
        try:
            return lanczos_gpu.warp_lanczos(image, flow[0], flow[1], a)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # built or launched wrong here (no C compiler, an unsupported GPU): torch passes
            lanczos_gpu.disable(exc)
    c, h, w = image.shape
    src = image.to(torch.float32)
    fy, fx = flow[0].to(torch.float32), flow[1].to(torch.float32)
    rows_of = torch.arange(h, device=image.device)
    across = torch.empty(c, h, w, dtype=torch.float32, device=image.device)  # the row pass
    for r0 in range(0, h, _WARP_ROWS):
        r1 = min(h, r0 + _WARP_ROWS)
        reader = (rows_of[r0:r1, None] - torch.round(fy[r0:r1]).long()).clamp(0, h - 1)  # (rows, w)
        xs = torch.arange(w, device=image.device, dtype=torch.float32)[None, :] + fx.gather(0, reader)
        across[:, r0:r1] = _lanczos_pass(src[:, r0:r1], xs, 2, a)
    out = torch.empty_like(across)
    for r0 in range(0, h, _WARP_ROWS):
        r1 = min(h, r0 + _WARP_ROWS)
        ys = rows_of[r0:r1, None].to(torch.float32) + fy[r0:r1]  # (rows, w)
        out[:, r0:r1] = _lanczos_pass(across, ys, 1, a)
    return out


def _lanczos_pass(src: Tensor, pos: Tensor, dim: int, a: int) -> Tensor:
    """Interpolate (C, H, W) ``src`` along ``dim`` (1: rows, 2: columns) at positions ``pos`` (rows, W), one per
    output pixel: (C, rows, W), the 2a Lanczos-``a`` taps ``1 - a .. a`` around ``floor(pos)`` (indices clamped to
    the edge), normalised to sum 1. One tap at a time: ``sin(pi (f - t)) = (-1)^t sin(pi f)`` is computed once."""
    base = torch.floor(pos)
    frac = pos - base  # (rows, W) in [0, 1)
    base = base.long()
    sin_f = a * torch.sin(math.pi * frac)  # (rows, W)
    size = src.shape[dim]
    out = torch.zeros(src.shape[0], *pos.shape, dtype=torch.float32, device=src.device)
    total = torch.zeros_like(frac)
    for t in range(1 - a, a + 1):
        x = math.pi * (frac - t)  # (rows, W) within (-a pi, a pi]
        k = (sin_f if t % 2 == 0 else -sin_f) * torch.sin(x / a) / x.square().clamp(min=1e-12)
        if t in (0, 1):  # the taps next to the position: x may vanish (f = 0, or f within float error of 1)
            k = torch.where(x.abs() < 1e-6, torch.ones_like(k), k)
        total += k
        index = (base + t).clamp(0, size - 1)[None].expand(src.shape[0], -1, -1)  # (C, rows, W)
        out += k * src.gather(dim, index)
    return out / total


def _gradients(image: Tensor) -> tuple[Tensor, Tensor]:
    """Central differences (replicate borders) of (h, w): (d/dy, d/dx)."""
    p = F.pad(image[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]  # (h+2, w+2)
    gy = 0.5 * (p[2:, 1:-1] - p[:-2, 1:-1])  # (h, w)
    gx = 0.5 * (p[1:-1, 2:] - p[1:-1, :-2])  # (h, w)
    return gy, gx


def _tile_sums(x: Tensor, tile: int) -> Tensor:
    """Sum of (h, w), or of each plane of (C, h, w), over each tile and its 3x3 tile neighbourhood: (ny, nx) or
    (C, ny, nx)."""
    planes = x if x.dim() == 3 else x[None]
    c, h, w = planes.shape
    ny, nx = _tile_grid((h, w), tile)
    pad = (0, nx * tile - w, 0, ny * tile - h)
    padded = F.pad(planes[None], pad) if any(pad) else planes[None]  # zeros: outside adds nothing (no copy if none)
    sums = padded.reshape(1, c, ny, tile, nx, tile).sum(dim=(3, 5))  # (1, C, ny, nx)
    pooled = F.avg_pool2d(sums, 3, stride=1, padding=1, count_include_pad=False)[0] * 9.0  # (C, ny, nx)
    return pooled if x.dim() == 3 else pooled[0]


def _median3(flow: Tensor) -> Tensor:
    """3x3 median of each component of a tile flow (ny, nx, 2): removes isolated wrong vectors."""
    x = F.pad(flow.permute(2, 0, 1)[None].to(torch.float32), (1, 1, 1, 1), mode="replicate")  # (1, 2, ny+2, nx+2)
    patches = F.unfold(x, 3).view(2, 9, flow.shape[0], flow.shape[1])  # (2, 9, ny, nx)
    return patches.median(dim=1).values.permute(1, 2, 0).to(flow.dtype)  # (ny, nx, 2)


def _smooth_tiles(flow: Tensor, confidence: Tensor) -> Tensor:
    """Confidence-weighted 3x3 mean of a tile flow (ny, nx, 2): damps the tile-to-tile (checkerboard) modes
    that the pooled normal equations cannot see, so iterating does not amplify noise."""
    c = confidence[None, None]  # (1, 1, ny, nx)
    num = F.avg_pool2d(flow.permute(2, 0, 1)[None] * c, 3, stride=1, padding=1)  # (1, 2, ny, nx)
    den = F.avg_pool2d(c, 3, stride=1, padding=1).clamp(min=1e-30)  # (1, 1, ny, nx)
    return (num / den)[0].permute(1, 2, 0)  # (ny, nx, 2)


# A reference's finest level blurred (H, W), the products of its gradients (3, H, W): [gy gy, gx gy, gx gx], and the
# gradients (2, H, W): [gy, gx] (:func:`refinement_terms`).
Refinement = tuple[Tensor, Tensor, Tensor]


def refinement_terms(finest: Tensor) -> Refinement:
    """What the Lucas-Kanade refinement needs of the reference's finest level (H, W): the level blurred (smoothing
    keeps noise out of the gradients), the products of its gradients and the gradients. The same for every frame
    aligned to that reference: a stack's frame group computes them once (:func:`align_frame`'s ``refinement``)."""
    blurred = _blur(finest)
    gy, gx = _gradients(blurred)
    return blurred, torch.stack([gy * gy, gx * gy, gx * gx]), torch.stack([gy, gx])


def _refine(reference: Tensor | Refinement, frame: Tensor, flow: Tensor, tile: int, iterations: int) -> Tensor:
    """Lucas-Kanade sub-pixel refinement of the tile flow (ny, nx, 2) float on the finest level (``reference``: that
    level, or its :func:`refinement_terms`).

    Gradients come from the reference only: the warped frame's interpolated noise is correlated with its own
    gradient at fractional positions, which biases symmetric schemes by ~0.05 px. The normal equations are
    damped by a fraction of the median tile's texture, so flat tiles keep
    their integer vector instead of chasing noise. Only the frame's side changes from one iteration to the next:
    the mask of samples inside it (0 or 1, so a product of masked gradients is the masked product) and the error.
    """
    ref, squares, grads = reference if isinstance(reference, tuple) else refinement_terms(reference)
    src = _blur(frame)[None]  # (1, h, w)
    shape = (ref.shape[0], ref.shape[1])
    terms = torch.empty(5, *shape, dtype=ref.dtype, device=ref.device)  # the normal equations' terms, per pixel
    for _ in range(iterations):
        moved, valid = warp(src, tiles_to_pixels(flow, tile, shape), mode="bicubic")  # (1, h, w), (h, w)
        err = (moved[0] - ref) * valid  # (h, w)
        torch.mul(squares, valid, out=terms[:3])  # gy gy, gx gy, gx gx where the frame has samples
        torch.mul(grads, err, out=terms[3:])  # gy err, gx err
        sums = _tile_sums(terms, tile)  # (5, ny, nx)
        a_yy, a_xy, a_xx, b_y, b_x = sums.unbind(0)
        damping = _DAMPING * (0.5 * (a_yy + a_xx)).median().clamp(min=1e-20)
        a_yy, a_xx = a_yy + damping, a_xx + damping
        det = a_yy * a_xx - a_xy * a_xy  # (ny, nx) > 0: damped, positive semi-definite
        step_y = -(a_xx * b_y - a_xy * b_x) / det
        step_x = -(a_yy * b_x - a_xy * b_y) / det
        flow = flow + torch.stack([step_y, step_x], dim=-1).clamp(-0.5, 0.5)  # (ny, nx, 2)
        flow = _smooth_tiles(flow, a_yy + a_xx)
    return flow


def align_frame(reference: Tensor | list[Tensor], frame: Tensor, params: AlignParams | None = None,
                prior: tuple[float, float] | None = None, refinement: Refinement | None = None) -> Tensor:
    """Per-tile flow (ny, nx, 2) float32 in pixels that maps grey ``frame`` (H, W) onto ``reference``.

    ``reference`` is a (H, W) grey image or its :func:`grey_pyramid` (build it once per group); tiles are
    ``params.tile_size`` pixels. Use :func:`tiles_to_pixels` for a dense, smooth (2, H, W) field.
    ``prior``: the frame's global shift (dy, dx) in pixels (:func:`estimate_shift`), when known: the search
    starts from it and, at every level, a tile takes it (rounded to that level's pixels) unless its own best
    displacement is clearly better (:data:`_PRIOR_MARGIN`). Without it a fine periodic texture, flat on the
    coarse levels, locked onto another repeat of itself (docs/QUALITY.md).
    ``refinement``: the reference's :func:`refinement_terms` when the caller keeps them (computed here otherwise).
    """
    p = params or AlignParams()
    check_mosaic(frame, "frame", min_size=16)
    ref_pyr = reference if isinstance(reference, list) else grey_pyramid(reference, p.levels)
    if ref_pyr[0].shape != frame.shape:
        raise ValueError(f"frame shape {tuple(frame.shape)} differs from the reference's {tuple(ref_pyr[0].shape)}")
    frame_pyr = grey_pyramid(frame.to(ref_pyr[0].device), len(ref_pyr))
    top = len(ref_pyr) - 1
    dev = ref_pyr[0].device
    shift = None if prior is None else torch.tensor(prior, dtype=torch.float64, device=dev)  # (2,)
    flow = torch.zeros(*_tile_grid(ref_pyr[top].shape, p.tile_size), 2, dtype=torch.long, device=dev)  # (ny, nx, 2)
    if shift is not None:
        flow += torch.round(shift / 2**top).long()
    for level in range(top, -1, -1):
        if level < top:
            flow = _upsample_tiles(flow, _tile_grid(ref_pyr[level].shape, p.tile_size))
        radius = p.search_radius if level > 0 else 1
        at_level = None if shift is None else torch.round(shift / 2**level).long()  # (2,)
        flow = _median3(_search(ref_pyr[level], frame_pyr[level], flow, p.tile_size, radius, at_level))
    return _refine(ref_pyr[0] if refinement is None else refinement, frame_pyr[0], flow.to(torch.float32), p.tile_size,
                   p.lk_iterations)


__all__ = ["AlignParams", "Refinement", "align_frame", "grey_pyramid", "mosaic_grey", "refinement_terms",
           "tiles_to_pixels", "warp"]


# ---------------------------------------------------------------------------------------------------------
# Global shift (phase correlation): stacks check for pixel-shift patterns with it


def _binned_luma(mosaic: Tensor) -> Tensor:
    """Mean of each 2x2 CFA block, (R + 2G + B) / 4: green-weighted luminance at half resolution, float32 (the
    shifts come out the same as in float64 to their last decimal, at about half the time: `strata bench shifts`)."""
    return split_sites(mosaic.to(torch.float32)).mean(dim=0)  # (H/2, W/2)


def _hann(n: int, like: Tensor) -> Tensor:
    return torch.hann_window(n, periodic=False, dtype=like.dtype, device=like.device)


def _luma(mosaic: Tensor) -> Tensor:
    """(R + 2G + B) / 4 at every pixel of a Bayer mosaic: the 3 x 3 binomial filter ([1 2 1] / 4 each way) weighs
    the sites of every 2x2 phase alike (a quarter R, a half G, a quarter B), so a frame moved by one pixel has the
    same luminance, moved (the 2x2 block mean changes with the phase at colour edges); float32, edges mirrored."""
    p = F.pad(mosaic.to(torch.float32)[None, None], (1, 1, 1, 1), mode="reflect")[0, 0]  # (h + 2, w + 2)
    rows = 0.25 * (p[:-2] + p[2:]) + 0.5 * p[1:-1]  # (h, w + 2)
    return 0.25 * (rows[:, :-2] + rows[:, 2:]) + 0.5 * rows[:, 1:-1]


def _tukey_at(n: int, offset: float, like: Tensor) -> Tensor:
    """A Tukey window over ``n`` samples (cosine tapers over :data:`_WINDOW_TAPER` of it, flat between) moved by
    ``offset`` (its part outside 0..n-1 cut off): (n,)."""
    t = torch.arange(n, dtype=torch.float64, device=like.device) - offset
    edge = max(_WINDOW_TAPER * (n - 1) / 2.0, 1e-9)
    ramp = torch.minimum(t, (n - 1) - t).clamp(min=0.0) / edge  # 0 at the ends, 1 where the flat part starts
    window = 0.5 - 0.5 * torch.cos(math.pi * ramp.clamp(max=1.0))
    return torch.where((t >= 0) & (t <= n - 1), window, torch.zeros_like(window)).to(like.dtype)


def _windowed(x: Tensor, window: Tensor) -> Tensor:
    """``x`` less its window-weighted mean, times the window (no DC leaks into the spectrum)."""
    return (x - (x * window).sum() / window.sum().clamp_min(1e-12)) * window


def _freqs(n: int, like: Tensor) -> Tensor:
    return torch.fft.fftfreq(n, d=1.0 / n, dtype=torch.float64, device=like.device)  # integer frequencies


def _upsampled_peak(cross: Tensor, center: tuple[float, float], half_width: float, step: float) -> Tensor:
    """Real part of the inverse DFT of ``cross`` (N, M) on a fine grid around ``center``: (n, n) float64 (the
    products in ``cross``'s precision).

    Guizar-Sicairos et al. 2008: two small matrix products instead of a zero-padded inverse FFT.
    """
    n, m = cross.shape
    offsets = torch.arange(-half_width, half_width + step / 2, step, dtype=torch.float64, device=cross.device)
    ys = center[0] + offsets  # (k,)
    xs = center[1] + offsets  # (k,)
    ky = torch.exp(2j * math.pi * ys[:, None] * _freqs(n, cross)[None, :] / n)  # (k, N)
    kx = torch.exp(2j * math.pi * _freqs(m, cross)[:, None] * xs[None, :] / m)  # (M, k)
    return (ky.to(cross.dtype) @ cross @ kx.to(cross.dtype)).real.double()  # (k, k)


def _refine_peak(surface: Tensor, center: tuple[float, float], step: float) -> tuple[float, float]:
    """Argmax of ``surface`` (k, k) on the grid around ``center`` plus a parabolic fit on its neighbours."""
    k = surface.shape[0]
    if not bool(surface.amax() > surface.amin()):  # flat (no texture to correlate): no peak, the centre stays
        return center
    iy, ix = divmod(int(torch.argmax(surface)), k)

    def vertex(lo: float, mid: float, hi: float) -> float:
        denom = lo - 2.0 * mid + hi
        return 0.0 if denom >= 0 else 0.5 * (lo - hi) / denom

    fy = vertex(*surface[iy - 1 : iy + 2, ix].tolist()) if 0 < iy < k - 1 else 0.0
    fx = vertex(*surface[iy, ix - 1 : ix + 2].tolist()) if 0 < ix < k - 1 else 0.0
    half = (k - 1) // 2
    return center[0] + (iy - half + fy) * step, center[1] + (ix - half + fx) * step


def _phase_slope(power: Tensor, band: float = _SLOPE_BAND, width: int = 0, squared: bool = True
                 ) -> Callable[[float, float], tuple[float, float]]:
    """The residual shift after removing (dy, dx): a weighted least-squares fit of the cross-power phase slope.

    Uses the frequencies below ``_SLOPE_BAND`` cycles/pixel but not the few bins around DC
    (``_SLOPE_MIN_BINS``), weighted by cross-power magnitude, so high-SNR texture dominates and noise-only bins
    barely count. Removing a shift turns each bin's phase and leaves its magnitude, so the band's bins, their
    weights and the normal matrix are taken once; each call only turns the phases (wrapped to [-pi, pi)) and
    solves: the same shifts as turning the whole complex spectrum each time, and with the reference's spectrum
    taken once (:func:`shift_estimator`) a 4 x 50 MP pixel-shift check 0.14-0.18 s instead of 0.40-0.44 on two
    threads of the 2-core VM (`strata bench shifts`). ``width``: ``power`` is the half spectrum (``rfft2``) of
    an image that wide; each bin off the zero column then stands for its mirror too (weight doubled), which gives
    the whole spectrum's fit. ``squared`` False: weighted by the magnitude itself.
    """
    h, w = power.shape[0], width or power.shape[1]
    fy = _freqs(h, power) / h  # (h,) cycles per pixel
    fx = _freqs(w, power)[: power.shape[1]].abs() / w if width else _freqs(w, power) / w  # (power's columns,)
    rows, cols = torch.nonzero(fy.abs() <= band)[:, 0], torch.nonzero(fx.abs() <= band)[:, 0]
    bins = power.index_select(0, rows).index_select(1, cols)  # (hb, wb): the band's rectangle
    fy, fx = fy[rows][:, None], fx[cols][None, :]  # (hb, 1), (1, wb)
    near_dc = (fy * h).square() + (fx * w).square() <= _SLOPE_MIN_BINS**2  # (hb, wb): left out (weight 0)
    weight, phase = torch.view_as_real(bins).square().sum(-1).masked_fill(near_dc, 0.0), bins.angle()  # (hb, wb)
    if not squared:
        weight = weight.sqrt()
    if width:
        weight = weight * torch.where(fx > 0, 2.0, 1.0).to(weight.dtype)
    gy, gx = -2.0 * math.pi * fy, -2.0 * math.pi * fx  # phase slope per unit shift
    a = torch.stack([
        torch.stack([(weight * gy * gy).sum(), (weight * gy * gx).sum()]),
        torch.stack([(weight * gx * gy).sum(), (weight * gx * gx).sum()]),
    ])  # (2, 2) normal equations
    wy, wx = weight * gy, weight * gx  # (hb, wb)
    inverse = torch.linalg.pinv(a, rtol=_SLOPE_RTOL, hermitian=True)  # no texture in the band: zeros, no step

    def fit(dy: float, dx: float) -> tuple[float, float]:
        theta = torch.remainder(phase + 2.0 * math.pi * (fy * dy + fx * dx) + math.pi, 2.0 * math.pi) - math.pi
        delta = inverse @ torch.stack([(wy * theta).sum(), (wx * theta).sum()])
        return float(delta[0]), float(delta[1])

    return fit


def estimate_shift(reference: Tensor, frame: Tensor, cfa: str) -> tuple[float, float]:
    """Global translation (dy, dx) of ``frame`` relative to ``reference``, in full-resolution pixels.

    Phase correlation of the 2x2-binned luminance (Hann window) finds the peak, refined on a 1/8-pixel
    upsampled DFT grid, and a power-weighted least-squares fit of the cross-power phase slope gives a sub-pixel
    shift (robust to noise), doubled; then the fit again on the full-resolution luminance, the frame's window moved
    by the estimate (:func:`_follow_window`). ``cfa`` is validated only.
    """
    return shift_estimator(reference, cfa)([frame])[0]


def shift_estimator(reference: Tensor, cfa: str) -> Callable[[Sequence[Tensor]], list[tuple[float, float]]]:
    """:func:`estimate_shift` against one ``reference`` for many frames: the reference's windowed spectrum is
    taken once, and the frames' spectra, cross-power spectra and correlation surfaces in one batched transform
    each (the torch threads share the work; one Python thread per frame fought over the GIL and oversubscribed the
    cores: `strata bench shifts`); only the sub-pixel refinement is frame by frame. The same shifts whether a
    frame is estimated alone or with others."""
    cfa_channels(cfa)
    check_mosaic(reference, "reference", min_size=8)
    a = _binned_luma(reference)  # (h, w)
    h, w = a.shape
    window = _hann(h, a)[:, None] * _hann(w, a)[None, :]  # (h, w)
    fa_conj = torch.fft.fft2((a - a.mean()) * window).conj()  # (h, w) complex64
    full = _luma(reference)
    full_conj = torch.fft.rfft2(_windowed(full, _window_at(full.shape, (0.0, 0.0), full))).conj()

    def estimate(frames: Sequence[Tensor]) -> list[tuple[float, float]]:
        for frame in frames:
            check_mosaic(frame, "frame", min_size=8)
            if reference.shape != frame.shape:
                raise ValueError(f"frame shape {tuple(frame.shape)} differs from reference {tuple(reference.shape)}")
        if not frames:
            return []
        b = torch.stack([_binned_luma(f.to(reference.device)) for f in frames])  # (n, h, w)
        power = torch.fft.fft2((b - b.mean(dim=(1, 2), keepdim=True)) * window) * fa_conj  # (n, h, w) cross-power
        mag = power.abs()
        floor = (mag + mag.mean(dim=(1, 2), keepdim=True) * 1e-2).clamp_min_(torch.finfo(mag.dtype).tiny)  # 0: flat
        cross = power * floor.reciprocal_()  # whitened: a sharp peak
        surface = torch.fft.irfft2(cross[..., : w // 2 + 1], s=(h, w))  # (n, h, w): Hermitian, so the real part
        peaks = surface.flatten(1).argmax(dim=1).tolist()  # (n,) flat indices
        coarse = [_refined(cross[i], power[i], peak) for i, peak in enumerate(peaks)]
        return _follow_window(torch.stack([_luma(f.to(reference.device)) for f in frames]), full_conj, coarse)

    return estimate


def _window_at(shape: tuple[int, ...], offset: tuple[float, float], like: Tensor) -> Tensor:
    return _tukey_at(shape[0], offset[0], like)[:, None] * _tukey_at(shape[1], offset[1], like)[None, :]


def _follow_window(frames: Tensor, reference_conj: Tensor, start: Sequence[tuple[float, float]]
                   ) -> list[tuple[float, float]]:
    """Refine each frame's shift ``start`` (full-resolution px) on the full-resolution luminance (:func:`_luma`,
    ``frames`` (n, h, w)): each frame's window (Tukey, :data:`_WINDOW_TAPER`) moved by its estimate, so that it
    covers the content the reference's covers, then the phase-slope fit weighted by the cross-power's magnitude
    (:func:`_phase_slope`), :data:`_WINDOW_ITERATIONS` times, the frames in one batched transform; rounded to
    :data:`_SHIFT_DECIMALS`."""
    h, w = frames.shape[1:]
    shifts = list(start)
    for _ in range(_WINDOW_ITERATIONS):
        windowed = torch.stack([_windowed(f, _window_at((h, w), s, f)) for f, s in zip(frames, shifts, strict=True)])
        power = torch.fft.rfft2(windowed) * reference_conj  # (n, h, w // 2 + 1)
        for i in range(len(shifts)):
            slope = _phase_slope(power[i], _FULL_SLOPE_BAND, width=w, squared=False)
            dy, dx = shifts[i]
            for _ in range(_SLOPE_ITERATIONS):
                ddy, ddx = slope(dy, dx)
                dy, dx = dy + ddy, dx + ddx
            shifts[i] = (dy, dx)
    return [(round(dy, _SHIFT_DECIMALS) + 0.0, round(dx, _SHIFT_DECIMALS) + 0.0) for dy, dx in shifts]


def _refined(cross: Tensor, power: Tensor, peak: int) -> tuple[float, float]:
    """A frame's shift, full-resolution px, from its correlation surface's whole-pixel ``peak`` (flat index):
    the upsampled DFT around it, then the phase-slope fit (:func:`shift_estimator`)."""
    h, w = cross.shape
    py, px = divmod(peak, w)
    py = py - h if py > h // 2 else py
    px = px - w if px > w // 2 else px
    coarse = _upsampled_peak(cross, (float(py), float(px)), 1.0, 1.0 / 8)
    dy, dx = _refine_peak(coarse, (float(py), float(px)), 1.0 / 8)
    slope = _phase_slope(power)
    for _ in range(_SLOPE_ITERATIONS):
        ddy, ddx = slope(dy, dx)
        dy, dx = dy + ddy, dx + ddx
    return 2.0 * dy, 2.0 * dx
