"""Synthetic Phase One shots (DNG frames + ground truth) for tests and benchmarks; no downloads.

The scene is a "dead leaves" image (opaque anti-aliased discs, radii ~ r^-3) over a smooth colour gradient,
blurred with a Gaussian (sigma 1 px), in linear sRGB within [0, 0.9]. Each frame is unprocessed with the
contract of :mod:`services.raw.colour`, mosaicked, scaled to 16-bit raw and given Poisson-Gaussian noise.

Shift convention: frame ``k`` with shift ``(dy, dx)`` satisfies ``frame_k(y, x) = frame_0(y - dy, x - dx)``,
i.e. a feature at ``(y, x)`` in frame 0 appears at ``(y + dy, x + dx)`` in frame k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

from services.raw.colour import as_shot_neutral, camera_rgb_matrix, srgb_decode, srgb_encode
from services.raw.dng import write_dng
from services.raw.meta import CFA_PATTERNS, NoiseProfile

CAMERAS: dict[str, tuple[int, int]] = {"IQ3_S": (7728, 10304), "IQ2_XS": (6912, 7296)}  # (width, height)
MAKE = "Phase One"

# ColorMatrix1 (XYZ -> camera, D65) of the Phase One P 65+ back, from the Adobe DNG Converter table as
# published in dcraw's adobe_coeff; rows are not normalised. All entries of camera_rgb_matrix(CM) are
# positive, so every linear sRGB colour in [0, 0.9] maps to camera values in [0, 0.9] (no clipping).
COLOR_MATRIX = np.array(
    [
        [0.8035, 0.0435, -0.0962],
        [-0.6001, 1.3872, 0.2320],
        [-0.1159, 0.3065, 0.5434],
    ]
)
BLACK_LEVEL = 1024
WHITE_LEVEL = 65535
READ_NOISE_FACTOR = 0.5  # read variance = READ_NOISE_FACTOR * noise**2 (normalised units)
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
        y_c, x_c = cy + dy + m, cx + dx + m  # disc centre in canvas pixels
        y0, y1 = max(int(y_c - r - 1), 0), min(int(y_c + r + 2), ch)
        x0, x1 = max(int(x_c - r - 1), 0), min(int(x_c + r + 2), cw)
        if y0 >= y1 or x0 >= x1:
            continue
        yy = (np.arange(y0, y1, dtype=np.float32) - np.float32(y_c))[:, None] ** 2
        xx = (np.arange(x0, x1, dtype=np.float32) - np.float32(x_c))[None, :] ** 2
        alpha = np.clip(np.float32(r + 0.5) - np.sqrt(yy + xx), 0.0, 1.0)[..., None]  # [h, w, 1] coverage
        patch = leaves[y0:y1, x0:x1]
        patch += alpha * (colour - patch)
    image = np.float32(0.75) * leaves + np.float32(0.15) * np.clip(gradient, 0.0, 1.0)
    return np.clip(_blur_valid(image, BLUR_SIGMA, m), 0.0, 0.9)


def _cfa_channels(cfa: str, height: int, width: int) -> np.ndarray:
    """Channel index (0=R, 1=G, 2=B) of every pixel, [H, W] int64."""
    site = np.array([_CFA_CHANNEL[c] for c in cfa]).reshape(2, 2)
    return np.tile(site, (height // 2 + 1, width // 2 + 1))[:height, :width]


def unprocess(linear: np.ndarray, cfa: str, color_matrix: np.ndarray = COLOR_MATRIX) -> np.ndarray:
    """Linear sRGB [H, W, 3] -> normalised camera mosaic [H, W] float64, ``c = neutral * (cam_rgb_n @ L)``."""
    cam = camera_rgb_matrix(color_matrix) * as_shot_neutral(color_matrix)[:, None]  # [camera, srgb]
    channels = _cfa_channels(cfa, linear.shape[0], linear.shape[1])  # [H, W]
    mosaic = np.zeros(channels.shape, np.float64)
    for c in range(3):
        mosaic += cam[channels, c] * linear[..., c]
    return mosaic


def _to_raw(mosaic: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Normalised mosaic -> noisy uint16 raw with variance ``noise * x + READ_NOISE_FACTOR * noise**2``."""
    x = mosaic
    if noise > 0:
        x = rng.poisson(np.maximum(x, 0.0) / noise) * noise
        x = x + rng.normal(0.0, math.sqrt(READ_NOISE_FACTOR) * noise, x.shape)
    raw = np.rint(BLACK_LEVEL + x * (WHITE_LEVEL - BLACK_LEVEL))
    return np.clip(raw, 0, WHITE_LEVEL).astype(np.uint16)


def write_ground_truth(linear: np.ndarray, out_dir: Path) -> Path:
    """Write ``ground_truth.tif`` (16-bit sRGB-encoded RGB) and ``ground_truth_linear.npy`` (float32)."""
    np.save(out_dir / "ground_truth_linear.npy", linear.astype(np.float32))
    encoded = np.rint(srgb_encode(linear.astype(np.float64)) * 65535).astype(np.uint16)
    path = out_dir / "ground_truth.tif"
    tifffile.imwrite(path, encoded, photometric="rgb", software=False, metadata=None)
    return path


def synthesize_shot(
    camera: str,
    out_dir: Path,
    *,
    scale: float = 0.1,
    frames: int | None = None,
    seed: int = 0,
    noise: float = 0.002,
    cfa: str = "RGGB",
    max_shift: float = 1.5,
) -> SynthShot:
    """Write a synthetic shot (``frame_NN.dng`` + ground truth) of ``camera`` into ``out_dir``.

    IQ3_S is a single frame; IQ2_XS a stack of ``frames`` (default 4, 2..16) with random sub-pixel shifts
    in [-max_shift, max_shift]. ``noise`` is the DNG NoiseProfile shot coefficient (0 means noise-free).
    """
    width, height = shot_size(camera, scale)
    if cfa not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {cfa!r}")
    if noise < 0 or max_shift < 0:
        raise ValueError(f"noise and max_shift must be >= 0, got {noise}, {max_shift}")
    if camera == "IQ3_S":
        if frames not in (None, 1):
            raise ValueError(f"IQ3_S is a single-frame camera, got frames={frames}")
        n_frames = 1
    else:
        n_frames = 4 if frames is None else frames
        if not 2 <= n_frames <= 16:
            raise ValueError(f"IQ2_XS needs 2..16 frames, got {n_frames}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    scene_rng, shift_rng, noise_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    scene = _make_scene(scene_rng, height, width)
    shifts: list[tuple[float, float]] = [(0.0, 0.0)]
    for _ in range(n_frames - 1):
        dy, dx = shift_rng.uniform(-max_shift, max_shift, 2)
        shifts.append((float(dy), float(dx)))
    noise_profile = NoiseProfile(shot=noise, read=READ_NOISE_FACTOR * noise**2)

    files: list[Path] = []
    ground_truth = out_dir / "ground_truth.tif"
    for k, (dy, dx) in enumerate(shifts):
        linear = _render(scene, dy, dx)  # [H, W, 3]
        if k == 0:
            ground_truth = write_ground_truth(linear, out_dir)
        raw = _to_raw(unprocess(linear, cfa), noise, noise_rng)
        path = out_dir / f"frame_{k:02d}.dng"
        write_dng(
            path,
            raw,
            cfa=cfa,
            black_level=BLACK_LEVEL,
            white_level=WHITE_LEVEL,
            color_matrix=COLOR_MATRIX,
            as_shot_neutral=as_shot_neutral(COLOR_MATRIX).tolist(),
            make=MAKE,
            model=camera,
            noise_profile=noise_profile,
        )
        files.append(path)
    return SynthShot(files=files, ground_truth=ground_truth, shifts=shifts)
