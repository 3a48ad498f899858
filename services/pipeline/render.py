"""Shard-level rendering used by the GPU workers: numpy mosaic in, 16-bit sRGB numpy out.

Order: normalise levels -> white balance -> enhance (the shot's model package: joint demosaic + denoise) ->
unsharp mask -> camera -> output-space matrix -> the space's transfer function -> uint16. Every stage computes
a pixel from a bounded neighbourhood (the package declares its receptive field), so a strip rendered with
:func:`halo_rows` extra rows on each side equals the same rows of the whole-frame render.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from services.pipeline.models import load_enhancer, package_manifest
from services.pipeline.ops import (
    apply_matrix,
    cfa_channels,
    cfa_masks,
    denoise_lee,
    encode_transfer,
    normalize_levels,
    sharpen,
    sharpen_radius,
    to_uint16,
    white_balance,
)
from services.pipeline.ops.filters import box_mean
from services.pipeline.transfer import upload

SHARPEN_SIGMA = 1.0


def halo_rows(params: RenderParams, extra: int = 0) -> int:
    """Rows a strip reads beyond each cut: the package's receptive field + the sharpen radius (+ ``extra``, a
    stack's blend window), rounded up to even (keeps CFA parity). Also covers fused stacks (the Lee filter's
    radius is below any package's)."""
    return package_manifest(params.model).halo_rows(sharpen_radius(SHARPEN_SIGMA) + extra)


@dataclass(frozen=True)
class RenderParams:
    """Everything a shard needs to render, shared by all shards of a shot (JSON-able via :meth:`to_dict`)."""

    cfa: str
    black: tuple[float, float, float, float]  # per 2x2 CFA site, row-major
    white: float
    gains: tuple[float, float, float]  # white-balance gains R, G, B
    rgb_cam: tuple[tuple[float, ...], ...]  # 3x3 white-balanced camera RGB -> linear sRGB
    noise_shot: float  # noise variance = shot * signal + read, normalised mosaic units
    noise_read: float
    sharpen_amount: float = 0.5
    transfer: str = "srgb"  # the output space's transfer function (see ops.colour.encode_transfer)
    camera: str = "IQ3_S"
    model: str = "classical_v1.strata"  # chosen once per shot at ingest: every shard uses the same package
    frames: int = 1  # frames the image stands for (a stack's size): its Bayer path is told 1/frames of the noise

    def __post_init__(self) -> None:
        cfa_channels(self.cfa)
        if len(self.black) != 4:
            raise ValueError(f"black must hold 4 values, got {len(self.black)}")
        if len(self.gains) != 3 or min(self.gains) <= 0:
            raise ValueError(f"gains must be 3 positive values, got {self.gains}")
        if np.asarray(self.rgb_cam).shape != (3, 3):
            raise ValueError(f"rgb_cam must be 3x3, got shape {np.asarray(self.rgb_cam).shape}")
        if any(b >= self.white for b in self.black):
            raise ValueError(f"white {self.white} must exceed every black level {self.black}")
        if self.noise_shot < 0 or self.noise_read < 0:
            raise ValueError(f"noise must be >= 0, got shot={self.noise_shot} read={self.noise_read}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        d = asdict(self)
        d["black"] = list(self.black)
        d["gains"] = list(self.gains)
        d["rgb_cam"] = [list(row) for row in self.rgb_cam]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RenderParams:
        """Inverse of :meth:`to_dict`; the optional keys may be missing (older rows)."""
        optional: dict[str, Any] = {k: type(getattr(cls, k))(d[k])
                                    for k in ("sharpen_amount", "transfer", "camera", "model", "frames") if k in d}
        return cls(
            cfa=str(d["cfa"]),
            black=tuple(float(v) for v in d["black"]),  # type: ignore[arg-type]
            white=float(d["white"]),
            gains=tuple(float(v) for v in d["gains"]),  # type: ignore[arg-type]
            rgb_cam=tuple(tuple(float(v) for v in row) for row in d["rgb_cam"]),
            noise_shot=float(d["noise_shot"]),
            noise_read=float(d["noise_read"]),
            **optional,
        )


def _noise_per_channel(params: RenderParams) -> tuple[list[float], list[float]]:
    """White-balanced noise model per channel: ``g * shot`` and ``g^2 * read`` (the package applies any
    demosaic-specific scaling itself)."""
    return [g * params.noise_shot for g in params.gains], [g * g * params.noise_read for g in params.gains]


def mosaic_tensor(mosaic: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host (H, W) array -> device tensor, keeping uint16 narrow across the bus (pinned staging on CUDA)."""
    if mosaic.dtype == np.uint16:
        return upload(mosaic, device).to(torch.int32)  # int32: uint16 has few kernels
    arr = np.ascontiguousarray(mosaic)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy()).to(device)


@torch.inference_mode()
def render_mosaic(mosaic: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
                  normalized: bool = False) -> np.ndarray:
    """Render a (H, W) Bayer mosaic to (H, W, 3) uint16 sRGB-encoded.

    ``mosaic`` is raw counts (uint16, levels from ``params``) or, with ``normalized=True``, float values
    already in [0, 1] (e.g. a merged stack). Row 0 and column 0 must be CFA phase (0, 0).
    """
    if mosaic.ndim != 2:
        raise ValueError(f"mosaic must be (H, W), got {mosaic.shape}")
    dev = torch.device(device)
    x = mosaic_tensor(mosaic, dev)  # (H, W)
    # (H, W) float32 in [0, 1]
    x = x.to(torch.float32) if normalized else normalize_levels(x, params.black, params.white)
    x = white_balance(x[None, None], params.gains, params.cfa)  # (1, 1, H, W)
    enhancer = load_enhancer(params.camera, dev, package=params.model)  # resident after the first call
    shot, read = _noise_per_channel(params)
    rgb = enhancer.enhance(x, params.cfa, shot, read)
    rgb = sharpen(rgb, params.sharpen_amount, SHARPEN_SIGMA)  # (1, 3, H, W) linear WB camera RGB
    rgb = apply_matrix(rgb, params.rgb_cam)  # (1, 3, H, W) linear sRGB
    out = to_uint16(encode_transfer(rgb, params.transfer))[0].permute(1, 2, 0)  # (H, W, 3)
    return out.contiguous().cpu().numpy()


RGB_DENOISE_RADIUS = 2
# Fused stack: camera RGB + 1 merge weight + the merged Bayer mosaic (sub-pixel) or + 3 weights (pixel shift).
FUSED_CHANNELS = (5, 6)
# Sub-pixel stacks are rendered twice and blended (render_fused): A, the fused camera RGB (frames demosaiced one by
# one) through a light Lee filter; B, the fused Bayer mosaic (frames' CFA planes warped onto the reference, averaged)
# through the package at 1/frames of the noise. Their errors are partly independent, so where they agree their
# mean beats either; B's share falls from 1/2 where their local squared difference (window radius BLEND_RADIUS) is
# 0 to nothing at BLEND_TOLERANCE times the modelled noise variance of the average (B aliases on fine detail: half-
# resolution CFA planes cannot be resampled without it). Stack benchmark, CPU, scale 0.1, mid noise, 8 frames:
# dead leaves +6.03 -> +6.56 dB, five held-out photographs +0.04..+0.88 dB, none worse (docs/QUALITY.md).
BLEND_RADIUS = 2
BLEND_TOLERANCE = 3.0
# Pixel shift: the fused image is re-mosaicked at the four CFA phases, each mosaic enhanced by the package and
# the four estimates averaged. Each holds a quarter of the samples and their errors partly cancel in the
# average, so each is told this share of the fused noise (measured on the stack benchmark, CPU, scale 0.1,
# mid noise: 0.7 -> +4.1 dB, 1.0 -> +3.7 dB over the single-frame render; the classical filter: -2.9 dB).
PIXEL_SHIFT_NOISE_SHARE = 0.75
_PHASES = ("RGGB", "GRBG", "GBRG", "BGGR")


def _remosaic_enhance(x: torch.Tensor, params: RenderParams, shot: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """(1, 3, H, W) full-RGB white-balanced image -> the mean of the package's output on its four CFA-phase
    mosaics (each pixel keeps the channel the phase samples there)."""
    enhancer = load_enhancer(params.camera, x.device, package=params.model)
    out = torch.zeros_like(x)
    for cfa in _PHASES:
        mosaic = (x * cfa_masks(cfa, x.shape[-2], x.shape[-1], x.device)).sum(dim=1, keepdim=True)  # (1, 1, H, W)
        out += enhancer.enhance(mosaic, cfa, shot, read)
    return out / len(_PHASES)


def _blend_bayer(a: torch.Tensor, bayer: torch.Tensor, params: RenderParams) -> torch.Tensor:
    """Blend the sharpened RGB path ``a`` (1, 3, H, W) with the package's render of the fused Bayer mosaic
    (1, 1, H, W, normalised camera values) where the two agree (see :data:`BLEND_TOLERANCE`)."""
    dev = a.device
    shot, read = (torch.tensor(v, dtype=torch.float32, device=dev) / params.frames for v in _noise_per_channel(params))
    enhancer = load_enhancer(params.camera, dev, package=params.model)
    b = enhancer.enhance(white_balance(bayer, params.gains, params.cfa), params.cfa, shot, read)
    b = sharpen(b, params.sharpen_amount, SHARPEN_SIGMA)  # (1, 3, H, W)
    spread = box_mean((b - a).square().sum(dim=1, keepdim=True), BLEND_RADIUS)  # (1, 1, H, W)
    noise = (shot.view(1, 3, 1, 1) * a.clamp(min=0.0) + read.view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
    share = 0.5 * (1.0 - spread / (BLEND_TOLERANCE * noise).clamp(min=1e-12)).clamp(0.0, 1.0)
    return a + share * (b - a)


@torch.inference_mode()
def render_fused(fused: torch.Tensor, params: RenderParams,
                 noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Render a fused stack (1, 5|6, H, W) float32 on its device to (H, W, 3) uint16: camera RGB in [0, 1], the
    merge weight of each pixel in frames and the merged Bayer mosaic (sub-pixel stacks), or R, G, B weights
    (pixel shift).

    White balance -> denoise -> sharpen -> colour -> the output transfer. ``noise_factors`` scale the shot's
    per-sample noise model per channel (see ``services.pipeline.stack.stack_noise_factors``). Sub-pixel stacks
    (5 channels): the Lee filter at that noise over each pixel's merge weight (fewer frames where motion was
    rejected, so more smoothing there), blended with the package's render of the merged Bayer mosaic where the
    two agree (:data:`BLEND_TOLERANCE`). Pixel shift (6 channels): the package on the four re-mosaicked phases
    (:data:`PIXEL_SHIFT_NOISE_SHARE`).
    """
    if fused.ndim != 4 or fused.shape[0] != 1 or fused.shape[1] not in FUSED_CHANNELS:
        raise ValueError(f"fused stack must be (1, 5|6, H, W): RGB + merge weights (+ Bayer), got "
                         f"{tuple(fused.shape)}")
    dev = fused.device
    gains = torch.tensor(params.gains, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
    pixel_shift = fused.shape[1] == 6
    x, weight = fused[:, :3].float() * gains, fused[:, 3:6 if pixel_shift else 4].float()
    factors = torch.tensor(noise_factors, dtype=torch.float32, device=dev)  # (3,)
    shot, read = (torch.tensor(v, dtype=torch.float32, device=dev) * factors for v in _noise_per_channel(params))
    if pixel_shift:
        x = _remosaic_enhance(x, params, shot * PIXEL_SHIFT_NOISE_SHARE, read * PIXEL_SHIFT_NOISE_SHARE)
        x = sharpen(x, params.sharpen_amount, SHARPEN_SIGMA)
    else:
        x = denoise_lee(x, shot, read, radius=RGB_DENOISE_RADIUS, noise_scale=1.0 / weight.clamp(min=1.0))
        x = _blend_bayer(sharpen(x, params.sharpen_amount, SHARPEN_SIGMA), fused[:, 4:5].float(), params)
    x = apply_matrix(x, params.rgb_cam)  # (1, 3, H, W) linear output RGB
    return to_uint16(encode_transfer(x, params.transfer))[0].permute(1, 2, 0).contiguous().cpu().numpy()


def render_rgb(fused: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
               noise_factors: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Render a whole fused stack (5|6, H, W) float32 (``services.pipeline.stack.fuse_groups``) to (H, W, 3)
    uint16; see :func:`render_fused`."""
    if fused.ndim != 3 or fused.shape[0] not in FUSED_CHANNELS:
        raise ValueError(f"fused stack must be (5|6, H, W): RGB + merge weights (+ Bayer), got {fused.shape}")
    x = torch.from_numpy(np.ascontiguousarray(fused, dtype=np.float32)).to(torch.device(device))[None]
    return render_fused(x, params, noise_factors)


def check_strip(y0: int, y1: int, height: int) -> None:
    """A strip is a non-empty row range inside the frame starting on an even row (keeps the CFA phase)."""
    if not 0 <= y0 < y1 <= height:
        raise ValueError(f"strip rows [{y0}, {y1}) must be a non-empty range inside 0..{height}")
    if y0 % 2:
        raise ValueError(f"strip must start on an even row (CFA parity), got y0={y0}")


def render_strip(source: np.ndarray, y0: int, y1: int, params: RenderParams,
                 device: torch.device | str = "cpu", normalized: bool = False) -> np.ndarray:
    """Render rows [y0, y1) of the full (H, W) mosaic ``source`` (may be a ``np.memmap``): (y1 - y0, W, 3) uint16.

    Reads only rows [y0 - halo, y1 + halo) clipped to the frame, so stitched strips equal the whole-frame
    render. ``y0`` must be even so the strip keeps the frame's CFA phase. (Stacks render their strips from the
    group accumulators: ``services.pipeline.stack.render_stack_strip``.)
    """
    if source.ndim != 2:
        raise ValueError(f"source must be a (H, W) mosaic, got {source.shape}")
    check_strip(y0, y1, source.shape[0])
    top, bottom = rows_needed(y0, y1, source.shape[0], params)
    return render_mosaic(np.asarray(source[top:bottom]), params, device, normalized)[y0 - top : y1 - top]


def rows_needed(y0: int, y1: int, height: int, params: RenderParams, extra: int = 0) -> tuple[int, int]:
    """The source rows [top, bottom) that :func:`render_strip` reads for output rows [y0, y1) (``extra``: see
    :func:`halo_rows`)."""
    halo = halo_rows(params, extra)
    return max(0, y0 - halo), min(height, y1 + halo)


__all__ = [
    "BLEND_RADIUS",
    "BLEND_TOLERANCE",
    "FUSED_CHANNELS",
    "RenderParams",
    "check_strip",
    "halo_rows",
    "mosaic_tensor",
    "render_fused",
    "render_mosaic",
    "render_rgb",
    "render_strip",
    "rows_needed",
]
