"""Multi-frame merge ops: demosaic-warp merge with noise-aware motion rejection and the pixel-shift combine
(the global shift estimate is :func:`services.pipeline.ops.align.estimate_shift`).

Mosaics are (H, W) float, normalised, with even H and W; all frames share the CFA phase of the reference.
Shifts and flows are in full-resolution pixels: ``(dy, dx)`` means ``frame(y + dy, x + dx) ~ reference(y, x)``
(the frame's content moved by +dy, +dx).

Merge (sub-pixel stacks): every frame is demosaiced (``MergeParams.demosaic``: the shot's model package, or
Malvar, on the white-balanced mosaic, then divided back by the gains, so results stay in camera RGB) in the
orientation its position in the stack picks (:data:`~services.pipeline.ops.cfa.ORIENTATIONS`, position modulo 8:
frame 0 upright, frame 1 turned 180 degrees, ...; the result is turned back), so the model's direction-dependent
errors differ from frame to frame and average out like the noise does (docs/QUALITY.md), aligned
to the reference with :mod:`.align` (from its global shift, measured once per stack), warped (Lanczos-3) to the
reference geometry and added with a per-pixel
weight in [0, 1] from a Poisson-Gaussian test of its local difference to the reference (:func:`motion_weights`).
Averaging demosaiced frames also averages their demosaicing errors, which differ from frame to frame (each frame
samples the scene at another CFA phase).

Accumulators are int64 fixed point (units of ``2**-FIXED_POINT_BITS``): sub-pixel stacks (5, H, W) = the
weighted sums of R, G, B, the weight, and the weighted sum of each frame's Bayer mosaic warped onto the reference
(its CFA planes resampled, so every site keeps its colour; the renderer's second path); pixel shift (6, H, W) =
the weighted sums of R, G, B, then one weight per channel. With the detail band (``detail``, the default for
sub-pixel stacks) the R, G, B sums hold each warped render's base (a Gaussian low-pass) and 4 channels follow the
Bayer sum: the detail (render - base) summed with the weight times the frame's detail share, and that product's
sum (:func:`detail_share`; the merged RGB is base sum / weight + detail sum / its weight, :func:`merged_rgb`):
(9, H, W). With the raw-sample merge (``raw_merge``, multi-frame demosaicking) sub-pixel
stacks add 6 channels after those, the frames' raw samples kernel-regressed per colour onto the reference grid
(:func:`raw_kernel_sums`, weighted like the frame's RGB). Every
frame's contribution depends only on the frame, the reference and the shared parameters and is rounded to
fixed point before it is added, so integer addition makes accumulators of any partition of the frames add
up to bit-identical totals: ``sum(sums) / sum(weights)`` over groups equals merging all frames at once
exactly (float sums differ in the last bits, which the renderer's local-variance filter can blow up to a
few 16-bit LSB). 2**-20 is 1/16 of a 16-bit step; int32 holds the sums of up to 2047 frames.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from services.pipeline.ops._checks import check_mosaic, small
from services.pipeline.ops.align import (
    AlignParams,
    Refinement,
    align_frame,
    grey_pyramid,
    refinement_terms,
    tiles_to_pixels,
    warp,
)
from services.pipeline.ops.cfa import (
    ORIENTATIONS,
    cfa_channels,
    cfa_masks,
    join_sites,
    orient,
    oriented_cfa,
    split_sites,
    unorient,
)
from services.pipeline.ops.colour import white_balance
from services.pipeline.ops.demosaic import demosaic_malvar
from services.pipeline.ops.filters import gaussian_weights, local_min_max


def _axis_taps(n: int, shift: float, device: torch.device) -> tuple[Tensor, Tensor, float, Tensor]:
    """Source indices (i0, i1), fraction and validity for sampling a length-``n`` axis at ``i + shift``."""
    base = math.floor(shift)
    frac = shift - base
    src = torch.arange(n, device=device) + base  # (n,)
    last = src + (1 if frac > 0 else 0)
    valid = (src >= 0) & (last <= n - 1)  # (n,)
    return src.clamp(0, n - 1), (src + 1).clamp(0, n - 1), frac, valid


def shift_mosaic(frame: Tensor, dy: float, dx: float, cfa: str) -> tuple[Tensor, Tensor]:
    """Resample ``frame`` (H, W) into the reference geometry: ``out(y, x) = frame(y + dy, x + dx)``.

    Each CFA sub-plane (H/2, W/2) is sampled bilinearly at ``(i + dy/2, j + dx/2)``, so colours never mix.
    Returns the shifted mosaic and a (H, W) weight: 1 where the source lies inside the frame, else 0 (and the
    mosaic 0 there). Same dtype as ``frame`` (floating).
    """
    cfa_channels(cfa)
    check_mosaic(frame, "frame", min_size=8)
    if not frame.is_floating_point():
        raise TypeError(f"frame must be floating, got {frame.dtype}")
    planes = split_sites(frame)  # (4, h, w)
    _, h, w = planes.shape
    y0, y1, fy, vy = _axis_taps(h, dy / 2.0, frame.device)
    x0, x1, fx, vx = _axis_taps(w, dx / 2.0, frame.device)
    rows = planes.index_select(1, y0)  # (4, h, w)
    if fy > 0:
        rows = rows * (1.0 - fy) + planes.index_select(1, y1) * fy
    out = rows.index_select(2, x0)  # (4, h, w)
    if fx > 0:
        out = out * (1.0 - fx) + rows.index_select(2, x1) * fx
    valid = (vy[:, None] & vx[None, :]).to(frame.dtype)  # (h, w)
    out = out * valid
    weight = valid.expand(4, h, w)  # (4, h, w)
    return join_sites(out), join_sites(weight)


# What the merge itself makes two static frames differ by, as a share of the reference's local standard deviation
# (each frame's demosaic errs differently at its CFA phase and orientation, warps and alignment err with the
# gradient): the motion test tolerates it on top of the sensor noise (see motion_weights).
# Each frame's model pass in a stack is told this many times the stack's noise (per-sample noise / frames), at most
# MERGE_NOISE_CAP of a frame's own; chosen by sweeps on the stack benchmark (docs/QUALITY.md): with the best package
# 2.1.0 a quarter of the frame's noise was best for 4 and for 8 frames. Kept here (torch only) so training can use it.
MERGE_NOISE_FACTOR = 2.0
MERGE_NOISE_CAP = 0.25


def frame_noise_share(stack_size: int) -> float:
    """The share of its own noise a frame of a ``stack_size``-frame stack is told (1: a frame alone or pixel shift)."""
    return min(MERGE_NOISE_FACTOR / stack_size, MERGE_NOISE_CAP) if stack_size > 1 else 1.0


MODEL_ERROR = 0.1
_RGB_WARP = "lanczos5"  # how a frame's demosaiced RGB is resampled onto the reference (STRATA_STACK_WARP)


@dataclass(frozen=True)
class MergeParams:
    """Shared merge parameters: CFA, white-balance gains (demosaic only), noise model, motion test, alignment.

    The noise variance of a normalised sample ``x`` is ``shot * x + read``. The motion statistic ``z2`` is
    chi-square with 3 degrees of freedom where nothing moved; a frame's weight falls linearly from 1 at
    ``z2 = reject_low`` to 0 at ``reject_high``. ``model_error``: the share of the reference's local standard
    deviation the test tolerates as the merge's own error (without it, noise-free frames were all rejected).
    """

    cfa: str
    gains: tuple[float, float, float]
    shot: float
    read: float
    window_radius: int = 3
    reject_low: float = 16.0
    reject_high: float = 36.0
    model_error: float = MODEL_ERROR
    align: AlignParams = AlignParams()
    rgb_warp: str = _RGB_WARP  # warp mode of each frame's demosaiced RGB (STRATA_STACK_WARP)
    # Demosaic of one white-balanced frame: (B, 1, H, W), cfa -> (B, 3, H, W). None = Malvar. The coordinator
    # passes the shot's model package (noise-free: the frames are averaged first, denoised after fusion).
    demosaic: Callable[[Tensor, str], Tensor] | None = None

    def __post_init__(self) -> None:
        cfa_channels(self.cfa)
        if len(self.gains) != 3 or min(self.gains) <= 0:
            raise ValueError(f"gains must be 3 positive values, got {self.gains}")
        if self.shot < 0 or self.read < 0:
            raise ValueError(f"noise model must be non-negative, got {self.shot}, {self.read}")
        if not 0 <= self.model_error < 1:
            raise ValueError(f"model_error must be in [0, 1), got {self.model_error}")
        if not 0 <= self.reject_low < self.reject_high:
            raise ValueError(f"need 0 <= reject_low < reject_high, got {self.reject_low}, {self.reject_high}")


# Fraction of a window's sites that record each channel (R, G, B) in a Bayer mosaic.
_CHANNEL_SHARE = (0.25, 0.5, 0.25)
FIXED_POINT_BITS = 20
_ONE = float(2**FIXED_POINT_BITS)
_VARIANCE_FLOOR = (1.0 / 65535) ** 2  # 16-bit quantisation: noise-free frames still get a finite test
_FALLBACK_WEIGHT = 1e-4  # pixel shift: weight of the reference's demosaiced value for channels it lacks


def demosaic_camera(mosaic: Tensor, params: MergeParams, orientation: int = 0) -> Tensor:
    """(H, W) normalised mosaic -> (3, H, W) camera RGB: the shot's demosaic (Malvar by default) on the
    white-balanced mosaic, gains undone. With an ``orientation`` (index into ``ORIENTATIONS``) the demosaic sees
    the mosaic turned or mirrored that way (even H and W: still a Bayer mosaic) and its result is turned back."""
    check_mosaic(mosaic, "mosaic", min_size=8)
    gains = small(params.gains, mosaic.device, torch.float32).view(3, 1, 1)
    balanced = white_balance(mosaic.to(torch.float32)[None, None], params.gains, params.cfa)  # (1, 1, H, W)
    demosaic = params.demosaic or demosaic_malvar
    if orientation == 0:
        return demosaic(balanced, params.cfa)[0] / gains  # (3, H, W)
    rgb = demosaic(orient(balanced, orientation).contiguous(), oriented_cfa(params.cfa, orientation))  # (1, 3, ...)
    return (unorient(rgb[0], orientation) / gains).contiguous()  # (3, H, W); one copy at most


def _window_mean(x: Tensor, radius: int) -> Tensor:
    """Mean over a (2r+1)^2 window with reflect padding, (B, C, H, W): one pooling kernel. Merges always see
    whole frames on one device, so unlike the renderer's filters this need not be strip-exact."""
    return F.avg_pool2d(F.pad(x, (radius, radius, radius, radius), mode="reflect"), 2 * radius + 1, stride=1)


def _window_moments(rgb: Tensor, radius: int) -> tuple[Tensor, Tensor]:
    """Window means and variances (1, 3, H, W) each of (3, H, W) ``rgb``, in one pooling pass."""
    moments = _window_mean(torch.cat([rgb, rgb * rgb])[None], radius)  # (1, 6, H, W)
    mean = moments[:, :3]
    return mean, (moments[:, 3:] - mean * mean).clamp(min=0.0)


def motion_weights(reference: Tensor, candidate: Tensor, samples: Tensor, params: MergeParams,
                   local_range: bool = False, level: Tensor | None = None, spread: Tensor | None = None) -> Tensor:
    """Per-pixel weight (H, W) in [0, 1] of ``candidate`` against ``reference`` (both (3, H, W) camera RGB).

    ``samples`` (3, H, W) marks where the candidate holds a usable value of each channel (0/1). In a window of
    radius ``params.window_radius`` the mean difference per channel is compared with its Poisson-Gaussian
    standard error ``sqrt(2 (shot * m + read) / n)`` (m the reference's local mean, n the samples in the
    window; a demosaiced channel counts its CFA share of them) widened by the merge's own error,
    ``model_error`` times the reference's local standard deviation (``spread`` is its variance in the window):
    frames of a static scene differ by their demosaic, warp and alignment errors, which grow with the local
    contrast, and without that term noise-free frames were rejected wherever there was detail (an 8-frame
    stack gained nothing). ``z2`` sums the squared ratios. The weight is
    eroded by one pixel so the rim of a rejected region is rejected too. With ``local_range`` the difference
    is only what lies outside the reference's 3x3 min/max of that channel, which tolerates the reference's
    interpolation error where the candidate holds raw samples at sites the reference had to interpolate.
    ``level``, ``spread``: the reference's window means and variances (1, 3, H, W) when the caller has them
    (:func:`prepare_reference`).
    """
    r = params.window_radius
    share = small(_CHANNEL_SHARE, reference.device, reference.dtype).view(1, 3, 1, 1)
    if local_range:
        lo, hi = local_min_max(reference[None], 1)  # (1, 3, H, W) each
        diff = ((candidate[None] - hi).clamp(min=0.0) - (lo - candidate[None]).clamp(min=0.0)) * samples
    else:
        diff = ((candidate - reference) * samples)[None]  # (1, 3, H, W)
    # one mask for every channel (an expanded (H, W) one, as a frame's warp gives): its window mean once, not thrice
    shared = samples.stride(0) == 0
    means = _window_mean(torch.cat([diff, (samples[:1] if shared else samples)[None]], dim=1), r)  # (1, 4|6, H, W)
    count = means[:, 3:].expand(1, 3, *means.shape[2:])  # (1, 3, H, W) fraction of the window with samples
    mean_diff = means[:, :3] / count.clamp(min=1e-6)  # (1, 3, H, W)
    if level is None or spread is None:
        level, spread = _window_moments(reference, r)
    n = (count * share * (2 * r + 1) ** 2).clamp(min=1.0)  # (1, 3, H, W) independent samples, roughly
    variance = 2.0 * (params.shot * level.clamp(min=0.0) + params.read + _VARIANCE_FLOOR) / n  # (1, 3, H, W)
    variance = variance + params.model_error**2 * spread
    z2 = (mean_diff.square() / variance * (count > 0)).sum(dim=1, keepdim=True)  # (1, 1, H, W)
    weight = ((params.reject_high - z2) / (params.reject_high - params.reject_low)).clamp(0.0, 1.0)
    eroded = -F.max_pool2d(F.pad(-weight, (1, 1, 1, 1), mode="reflect"), 3, stride=1)  # (1, 1, H, W)
    return eroded[0, 0]  # (H, W)


@dataclass
class _Reference:
    """What every frame of a group is compared with: the reference mosaic, its camera RGB, its grey pyramid."""

    mosaic: Tensor  # (H, W), clipped at black (0) as the demosaic sees it
    rgb: Tensor  # (3, H, W)
    pyramid: list[Tensor]
    level: Tensor  # (1, 3, H, W) window means of rgb for the motion test
    spread: Tensor  # (1, 3, H, W) window variances of rgb for the motion test
    refinement: Refinement | None = None  # the alignment's terms of the finest level, made by the first frame aligned
    detail_ratio: Tensor | None = None  # (H, W) detail_noise_ratio, made by the first frame merged with a detail band


def prepare_reference(reference: Tensor, params: MergeParams) -> _Reference:
    """Demosaic the reference and build its alignment pyramid once per group. ``reference`` may hold values below
    black (negative, see :func:`accumulate_frames`); its demosaic sees them clipped to 0."""
    check_mosaic(reference, "reference", min_size=8)
    ref = reference.to(torch.float32).clamp(min=0.0)
    rgb = demosaic_camera(ref, params)  # (3, H, W)
    return _Reference(ref, rgb, grey_pyramid(rgb.mean(dim=0), params.align.levels),
                      *_window_moments(rgb, params.window_radius))


def _fixed(x: Tensor) -> Tensor:
    """Float contribution -> int64 fixed point (round half to even, deterministic)."""
    return torch.round(x * _ONE).to(torch.int64)


# Raw-sample merge (multi-frame demosaicking, after Wronski et al. 2019): the Gaussian kernel's standard deviation in
# full-resolution pixels, and the taps per axis around each output pixel's source position.
RAW_MERGE_SIGMA = 0.5
_RAW_MERGE_TAPS = (-1, 0, 1, 2)
RAW_MERGE_CHANNELS = 6  # per-colour kernel-weighted sums R, G, B, then the kernel weights R, G, B


# The detail band: a render resampled at a sub-pixel offset keeps its coarse content but not its finest. Near half
# a pixel no interpolator recovers detail near the Nyquist frequency (a perfect frame of a photograph at the sampling
# limit, warped by Lanczos-5: 33 dB off the truth near half a pixel, 43-54 dB near whole pixels, docs/QUALITY.md),
# and averaging such frames blurred the stack: 8 frames whose fractions lay near half a pixel rendered 2 dB below 8
# near whole pixels, and noise-free below the single frame. So each warped render is split into a base (Gaussian,
# DETAIL_SIGMA px) averaged with the frame's merge weight, where every frame counts, and a detail band averaged with
# that weight times a Wiener-like share (:func:`detail_share`): a frame's detail counts less the less reliable its
# warp (:func:`warp_reliability`) and the more detail the reference shows there beside the noise and the renders'
# own errors, so smooth or noisy regions keep averaging every frame's detail. Swept on anti-aliased photo stacks at
# two scales and four noise levels (docs/QUALITY.md): sigma 0.7 cost 0.25 dB on softer frames; without the renders'
# own error (DETAIL_MODEL_ERROR 0) noise-free stacks took the finest detail from the reference alone and lost
# 0.1-1.3 dB.
DETAIL_SIGMA = 0.5
DETAIL_STRENGTH = 3.0  # c in detail_share
DETAIL_MODEL_ERROR = 0.5  # the renders' own error on the detail band, a share of its energy (detail_noise_ratio)
_DETAIL_TAPS = gaussian_weights(DETAIL_SIGMA, 2)
_DETAIL_RADIUS = 3  # the window of the reference's detail energy: 7 x 7
DETAIL_CHANNELS = 4  # the detail's weighted sums R, G, B, then their weight


def warp_reliability(pixels: Tensor) -> Tensor:
    """(H, W) in [0, 1] of a (2, H, W) flow in pixels: ``(1 - 2 |fy|) (1 - 2 |fx|)``, fy and fx each axis's
    distance to the nearest whole pixel (1 on whole pixels, 0 half a pixel off in either axis)."""
    frac = (pixels - torch.round(pixels)).abs()  # (2, H, W) in [0, 0.5]
    return ((1.0 - 2.0 * frac[0]) * (1.0 - 2.0 * frac[1])).clamp(min=0.0)


def _gaussian(x: Tensor) -> Tensor:
    """(C, H, W) low-passed by the separable DETAIL_SIGMA Gaussian (reflect): two depthwise convolutions. Merges
    see whole frames on one device (unlike the renderer's filters this need not be strip-exact)."""
    c, r = x.shape[0], len(_DETAIL_TAPS) // 2
    taps = torch.tensor(_DETAIL_TAPS, dtype=x.dtype, device=x.device)
    rows = F.conv2d(F.pad(x[None], (0, 0, r, r), mode="reflect"), taps.view(1, 1, -1, 1).expand(c, 1, -1, 1),
                    groups=c)
    return F.conv2d(F.pad(rows, (r, r, 0, 0), mode="reflect"), taps.view(1, 1, 1, -1).expand(c, 1, 1, -1),
                    groups=c)[0]


def split_detail(rgb: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(base, detail) of (3, H, W) ``rgb``: the Gaussian low-pass (DETAIL_SIGMA) and the rest. ``valid`` (H, W)
    0/1: where ``rgb`` holds the frame (a warp's mask); the base averages only those pixels."""
    if valid is None:
        base = _gaussian(rgb)
    else:
        sums = _gaussian(torch.cat([rgb * valid, valid[None]]))  # (4, H, W)
        base = torch.where(sums[3:] > 1e-3, sums[:3] / sums[3:].clamp(min=1e-3), rgb)
    return base, rgb - base


def detail_noise_ratio(ref: _Reference, params: MergeParams) -> Tensor:
    """(H, W) in [0, 1 / DETAIL_MODEL_ERROR): the reference's local detail energy E (the mean square of its detail
    band over a 7 x 7 window, the colours averaged) over what any frame's detail errs by there: the modelled noise
    variance of one frame (16-bit quantisation at least) plus DETAIL_MODEL_ERROR E (each render's own error)."""
    detail = split_detail(ref.rgb.float())[1]  # (3, H, W); squares in float32 (float16 would underflow)
    energy = _window_mean(detail.square().mean(dim=0)[None, None], _DETAIL_RADIUS)[0, 0]  # (H, W)
    variance = (params.shot * ref.level[0].mean(dim=0).clamp(min=0.0) + params.read).clamp(min=_VARIANCE_FLOOR)
    return energy / (variance + DETAIL_MODEL_ERROR * energy)


def detail_share(reliability: Tensor, ratio: Tensor) -> Tensor:
    """A frame's share (H, W) in (0, 1] of the detail band: ``1 / (1 + DETAIL_STRENGTH (1 - reliability) ratio)``,
    ``ratio`` from :func:`detail_noise_ratio`: every frame's detail counts alike where the reference shows no more
    than noise, and the ones whose warp loses the finest detail count less where it shows much."""
    return 1.0 / (1.0 + DETAIL_STRENGTH * (1.0 - reliability) * ratio)


def merged_rgb(acc: Tensor) -> Tensor:
    """(3, H, W) float64 merged camera RGB of a (5 | 6 | 9 | 11 | 15, H, W) fixed-point accumulator (or a fused
    total): sums / weights, plus the detail band's sum / its weight where there is one."""
    weights = acc[3:6] if acc.shape[0] == 6 else acc[3:4]
    rgb = acc[:3].to(torch.float64) / weights.clamp(min=1).to(torch.float64)
    if acc.shape[0] in (9, 15):
        rgb = rgb + acc[5:8].to(torch.float64) / acc[8:9].clamp(min=1).to(torch.float64)
    return rgb


def raw_kernel_sums(frame: Tensor, pixels: Tensor | None, cfa: str, sigma: float = RAW_MERGE_SIGMA) -> Tensor:
    """Kernel regression of one frame's raw samples onto the reference grid: (6, H, W) float32 =
    [sum_k k * sample of colour c (c = R, G, B), sum_k k of colour c].

    Output pixel (y, x) looks at ``frame``'s 4x4 sites around its source position ``(y, x) + pixels[:, y, x]``
    (the alignment's per-pixel flow; None = the reference itself, no motion) and weighs each site's sample by
    ``exp(-d^2 / (2 sigma^2))`` of its distance ``d`` to that position, into the sums of the colour the site
    records. Frames shifted by sub-pixel amounts put their samples at other places, so the sums of several
    frames sample each colour more densely than one mosaic does. Sites outside the frame count nothing.
    """
    check_mosaic(frame, "frame", min_size=8)
    h, w = frame.shape
    dev = frame.device
    sy = torch.arange(h, device=dev, dtype=torch.float32)[:, None].expand(h, w)  # (H, W)
    sx = torch.arange(w, device=dev, dtype=torch.float32)[None, :].expand(h, w)
    if pixels is not None:
        sy, sx = sy + pixels[0], sx + pixels[1]
    by, bx = torch.floor(sy), torch.floor(sx)
    sites = small(cfa_channels(cfa), dev).view(4)  # channel of site (y % 2) * 2 + x % 2
    flat = frame.to(torch.float32).reshape(-1)
    out = torch.zeros(6, h, w, dtype=torch.float32, device=dev)
    wanted = torch.arange(3, device=dev).view(3, 1, 1)
    inv = -0.5 / (sigma * sigma)
    for a in _RAW_MERGE_TAPS:
        p = by + a
        in_y = (p >= 0) & (p <= h - 1)
        pi = p.clamp(0, h - 1).to(torch.int64)
        ky = (p - sy).square()
        for b in _RAW_MERGE_TAPS:
            q = bx + b
            qi = q.clamp(0, w - 1).to(torch.int64)
            k = torch.exp((ky + (q - sx).square()) * inv) * (in_y & (q >= 0) & (q <= w - 1))  # (H, W)
            onehot = (sites[(pi % 2) * 2 + qi % 2][None] == wanted).to(torch.float32)  # (3, H, W)
            kc = onehot * k[None]
            out[:3] += kc * flat[pi * w + qi][None]
            out[3:] += kc
    return out


def accumulate_frames(reference: Tensor | _Reference, frames: Sequence[Tensor], params: MergeParams,
                      positions: Sequence[int] | None = None, raw_merge: bool = False,
                      shifts: Sequence[tuple[float, float]] | None = None, detail: bool = False) -> Tensor:
    """Align, warp and robustly accumulate ``frames`` onto the reference: (5, H, W) int64 fixed point
    [sum R, G, B, weight, sum of the warped Bayer mosaic] (the mosaic's CFA planes are warped by half the flow,
    bicubic, and weighted like the frame's RGB). With ``detail`` (9, H, W): the R, G, B sums hold each render's
    base, then the detail band's sums R, G, B and their weight (:func:`split_detail`, :func:`detail_share`;
    :func:`merged_rgb` puts them together). With ``raw_merge`` 6 more channels: :func:`raw_kernel_sums` of each
    frame's raw samples, times the frame's motion weight.

    ``positions``: each frame's index in the whole stack (default 0, 1, ...), which picks the orientation of its
    demosaic (see the module doc): a frame contributes the same sums whichever group it is merged in.
    A frame equal to the reference (``torch.equal``) is the reference: weight 1 everywhere, no alignment or
    resampling, but still demosaiced in its own position's orientation (frame 0's is the reference's demosaic): a
    noise-free static stack is then the orientations' ensemble, which beats one orientation (it rendered below the
    single frame, which averages two: 27.58 against 28.52 dB on a test chart, docs/QUALITY.md).
    The reference is not added implicitly: include it in exactly one group's ``frames``.
    ``shifts``: each frame's global shift (dy, dx) against the reference, measured once for the whole stack
    (:func:`services.pipeline.stack.frame_shifts`), the alignment's prior (:func:`~.align.align_frame`); None:
    none.

    Frames may hold values below black (negative: ``normalize_levels(..., clip_black=False)``): each frame's
    demosaic (and so the alignment and the motion test) sees them clipped to 0, as the package was trained and
    as a single frame renders, but the Bayer sums (and the raw-sample merge) add them unclipped. The mean of
    clipped samples stays lifted by a share of one frame's noise however many frames are averaged (at high
    noise several times the darkest greys' level, tinted by the white balance), and the renderer's pass over
    the merged mosaic, told 1/frames of the noise, kept that lift as signal; the mean of unclipped samples
    keeps the scene's level, and the renderer clips it at black (``stack._blend_bayer``) with the noise it is
    told.
    """
    ref = reference if isinstance(reference, _Reference) else prepare_reference(reference, params)
    positions = range(len(frames)) if positions is None else positions
    if len(positions) != len(frames) or min(positions, default=0) < 0:
        raise ValueError(f"need one stack position >= 0 per frame, got {list(positions)} for {len(frames)} frames")
    if shifts is not None and len(shifts) != len(frames):
        raise ValueError(f"need one shift per frame, got {len(shifts)} for {len(frames)} frames")
    priors: Sequence[tuple[float, float] | None] = [None] * len(frames) if shifts is None else shifts
    h, w = ref.mosaic.shape
    channels = 5 + DETAIL_CHANNELS * detail + RAW_MERGE_CHANNELS * raw_merge
    acc = torch.zeros(channels, h, w, dtype=torch.int64, device=ref.mosaic.device)
    for frame, position, prior in zip(frames, positions, priors, strict=True):
        f = frame.to(device=ref.mosaic.device, dtype=torch.float32)  # may hold values below black (< 0)
        check_mosaic(f, "frame", min_size=8)
        clipped = f.clamp(min=0.0)  # what the demosaic sees (a single frame's render clips at black too)
        if torch.equal(clipped, ref.mosaic):  # no motion, no noise to tell apart: weight 1, nothing resampled
            _add_reference(acc, ref, f, params, position, detail)
            continue
        _add_aligned(acc, ref, f, params, position, prior, detail)
    return acc


def _add_reference(acc: Tensor, ref: _Reference, frame: Tensor, params: MergeParams, position: int,
                   detail: bool) -> None:
    """Add a frame equal to the reference (:func:`accumulate_frames`): weight 1 and, with ``detail``, reliability 1
    (the reference's grid); demosaiced in its position's orientation."""
    orientation = position % len(ORIENTATIONS)
    rgb = ref.rgb if orientation == 0 else demosaic_camera(ref.mosaic, params, orientation)
    if detail:
        base, rest = split_detail(rgb)
        acc[:3] += _fixed(base)
        acc[5:8] += _fixed(rest)
        acc[8] += int(_ONE)
    else:
        acc[:3] += _fixed(rgb)
    acc[3] += int(_ONE)
    acc[4] += _fixed(frame)
    raw = 5 + DETAIL_CHANNELS * detail
    if acc.shape[0] > raw:  # the raw-sample merge
        acc[raw:] += _fixed(raw_kernel_sums(frame, None, params.cfa))


def _add_aligned(acc: Tensor, ref: _Reference, frame: Tensor, params: MergeParams, position: int,
                 prior: tuple[float, float] | None, detail: bool = False) -> None:
    """Add one frame other than the reference to ``acc`` (5|9|11|15, H, W) (:func:`accumulate_frames`): demosaiced
    in its position's orientation, aligned (``prior``: its global shift), warped and weighted by the motion test;
    with ``detail`` its render split into base and detail band."""
    h, w = ref.mosaic.shape
    rgb = demosaic_camera(frame.clamp(min=0.0), params, position % len(ORIENTATIONS))  # (3, H, W)
    if ref.refinement is None:  # once per group, for every frame aligned to it (pixel shift aligns none)
        ref.refinement = refinement_terms(ref.pyramid[0])
    flow = align_frame(ref.pyramid, rgb.mean(dim=0), params.align, prior, ref.refinement)  # (ny, nx, 2)
    # Resampling at fractional offsets is a low-pass that differs from frame to frame: bilinear cost up to 2.9 dB
    # of the 8-frame gain on detailed photographs; Lanczos-3, -4 and -5 (STRATA_STACK_WARP) keep more detail near the
    # finest scale than bicubic, the more lobes the more (a zone plate at random sub-pixel shifts; photo stacks,
    # docs/QUALITY.md); Lanczos-5 is the default (on a GPU a fused kernel, as quick as bicubic's grid_sample).
    pixels = tiles_to_pixels(flow, params.align.tile_size, (h, w))  # (2, H, W)
    moved, valid = warp(rgb, pixels, mode=params.rgb_warp)
    weight = motion_weights(ref.rgb, moved, valid.expand(3, h, w), params, level=ref.level,
                            spread=ref.spread) * valid  # (H, W)
    if detail:
        base, rest = split_detail(moved, valid)
        if ref.detail_ratio is None:  # once per group, like the refinement terms
            ref.detail_ratio = detail_noise_ratio(ref, params)
        trusted = weight * detail_share(warp_reliability(pixels), ref.detail_ratio)  # (H, W)
        acc[:3] += _fixed(base * weight)
        acc[5:8] += _fixed(rest * trusted)
        acc[8] += _fixed(trusted)
    else:
        acc[:3] += _fixed(moved * weight)
    acc[3] += _fixed(weight)
    bayer = join_sites(warp(split_sites(frame), pixels[:, ::2, ::2] / 2.0, mode="bicubic")[0])  # (H, W), sites kept
    acc[4] += _fixed(bayer * weight)
    raw = 5 + DETAIL_CHANNELS * detail
    if acc.shape[0] > raw:  # the raw-sample merge
        acc[raw:] += _fixed(raw_kernel_sums(frame, pixels, params.cfa) * weight)


def integer_shift(frame: Tensor, dy: int, dx: int) -> tuple[Tensor, Tensor]:
    """``out(y, x) = frame(y + dy, x + dx)`` for integer shifts: (H, W) values (0 outside) and validity."""
    h, w = frame.shape
    out = torch.zeros_like(frame)
    valid = torch.zeros_like(frame)
    ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
    src_y, src_x = slice(ys.start + dy, ys.stop + dy), slice(xs.start + dx, xs.stop + dx)
    out[ys, xs] = frame[src_y, src_x]
    valid[ys, xs] = 1.0
    return out, valid


def pixel_shift_accumulate(reference: Tensor | _Reference, frames: Sequence[Tensor], shifts: Sequence[tuple[int, int]],
                           params: MergeParams) -> Tensor:
    """Pixel-shift combine of frames at whole one-pixel ``shifts``: (6, H, W) int64 fixed point
    [sum R, G, B, weight R, G, B].

    Each frame, moved by its integer shift, gives one sample per site of the colour its sensor site had there;
    a sample enters with the weight of the :func:`motion_weights` test of the frame's samples against the
    reference's demosaiced image. A frame equal to the reference adds its own samples with weight 1 and its
    demosaiced value for the other two channels with a tiny weight, so a site/channel that no other frame
    measured (or where all of them moved) falls back to the reference's demosaiced value.
    """
    ref = reference if isinstance(reference, _Reference) else prepare_reference(reference, params)
    h, w = ref.mosaic.shape
    if len(frames) != len(shifts):
        raise ValueError(f"need one shift per frame, got {len(frames)} frames and {len(shifts)} shifts")
    masks = cfa_masks(params.cfa, h + 4, w + 4, ref.mosaic.device)  # (3, H+4, W+4): index i is site i - 2
    acc = torch.zeros(6, h, w, dtype=torch.int64, device=ref.mosaic.device)  # (6, H, W)
    for frame, (dy, dx) in zip(frames, shifts, strict=True):
        f = frame.to(device=ref.mosaic.device, dtype=torch.float32).clamp(min=0.0)  # samples clipped at black
        check_mosaic(f, "frame", min_size=8)
        if torch.equal(f, ref.mosaic):
            own = masks[:, 2 : 2 + h, 2 : 2 + w]  # (3, H, W)
            acc[:3] += _fixed(own * f + (1.0 - own) * ref.rgb * _FALLBACK_WEIGHT)
            acc[3:] += _fixed(own + (1.0 - own) * _FALLBACK_WEIGHT)
            continue
        if abs(dy) > 1 or abs(dx) > 1:
            raise ValueError(f"pixel-shift offsets must be within one pixel, got {(dy, dx)}")
        moved, valid = integer_shift(f, dy, dx)  # (H, W) each
        colour = masks[:, 2 + dy : 2 + dy + h, 2 + dx : 2 + dx + w] * valid  # (3, H, W) frame's colour per site
        weight = motion_weights(ref.rgb, moved * colour, colour, params, local_range=True, level=ref.level,
                                spread=ref.spread)
        acc[:3] += _fixed(colour * moved * weight)
        acc[3:] += _fixed(colour * weight)
    return acc
