"""Shard-level rendering of single frames used by the GPU workers: numpy mosaic in, 16-bit sRGB numpy out
(stacks: :mod:`services.pipeline.stack`).

Order: normalise levels -> white balance -> enhance (the shot's model package: joint demosaic + denoise) ->
unsharp mask -> camera -> output-space matrix -> the space's transfer function -> uint16. A linear DNG's
(H, W, 3) camera-RGB image skips the demosaic (:func:`render_linear_spaces`): levels -> white balance ->
Lee denoise at the shot's noise -> unsharp mask -> the same colour and transfer. Every stage computes
a pixel from a bounded neighbourhood (the package declares its receptive field), so a strip rendered with
:func:`halo_rows` extra rows on each side equals the same rows of the whole-frame render.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from services.pipeline.models import halo_rows as radius_halo
from services.pipeline.models import load_enhancer, package_manifest
from services.pipeline.models.base import ENSEMBLE_SIZES
from services.pipeline.ops import (
    apply_matrix,
    cfa_channels,
    clip_highlights,
    denoise_lee,
    encode_transfer,
    normalize_levels,
    normalize_linear,
    sharpen,
    sharpen_radius,
    to_uint16,
    white_balance,
    white_balance_rgb,
)
from services.pipeline.ops._checks import small
from services.pipeline.transfer import download, upload
from services.raw.meta import LAYOUT_BAYER, LAYOUT_LINEAR, LAYOUTS

SHARPEN_SIGMA = 1.0
# A linear DNG's denoise: the Lee filter's window radius (the classical package's, a 5x5 window).
LINEAR_DENOISE_RADIUS = 2
# The unsharp amount after it (RenderParams.sharpen_amount of a linear shot; docs/QUALITY.md, "Linear DNGs").
LINEAR_SHARPEN = 0.0


def halo_rows(params: RenderParams, extra: int = 0) -> int:
    """Rows a strip reads beyond each cut: the package's receptive field (a linear image's: the Lee filter's
    radius) + the sharpen radius (+ ``extra``, a stack's blend window), rounded up to even (keeps CFA parity).
    Also covers fused stacks (the Lee filter's radius is below any package's)."""
    if params.layout == LAYOUT_LINEAR:
        return radius_halo(LINEAR_DENOISE_RADIUS, sharpen_radius(SHARPEN_SIGMA) + extra)
    return package_manifest(params.model).halo_rows(sharpen_radius(SHARPEN_SIGMA) + extra)


@dataclass(frozen=True)
class SpaceColour:
    """One more output space a shot is rendered to (beside its primary one): the white-balanced camera RGB ->
    linear ``space`` matrix and the space's transfer function. Applied after the model, pointwise."""

    space: str
    rgb_cam: tuple[tuple[float, ...], ...]
    transfer: str

    def to_dict(self) -> dict[str, Any]:
        return {"space": self.space, "rgb_cam": [list(row) for row in self.rgb_cam], "transfer": self.transfer}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpaceColour:
        return cls(space=str(d["space"]), rgb_cam=tuple(tuple(float(v) for v in row) for row in d["rgb_cam"]),
                   transfer=str(d["transfer"]))


@dataclass(frozen=True)
class RenderParams:
    """Everything a shard needs to render, shared by all shards of a shot (JSON-able via :meth:`to_dict`).

    ``layout`` "linear" (a linear DNG): ``cfa`` is "", ``black`` holds R, G, B, G and ``model`` is not run
    (the image is denoised with the Lee filter, :func:`render_linear_spaces`)."""

    cfa: str
    black: tuple[float, float, float, float]  # per 2x2 CFA site, row-major (linear: R, G, B, G)
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
    space: str = "srgb"  # the primary output space (rgb_cam, transfer): the strips' main result
    extra_spaces: tuple[SpaceColour, ...] = ()  # further spaces, each a result of its own (same model pass)
    layout: str = LAYOUT_BAYER  # "bayer" (a mosaic) or "linear" (a linear DNG's RGB image)
    # Sub-pixel stacks: also merge the frames' raw samples per colour onto the output grid (multi-frame
    # demosaicking, services.pipeline.stack); set once per job by the coordinator (STRATA_STACK_RAW_MERGE)
    raw_merge: bool = False
    # Sub-pixel stacks: each frame's render split into a base, averaged over every frame, and a detail band averaged
    # with each frame's warp reliability (services.pipeline.ops.merge.split_detail); STRATA_STACK_DETAIL_BAND
    detail_band: bool = True
    # The model's self-ensemble (Enhancer.enhance): 1, or 2 / 4 / 8 orientations averaged (the `max` tier) for
    # single frames; stacks' frames are averaged across orientations already and render with 1
    orientations: int = 1
    # The package a stack's frames' model pass uses ("": ``model``); chosen once per shot (models.frames_package)
    frames_model: str = ""
    # A stack's frames' global shifts (dy, dx) against frame 0, px, measured once at ingest (stack.frame_shifts): the
    # priors of their tile alignment (ops.align.align_frame); () = not measured (older plans: no prior)
    shifts: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == LAYOUT_BAYER or self.cfa:
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
        if self.orientations not in ENSEMBLE_SIZES:
            raise ValueError(f"orientations must be one of {ENSEMBLE_SIZES}, got {self.orientations}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        d = asdict(self)
        d["black"] = list(self.black)
        d["gains"] = list(self.gains)
        d["rgb_cam"] = [list(row) for row in self.rgb_cam]
        d["extra_spaces"] = [s.to_dict() for s in self.extra_spaces]
        d["shifts"] = [list(v) for v in self.shifts]
        return d

    @property
    def spaces(self) -> tuple[str, ...]:
        """Every output space rendered, primary first: the order of :func:`encode_spaces`' results."""
        return (self.space, *(s.space for s in self.extra_spaces))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RenderParams:
        """Inverse of :meth:`to_dict`; the optional keys may be missing (older rows)."""
        optional: dict[str, Any] = {k: type(getattr(cls, k))(d[k])
                                    for k in ("sharpen_amount", "transfer", "camera", "model", "frames", "layout",
                                              "raw_merge", "detail_band", "orientations", "frames_model")
                                    if k in d}
        return cls(
            cfa=str(d["cfa"]),
            black=tuple(float(v) for v in d["black"]),  # type: ignore[arg-type]
            white=float(d["white"]),
            gains=tuple(float(v) for v in d["gains"]),  # type: ignore[arg-type]
            rgb_cam=tuple(tuple(float(v) for v in row) for row in d["rgb_cam"]),
            noise_shot=float(d["noise_shot"]),
            noise_read=float(d["noise_read"]),
            space=str(d.get("space", d.get("transfer", "srgb"))),  # older rows: the transfer names its space
            extra_spaces=tuple(SpaceColour.from_dict(s) for s in d.get("extra_spaces", ())),
            shifts=tuple((float(dy), float(dx)) for dy, dx in d.get("shifts", ())),
            **optional,
        )


def noise_per_channel(params: RenderParams) -> tuple[list[float], list[float]]:
    """White-balanced noise model per channel: ``g * shot`` and ``g^2 * read`` (the package applies any
    demosaic-specific scaling itself)."""
    return [g * params.noise_shot for g in params.gains], [g * g * params.noise_read for g in params.gains]


def mosaic_tensor(mosaic: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host (H, W) array -> device tensor, keeping uint16 narrow across the bus (pinned staging on CUDA)."""
    if mosaic.dtype == np.uint16:
        return upload(mosaic, device).to(torch.int32)  # int32: uint16 has few kernels
    arr = np.ascontiguousarray(mosaic)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy()).to(device)


# A strip's rows on the device, per output space -> the row ranges still to download (None: all of them).
OnDevice = Callable[[int, torch.Tensor], Sequence[tuple[int, int]] | None]


@dataclass(frozen=True)
class RowsOut:
    """Where a strip's rows go: rows ``[top, bottom)`` of the rendered (halo'd) image, downloaded through the
    pinned staging slots straight into ``into`` (one C-contiguous (bottom - top, W, 3) uint16 array per output
    space, e.g. the memory maps a shard publishes), after ``ready()`` (a prefault's wait) returns.
    ``on_device(space, rows)``: called with each space's rows while they are still on the device, before their
    download (a worker compresses TIFF tiles from them: no second upload); it may return the row ranges
    ``[(a, b), ...]`` of ``into`` still wanted (a lean strip, :func:`services.pipeline.shards.kept_rows`): only
    those are downloaded, the rest of ``into`` is left as it is."""

    top: int
    bottom: int
    into: Sequence[np.ndarray] | None = None
    ready: Callable[[], object] | None = None
    on_device: OnDevice | None = None


def encode_spaces(rgb: torch.Tensor, params: RenderParams, rows: RowsOut | None = None) -> list[np.ndarray]:
    """(1, 3, H, W) linear white-balanced camera RGB -> one (H, W, 3) uint16 image per output space
    (:attr:`RenderParams.spaces` order): matrix, transfer function, codes. The primary one is computed exactly
    as a single-space render computes it. ``rows``: only those rows leave the device, into those arrays."""
    out = []
    rgb = clip_highlights(rgb, params.gains)  # blown highlights white in every space
    for i, (rgb_cam, transfer) in enumerate(((params.rgb_cam, params.transfer),
                                             *((s.rgb_cam, s.transfer) for s in params.extra_spaces))):
        lin = apply_matrix(rgb, rgb_cam)  # (1, 3, H, W) linear output RGB
        codes = to_uint16(encode_transfer(lin, transfer))[0].permute(1, 2, 0)  # (H, W, 3)
        if rows is None:
            out.append(codes.contiguous().cpu().numpy())
            continue
        codes = codes[rows.top : rows.bottom].contiguous()  # the strip's own rows, cropped on the device
        wanted = rows.on_device(i, codes) if rows.on_device is not None else None
        if rows.into is None:
            out.append(codes.cpu().numpy())
            continue
        if i == 0 and rows.ready is not None:
            rows.ready()
        if wanted is None:
            out.append(download(codes, rows.into[i]))
            continue
        for a, b in wanted:
            download(codes[a:b], rows.into[i][a:b])
        out.append(rows.into[i])
    return out


def render_mosaic(mosaic: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
                  normalized: bool = False) -> np.ndarray:
    """Render a (H, W) Bayer mosaic to (H, W, 3) uint16 in the primary output space (see
    :func:`render_mosaic_spaces`)."""
    return render_mosaic_spaces(mosaic, replace(params, extra_spaces=()), device, normalized)[0]


@torch.inference_mode()
def render_mosaic_spaces(mosaic: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
                         normalized: bool = False, rows: RowsOut | None = None) -> list[np.ndarray]:
    """Render a (H, W) Bayer mosaic to one (H, W, 3) uint16 image per output space (primary first).

    ``mosaic`` is raw counts (uint16, levels from ``params``) or, with ``normalized=True``, float values
    already in [0, 1] (e.g. a merged stack). Row 0 and column 0 must be CFA phase (0, 0). A linear shot's
    (H, W, 3) image goes to :func:`render_linear_spaces`.
    """
    if params.layout == LAYOUT_LINEAR:
        return render_linear_spaces(mosaic, params, device, rows)
    if mosaic.ndim != 2:
        raise ValueError(f"mosaic must be (H, W), got {mosaic.shape}")
    dev = torch.device(device)
    x = mosaic_tensor(mosaic, dev)  # (H, W)
    # (H, W) float32 in [0, 1]
    x = x.to(torch.float32) if normalized else normalize_levels(x, params.black, params.white)
    x = white_balance(x[None, None], params.gains, params.cfa)  # (1, 1, H, W)
    enhancer = load_enhancer(params.camera, dev, package=params.model)  # resident after the first call
    shot, read = noise_per_channel(params)
    rgb = enhancer.enhance(x, params.cfa, shot, read, params.orientations)
    rgb = sharpen(rgb, params.sharpen_amount, SHARPEN_SIGMA)  # (1, 3, H, W) linear WB camera RGB
    return encode_spaces(rgb, params, rows)


@torch.inference_mode()
def render_linear_spaces(image: np.ndarray, params: RenderParams, device: torch.device | str = "cpu",
                         rows: RowsOut | None = None) -> list[np.ndarray]:
    """Render a linear DNG's (H, W, 3) raw camera-RGB image (counts, levels from ``params``) to one (H, W, 3)
    uint16 image per output space (primary first), without demosaicing: levels -> white balance -> Lee denoise
    at the shot's noise (radius :data:`LINEAR_DENOISE_RADIUS`) -> unsharp mask -> matrix -> transfer."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"a linear image must be (H, W, 3), got {image.shape}")
    dev = torch.device(device)
    x = upload(np.ascontiguousarray(image), dev) if image.dtype == np.uint16 else \
        torch.from_numpy(np.array(image, dtype=np.float32)).to(dev)  # (H, W, 3)
    rgb = white_balance_rgb(normalize_linear(x, params.black, params.white), params.gains)  # (1, 3, H, W)
    shot, read = noise_per_channel(params)
    rgb = denoise_lee(rgb, small(shot, dev), small(read, dev),
                      radius=LINEAR_DENOISE_RADIUS)
    rgb = sharpen(rgb, params.sharpen_amount, SHARPEN_SIGMA)  # (1, 3, H, W) linear WB camera RGB
    return encode_spaces(rgb, params, rows)


def check_strip(y0: int, y1: int, height: int) -> None:
    """A strip is a non-empty row range inside the frame starting on an even row (keeps the CFA phase)."""
    if not 0 <= y0 < y1 <= height:
        raise ValueError(f"strip rows [{y0}, {y1}) must be a non-empty range inside 0..{height}")
    if y0 % 2:
        raise ValueError(f"strip must start on an even row (CFA parity), got y0={y0}")


def render_strip(source: np.ndarray, y0: int, y1: int, params: RenderParams,
                 device: torch.device | str = "cpu", normalized: bool = False) -> np.ndarray:
    """Rows [y0, y1) in the primary output space (:func:`render_strip_spaces`)."""
    return render_strip_spaces(source, y0, y1, replace(params, extra_spaces=()), device, normalized)[0]


def render_strip_spaces(source: np.ndarray, y0: int, y1: int, params: RenderParams,
                        device: torch.device | str = "cpu", normalized: bool = False,
                        into: Sequence[np.ndarray] | None = None, ready: Callable[[], object] | None = None,
                        on_device: OnDevice | None = None) -> list[np.ndarray]:
    """Render rows [y0, y1) of the full (H, W) mosaic ``source`` (may be a ``np.memmap``): one (y1 - y0, W, 3)
    uint16 array per output space (primary first), from one model pass.

    Reads only rows [y0 - halo, y1 + halo) clipped to the frame, so stitched strips equal the whole-frame
    render. ``y0`` must be even so the strip keeps the frame's CFA phase. (Stacks render their strips from the
    group accumulators: ``services.pipeline.stack.render_stack_strip``.) ``into``: one (y1 - y0, W, 3) uint16
    C-contiguous array per space (e.g. memory maps) the rows are downloaded into, after ``ready()``; returned.
    ``on_device``: see :class:`RowsOut`.
    """
    if source.ndim != (3 if params.layout == LAYOUT_LINEAR else 2):
        raise ValueError(f"source must be a (H, W) mosaic or a linear shot's (H, W, 3) image, got {source.shape}")
    check_strip(y0, y1, source.shape[0])
    top, bottom = rows_needed(y0, y1, source.shape[0], params)
    return render_mosaic_spaces(np.asarray(source[top:bottom]), params, device, normalized,
                                RowsOut(y0 - top, y1 - top, into, ready, on_device))


def rows_needed(y0: int, y1: int, height: int, params: RenderParams, extra: int = 0) -> tuple[int, int]:
    """The source rows [top, bottom) that :func:`render_strip` reads for output rows [y0, y1) (``extra``: see
    :func:`halo_rows`)."""
    halo = halo_rows(params, extra)
    return max(0, y0 - halo), min(height, y1 + halo)


__all__ = [
    "LINEAR_DENOISE_RADIUS",
    "LINEAR_SHARPEN",
    "SHARPEN_SIGMA",
    "RenderParams",
    "SpaceColour",
    "check_strip",
    "encode_spaces",
    "halo_rows",
    "mosaic_tensor",
    "noise_per_channel",
    "render_mosaic",
    "render_linear_spaces",
    "render_mosaic_spaces",
    "render_strip",
    "render_strip_spaces",
    "rows_needed",
]
