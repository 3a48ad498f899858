"""Synthetic Phase One shots (DNG frames + ground truth) for tests and benchmarks; no downloads.

Content (``content=``): ``"dead_leaves"`` (default: opaque anti-aliased discs, radii ~ r^-3, over a smooth
colour gradient, blurred with a Gaussian (sigma 1 px), linear sRGB within [0, 0.9]), a photograph
(``"photo:NNN"`` from ``../shared/data/photos``, ``"skimage:NAME"`` or an image path). Photographs are resampled
in linear light with Lanczos to the frame size, enlarging at most 2x; beyond that (e.g. 80 MP) the 2x image is
mirror-tiled, which keeps native detail instead of inventing a blurry enlargement. Each frame is unprocessed
with :mod:`lab.synth.unprocess` against the DNG colour model of the profile written into the file
(ColorMatrix1 D65 + ColorMatrix2 StdA + ForwardMatrix1/2, as-shot white D65 by default), mosaicked in the
requested CFA phase, scaled to 16-bit raw and given Poisson-Gaussian noise (a named level or a shot value).

Shift convention: frame ``k`` with shift ``(dy, dx)`` satisfies ``frame_k(y, x) = frame_0(y - dy, x - dx)``,
i.e. a feature at ``(y, x)`` in frame 0 appears at ``(y + dy, x + dx)`` in frame k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tifffile
import torch

from lab.synth import scenes as test_scenes
from lab.synth import unprocess as up
from services.pipeline.ops.colour import encode_transfer
from services.raw.colour import (
    WHITE_D65,
    CameraProfile,
    as_shot_neutral,
    camera_rgb_matrix,
    output_space,
    srgb_decode,
    xyz_d50_to_output_matrix,
)
from services.raw.dng import write_dng, write_linear_dng
from services.raw.meta import CFA_PATTERNS, CaptureInfo, NoiseProfile

CAMERAS: dict[str, tuple[int, int]] = {"IQ3_S": (7728, 10304), "IQ2_XS": (6912, 7296)}  # (width, height)
MAKE = "Phase One"

# ColorMatrix1 (XYZ -> camera, D65) of the Phase One P 65+ back, from the Adobe DNG Converter table as
# published in dcraw's adobe_coeff; rows are not normalised. The camera-from-sRGB matrix it implies is
# positive, so every linear sRGB colour in [0, 1] maps to camera values in [0, 1] (no clipping at D65).
COLOR_MATRIX = up.COLOR_MATRIX_D65
BLACK_LEVEL = 1024
WHITE_LEVEL = 65535
READ_NOISE_FACTOR = 0.5  # legacy (stack_synth): read variance = READ_NOISE_FACTOR * noise**2
_CHUNK_ROWS = 1024  # rows unprocessed at a time (even: keeps the CFA phase), bounds memory at 80 MP
_MAX_PHOTO_ENLARGEMENT = 2.0
BLUR_SIGMA = 1.0
_BLUR_RADIUS = 4  # taps either side; also the canvas margin, so the blur never sees padding
_MAX_DISCS = 40000
_COVERAGE = 5.0  # mean number of discs over a point: about e^-5 of the background stays visible
_CFA_CHANNEL = {"R": 0, "G": 1, "B": 2}


@dataclass
class SynthShot:
    """Files of one synthetic shot; ``shifts[k]`` is the (dy, dx) of frame k relative to frame 0 in pixels."""

    files: list[Path]
    ground_truth: Path
    shifts: list[tuple[float, float]]


@dataclass(frozen=True)
class _Scene:
    """Resolution-independent-ish scene description in pixel units of frame 0."""

    centres: np.ndarray  # [n, 2] (y, x)
    radii: np.ndarray  # [n]
    colours: np.ndarray  # [n, 3] linear sRGB
    gradient: np.ndarray  # [3, 3] per channel: (offset, y slope, x slope) over the normalised frame
    height: int
    width: int


def shot_size(camera: str, scale: float) -> tuple[int, int]:
    """(width, height) of a synthetic frame: the camera size times ``scale``, rounded down to even."""
    if camera not in CAMERAS:
        raise ValueError(f"unknown camera {camera!r}; expected one of {sorted(CAMERAS)}")
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    w, h = CAMERAS[camera]
    width, height = round(w * scale) // 2 * 2, round(h * scale) // 2 * 2
    if width < 16 or height < 16:
        raise ValueError(f"scale {scale} gives a {width}x{height} frame; need at least 16x16")
    return width, height


def _make_scene(rng: np.random.Generator, height: int, width: int) -> _Scene:
    size = min(height, width)
    r_min, r_max = max(0.004 * size, 1.5), max(0.15 * size, 3.0)
    # pdf ~ r^-3 on [r_min, r_max]; E[r^2] = ln(r_max/r_min) / (0.5 * (r_min^-2 - r_max^-2))
    mean_area = math.pi * math.log(r_max / r_min) / (0.5 * (r_min**-2 - r_max**-2))
    margin = r_max + 2 * _BLUR_RADIUS
    domain = (height + 2 * margin) * (width + 2 * margin)  # centres fall outside the frame too
    count = min(_MAX_DISCS, int(_COVERAGE * domain / mean_area) + 1)
    u = rng.random(count)
    radii = (r_min**-2 - u * (r_min**-2 - r_max**-2)) ** -0.5
    centres = np.stack(
        [rng.uniform(-margin, height + margin, count), rng.uniform(-margin, width + margin, count)], axis=1
    )
    # Uniform in encoded sRGB, then decoded: a natural spread of dark and light linear values.
    colours = srgb_decode(rng.uniform(0.05, 1.0, (count, 3)))
    gradient = np.stack([rng.uniform(0.2, 0.8, 3), rng.uniform(-0.2, 0.2, 3), rng.uniform(-0.2, 0.2, 3)], axis=1)
    return _Scene(centres, radii, colours, gradient, height, width)


def _gaussian_kernel(sigma: float, radius: int) -> np.ndarray:
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    return (taps / taps.sum()).astype(np.float32)


def _blur_valid(image: np.ndarray, sigma: float, radius: int) -> np.ndarray:
    """Separable Gaussian blur keeping only fully supported pixels: [H+2r, W+2r, 3] -> [H, W, 3]."""
    kernel = _gaussian_kernel(sigma, radius)
    h, w = image.shape[0] - 2 * radius, image.shape[1] - 2 * radius
    rows = np.zeros((h, image.shape[1], 3), np.float32)
    for i, tap in enumerate(kernel):
        rows += tap * image[i : i + h]
    out = np.zeros((h, w, 3), np.float32)
    for i, tap in enumerate(kernel):
        out += tap * rows[:, i : i + w]
    return out


def paint_disc(canvas: np.ndarray, y_c: float, x_c: float, r: float, colour: np.ndarray) -> None:
    """Paint an anti-aliased disc of radius ``r`` centred at canvas pixel (``y_c``, ``x_c``) over ``canvas``
    [ch, cw, 3] float32, in place (the dead-leaves scene's leaves)."""
    ch, cw = canvas.shape[:2]
    y0, y1 = max(int(y_c - r - 1), 0), min(int(y_c + r + 2), ch)
    x0, x1 = max(int(x_c - r - 1), 0), min(int(x_c + r + 2), cw)
    if y0 >= y1 or x0 >= x1:
        return
    yy = (np.arange(y0, y1, dtype=np.float32) - np.float32(y_c))[:, None] ** 2
    xx = (np.arange(x0, x1, dtype=np.float32) - np.float32(x_c))[None, :] ** 2
    alpha = np.clip(np.float32(r + 0.5) - np.sqrt(yy + xx), 0.0, 1.0)[..., None]  # [h, w, 1] coverage
    patch = canvas[y0:y1, x0:x1]
    patch += alpha * (colour - patch)


def _render(scene: _Scene, dy: float, dx: float) -> np.ndarray:
    """Linear sRGB frame [H, W, 3] float32 in [0, 0.9] of the scene moved by (dy, dx) pixels."""
    m = _BLUR_RADIUS
    ch, cw = scene.height + 2 * m, scene.width + 2 * m
    # Canvas pixel (i, j) samples the scene at frame-0 coordinates (i - m - dy, j - m - dx).
    ys = (np.arange(ch, dtype=np.float32) - m - dy) / scene.height  # [ch]
    xs = (np.arange(cw, dtype=np.float32) - m - dx) / scene.width  # [cw]
    g = scene.gradient.astype(np.float32)
    gradient = g[:, 0] + g[:, 1] * ys[:, None, None] + g[:, 2] * xs[None, :, None]  # [ch, cw, 3]
    background = g[:, 0] + 0.5 * g[:, 1] + 0.5 * g[:, 2]  # the gradient at the frame centre, a scene constant
    leaves = np.broadcast_to(background, (ch, cw, 3)).astype(np.float32)  # [ch, cw, 3]
    colours = scene.colours.astype(np.float32)
    for (cy, cx), r, colour in zip(scene.centres, scene.radii, colours, strict=True):
        paint_disc(leaves, cy + dy + m, cx + dx + m, r, colour)  # disc centre in canvas pixels
    image = np.float32(0.75) * leaves + np.float32(0.15) * np.clip(gradient, 0.0, 1.0)
    return np.clip(_blur_valid(image, BLUR_SIGMA, m), 0.0, 0.9)


def _seed_int(seq: np.random.SeedSequence) -> int:
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _photo_frames(srgb: np.ndarray, height: int, width: int, shifts: list[tuple[float, float]]) -> list[np.ndarray]:
    """Linear sRGB frames [H, W, 3] float32 in [0, 1] of a photograph, one per shift (Lanczos in linear light)."""
    from PIL import Image

    lin = srgb_decode(srgb.astype(np.float64)).astype(np.float32)  # [h, w, 3]
    h, w = lin.shape[:2]
    s = min(max(height / h, width / w), _MAX_PHOTO_ENLARGEMENT)  # output pixels per source pixel
    reach = max((max(abs(dy), abs(dx)) for dy, dx in shifts), default=0.0)
    pad = math.ceil((4 + reach) / min(s, 1.0)) + 2  # Lanczos support plus shifts, in source pixels
    need_h, need_w = math.ceil(height / s) + 2 * pad, math.ceil(width / s) + 2 * pad
    top, left = max(need_h - h, 0), max(need_w - w, 0)
    # Centre the photo, mirror it outwards where the frame needs more than it has.
    src = np.pad(lin, ((top // 2, top - top // 2), (left // 2, left - left // 2), (0, 0)), mode="symmetric")
    y_off = (src.shape[0] - height / s) / 2
    x_off = (src.shape[1] - width / s) / 2
    planes = [Image.fromarray(np.ascontiguousarray(src[..., c])) for c in range(3)]  # mode "F"
    frames = []
    for dy, dx in shifts:
        y0, x0 = y_off - dy / s, x_off - dx / s
        box = (x0, y0, x0 + width / s, y0 + height / s)
        chans = [np.asarray(p.resize((width, height), Image.Resampling.LANCZOS, box=box)) for p in planes]
        frames.append(np.clip(np.stack(chans, axis=2), 0.0, 1.0))
    return frames


def _content_frames(
    content: str, height: int, width: int, shifts: list[tuple[float, float]], rng: np.random.Generator,
    photos_dir: Path | str | None,
) -> list[np.ndarray]:
    """Linear sRGB frames [H, W, 3] float32 of the requested content, one per shift."""
    if content == "dead_leaves":
        scene = _make_scene(rng, height, width)
        return [_render(scene, dy, dx) for dy, dx in shifts]
    name = test_scenes.scene_name(content)
    if name is not None:  # a pixel-exact test scene at the frame's size; shifted frames resampled like a photograph
        srgb = test_scenes.scene(name, height, width)[0]
        if all(dy == 0 and dx == 0 for dy, dx in shifts):
            return [srgb_decode(srgb.astype(np.float64)).astype(np.float32) for _ in shifts]
        return _photo_frames(srgb, height, width, shifts)
    return _photo_frames(up.load_srgb(content, photos_dir), height, width, shifts)


def _cfa_channels(cfa: str, height: int, width: int) -> np.ndarray:
    """Channel index (0=R, 1=G, 2=B) of every pixel, [H, W] int64."""
    site = np.array([_CFA_CHANNEL[c] for c in cfa]).reshape(2, 2)
    return np.tile(site, (height // 2 + 1, width // 2 + 1))[:height, :width]


def unprocess(linear: np.ndarray, cfa: str, color_matrix: np.ndarray = COLOR_MATRIX) -> np.ndarray:
    """Legacy dcraw-style contract (used by ``stack_synth``): linear sRGB [H, W, 3] -> camera mosaic [H, W].

    ``c = neutral * (cam_rgb_n @ L)``; the DNG render of a single-D65-matrix file with a D65 neutral agrees
    with it to ~3e-4. New code uses :mod:`lab.synth.unprocess`.
    """
    cam = camera_rgb_matrix(color_matrix) * as_shot_neutral(color_matrix)[:, None]  # [camera, srgb]
    channels = _cfa_channels(cfa, linear.shape[0], linear.shape[1])  # [H, W]
    mosaic = np.zeros(channels.shape, np.float64)
    for c in range(3):
        mosaic += cam[channels, c] * linear[..., c]
    return mosaic


def _to_raw(mosaic: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Legacy (stack_synth): mosaic -> noisy uint16 raw, variance ``noise * x + READ_NOISE_FACTOR * noise**2``."""
    x = mosaic
    if noise > 0:
        x = rng.poisson(np.maximum(x, 0.0) / noise) * noise
        x = x + rng.normal(0.0, math.sqrt(READ_NOISE_FACTOR) * noise, x.shape)
    raw = np.rint(BLACK_LEVEL + x * (WHITE_LEVEL - BLACK_LEVEL))
    return np.clip(raw, 0, WHITE_LEVEL).astype(np.uint16)


def _raw_frame(
    linear: np.ndarray, cfa: str, colour: up.ShotColour, level: up.NoiseLevel, generator: torch.Generator
) -> np.ndarray:
    """Linear sRGB [H, W, 3] -> noisy uint16 raw mosaic [H, W], unprocessed in row chunks."""
    height, width = linear.shape[:2]
    raw = np.empty((height, width), np.uint16)
    wb_from_out = colour.transform.wb_cam_from_out
    for y0 in range(0, height, _CHUNK_ROWS):
        rows = torch.from_numpy(np.ascontiguousarray(linear[y0 : y0 + _CHUNK_ROWS])).permute(2, 0, 1)[None]
        camera, _ = up.unprocess_linear(rows, wb_from_out, colour.neutral_g)  # float32: error ~1e-7
        x = up.mosaic(camera, cfa)  # (1, 1, h, W) in [0, 1]
        if level.shot > 0 or level.read > 0:
            x = up.add_noise(x, level.shot, level.read, generator)
        counts = torch.round(BLACK_LEVEL + x[0, 0] * (WHITE_LEVEL - BLACK_LEVEL)).clamp(0, WHITE_LEVEL)
        raw[y0 : y0 + _CHUNK_ROWS] = counts.to(torch.int32).numpy().astype(np.uint16)
    return raw


def write_frame(path: Path, raw: np.ndarray, *, cfa: str, camera: str, profile: CameraProfile, neutral: list[float],
                noise_profile: NoiseProfile | None, baseline_exposure: float | None = None) -> None:
    """One synthetic frame as a DNG with the synthetic back's levels and make."""
    write_dng(path, raw, cfa=cfa, black_level=BLACK_LEVEL, white_level=WHITE_LEVEL, profile=profile,
              as_shot_neutral=neutral, make=MAKE, model=camera, noise_profile=noise_profile,
              baseline_exposure=baseline_exposure, capture=synthetic_capture(camera))


def synthetic_capture(camera: str) -> CaptureInfo:
    """The capture tags every synthetic frame carries (fixed, so outputs are reproducible)."""
    return CaptureInfo(make=MAKE, model=camera, lens="Schneider Kreuznach LS 80mm f/2.8", datetime_original=
                       "2026:11:30 14:05:09", exposure_time=1 / 125, f_number=8.0, iso=100, focal_length=80.0)


def write_ground_truth(linear: np.ndarray, out_dir: Path, space: str = "srgb") -> Path:
    """Write ``ground_truth.tif`` (16-bit, ``space``-encoded RGB) and ``ground_truth_linear.npy`` (float32).

    ``linear`` is linear sRGB; both files hold it converted to the output space (linear sRGB by default).
    """
    out = output_space(space)
    rgb = np.ascontiguousarray(linear, dtype=np.float32)
    if out.name not in ("srgb", "linear"):
        m = xyz_d50_to_output_matrix(out) @ np.linalg.inv(xyz_d50_to_output_matrix("srgb"))
        rgb = rgb @ m.T.astype(np.float32)
    np.save(out_dir / "ground_truth_linear.npy", rgb)
    encoded = encode_transfer(torch.from_numpy(rgb), out.transfer).numpy()
    path = out_dir / "ground_truth.tif"
    tifffile.imwrite(path, np.rint(encoded * 65535).astype(np.uint16), photometric="rgb", software=False,
                     metadata=None)
    return path


def _frame_count(camera: str, frames: int | None) -> int:
    """IQ3_S: one frame; IQ2_XS: ``frames`` (default 4, 2..16)."""
    if camera == "IQ3_S":
        if frames not in (None, 1):
            raise ValueError(f"IQ3_S is a single-frame camera, got frames={frames}")
        return 1
    n_frames = 4 if frames is None else frames
    if not 2 <= n_frames <= 16:
        raise ValueError(f"IQ2_XS needs 2..16 frames, got {n_frames}")
    return n_frames


def synthesize_shot(
    camera: str,
    out_dir: Path,
    *,
    scale: float = 0.1,
    frames: int | None = None,
    seed: int = 0,
    noise: float | str = 0.002,
    cfa: str = "RGGB",
    max_shift: float = 1.5,
    content: str = "dead_leaves",
    space: str = "srgb",
    white: tuple[float, float] = WHITE_D65,
    forward_matrices: bool = True,
    photos_dir: Path | str | None = None,
) -> SynthShot:
    """Write a synthetic shot (``frame_NN.dng`` + ground truth) of ``camera`` into ``out_dir``.

    IQ3_S is a single frame; IQ2_XS a stack of ``frames`` (default 4, 2..16) with random sub-pixel shifts
    in [-max_shift, max_shift]. ``noise`` is a level name (none, low, mid, high) or the NoiseProfile shot
    coefficient (0 = noise-free; read variance from Brooks' line). ``content``: ``dead_leaves``,
    ``photo:NNN``, ``skimage:NAME`` or an image path. ``white`` is the scene white (CIE xy) written as
    AsShotNeutral; ``space`` the output space of the ground truth.
    """
    width, height = shot_size(camera, scale)
    if cfa not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {cfa!r}")
    level = up.noise_level(noise)
    if max_shift < 0:
        raise ValueError(f"max_shift must be >= 0, got {max_shift}")
    output_space(space)
    n_frames = _frame_count(camera, frames)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    scene_seq, shift_seq, noise_seq = np.random.SeedSequence(seed).spawn(3)
    scene_rng, shift_rng = np.random.default_rng(scene_seq), np.random.default_rng(shift_seq)
    generator = torch.Generator().manual_seed(_seed_int(noise_seq))
    shifts: list[tuple[float, float]] = [(0.0, 0.0)]
    for _ in range(n_frames - 1):
        dy, dx = shift_rng.uniform(-max_shift, max_shift, 2)
        shifts.append((float(dy), float(dx)))
    noise_profile = NoiseProfile(shot=level.shot, read=level.read)
    profile = up.synthetic_profile(forward_matrices)
    colour = up.shot_colour(profile, white, "srgb")

    files: list[Path] = []
    ground_truth = out_dir / "ground_truth.tif"
    linear_frames = _content_frames(content, height, width, shifts, scene_rng, photos_dir)
    for k, linear in enumerate(linear_frames):
        if k == 0:
            ground_truth = write_ground_truth(linear, out_dir, space)
        raw = _raw_frame(linear, cfa, colour, level, generator)
        path = out_dir / f"frame_{k:02d}.dng"
        write_frame(path, raw, cfa=cfa, camera=camera, profile=profile, neutral=colour.neutral.tolist(),
                    noise_profile=noise_profile, baseline_exposure=0.0)
        files.append(path)
    return SynthShot(files=files, ground_truth=ground_truth, shifts=shifts)


def _linear_raw(linear: np.ndarray, colour: up.ShotColour, level: up.NoiseLevel, generator: torch.Generator
                ) -> np.ndarray:
    """Linear sRGB [H, W, 3] -> noisy uint16 linear camera RGB [H, W, 3] (every pixel samples all three
    channels: a linear DNG), unprocessed in row chunks."""
    height, width = linear.shape[:2]
    raw = np.empty((height, width, 3), np.uint16)
    for y0 in range(0, height, _CHUNK_ROWS):
        rows = torch.from_numpy(np.ascontiguousarray(linear[y0 : y0 + _CHUNK_ROWS])).permute(2, 0, 1)[None]
        camera, _ = up.unprocess_linear(rows, colour.transform.wb_cam_from_out, colour.neutral_g)  # (1, 3, h, W)
        if level.shot > 0 or level.read > 0:
            camera = up.add_noise(camera, level.shot, level.read, generator)
        counts = torch.round(BLACK_LEVEL + camera[0] * (WHITE_LEVEL - BLACK_LEVEL)).clamp(0, WHITE_LEVEL)
        raw[y0 : y0 + _CHUNK_ROWS] = counts.permute(1, 2, 0).to(torch.int32).numpy().astype(np.uint16)
    return raw


def synthesize_linear_shot(out_dir: Path, *, width: int = 768, height: int = 512, seed: int = 0,
                           noise: float | str = "low", content: str = "dead_leaves", space: str = "srgb",
                           white: tuple[float, float] = WHITE_D65, make: str = "Acme", model: str = "Linear Converter",
                           photos_dir: Path | str | None = None) -> SynthShot:
    """Write a synthetic linear DNG (``frame_00.dng``: PhotometricInterpretation LinearRaw, 3 samples, what a
    DNG converter writes) + its ground truth into ``out_dir``: the scene unprocessed to camera RGB through the
    profile's DNG colour model (as :func:`synthesize_shot`), Poisson-Gaussian noise of level ``noise`` on
    every sample (its NoiseProfile written), no mosaic. ``make``/``model``: any camera, not a Phase One back."""
    level = up.noise_level(noise)
    output_space(space)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scene_seq, noise_seq = np.random.SeedSequence(seed).spawn(2)
    generator = torch.Generator().manual_seed(_seed_int(noise_seq))
    profile = up.synthetic_profile(True)
    colour = up.shot_colour(profile, white, "srgb")
    linear = _content_frames(content, height // 2 * 2, width // 2 * 2, [(0.0, 0.0)],
                             np.random.default_rng(scene_seq), photos_dir)[0]
    ground_truth = write_ground_truth(linear, out_dir, space)
    path = out_dir / "frame_00.dng"
    write_linear_dng(path, _linear_raw(linear, colour, level, generator), black_level=BLACK_LEVEL,
                     white_level=WHITE_LEVEL, profile=profile, as_shot_neutral=colour.neutral.tolist(), make=make,
                     model=model, noise_profile=NoiseProfile(shot=level.shot, read=level.read), baseline_exposure=0.0,
                     capture=replace(synthetic_capture(model), make=make, model=model, lens=""))
    return SynthShot(files=[path], ground_truth=ground_truth, shifts=[(0.0, 0.0)])


__all__ = ["CAMERAS", "COLOR_MATRIX", "SynthShot", "shot_size", "synthesize_linear_shot", "synthesize_shot",
           "write_ground_truth"]
