"""Realistic synthetic RAW data from RGB images (Brooks et al. 2019, "Unprocessing Images for Learned Raw
Denoising"), shared by ``strata synth`` and the training code.

sRGB image -> inverse sRGB transfer -> linear sRGB -> (exposure) -> inverse of the DNG colour pipeline's
``out_from_wb_cam`` (white-balanced camera RGB) -> inverse white balance (camera neutral) -> clip at the white
level (saturated highlights) -> Bayer mosaic (any of the 4 CFA phases) -> Poisson-Gaussian noise with
``variance = shot * x + read`` (x normalised to [0, 1] of the white level).

Because the forward colour model is :func:`services.raw.colour.dng_colour_transform` (the same
function the renderer uses), rendering an unprocessed, noise-free image returns the input exactly (up to
clipping and demosaic). Per-pixel functions take torch tensors (B, C, H, W) on any device (the training
script generates on the GPU) or numpy arrays of the same layout, and return the same kind.

Content: the photographs in ``../shared/data/photos`` (read from a path, never copied into the repo; split
by :data:`PHOTOS_TRAIN` / :data:`PHOTOS_HELD_OUT`), scikit-image's bundled photographs (:data:`SKIMAGE_TRAIN`,
training only; needs the ``train`` extra) and procedural dead leaves (``lab.synth.synth``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from services.pipeline.ops.colour import srgb_decode
from services.raw.colour import (
    ILLUMINANT_D65,
    ILLUMINANT_STD_A,
    WHITE_A,
    WHITE_D50,
    WHITE_D65,
    CameraProfile,
    ColourTransform,
    bradford_matrix,
    dng_colour_transform,
    xy_to_xyz,
)

CFA_PATTERNS = ("RGGB", "BGGR", "GRBG", "GBRG")
_CHANNEL = {"R": 0, "G": 1, "B": 2}

# --- content split (used by the training script and by `strata quality`) --------------------------------
_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PHOTOS_DIR = _REPO_ROOT.parent / "shared" / "data" / "photos"  # /work/shared/data/photos
PHOTOS_TRAIN: tuple[str, ...] = tuple(f"{i:03d}" for i in range(1, 33))  # 001..032
PHOTOS_HELD_OUT: tuple[str, ...] = tuple(f"{i:03d}" for i in range(33, 41))  # 033..040: benchmark only
# scikit-image photographs that load offline (bundled with the wheel); all used for training only.
SKIMAGE_TRAIN: tuple[str, ...] = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina")

# --- noise levels ----------------------------------------------------------------------------------------
# Brooks et al.: log(read) = 2.18 * log(shot) + 1.20 (+ N(0, 0.26) when sampling), variances in [0, 1] units.
READ_LOG_SLOPE = 2.18
READ_LOG_INTERCEPT = 1.20
READ_LOG_SIGMA = 0.26
SHOT_RANGE = (1e-4, 1.2e-2)  # Brooks' sampling range of the shot coefficient


def read_from_shot(shot: float) -> float:
    """Read-noise variance on Brooks' log-linear line for a shot coefficient (0 -> 0)."""
    return 0.0 if shot <= 0 else math.exp(READ_LOG_SLOPE * math.log(shot) + READ_LOG_INTERCEPT)


@dataclass(frozen=True)
class NoiseLevel:
    """A named ISO-like noise level: ``variance = shot * x + read`` in normalised units."""

    name: str
    shot: float
    read: float


NOISE_LEVELS: dict[str, NoiseLevel] = {
    "none": NoiseLevel("none", 0.0, 0.0),
    "low": NoiseLevel("low", 2e-4, read_from_shot(2e-4)),  # ~ISO 400 on a modern back: SNR 33 dB at 18 % grey
    "mid": NoiseLevel("mid", 2e-3, read_from_shot(2e-3)),  # ~ISO 3200: SNR 20 dB at 18 % grey
    "high": NoiseLevel("high", 1e-2, read_from_shot(1e-2)),  # ~ISO 12800: SNR 12 dB at 18 % grey
}


def noise_level(level: str | float) -> NoiseLevel:
    """A :data:`NOISE_LEVELS` name, or a shot coefficient (read from Brooks' line) -> :class:`NoiseLevel`."""
    if isinstance(level, str):
        if level in NOISE_LEVELS:
            return NOISE_LEVELS[level]
        try:
            level = float(level)
        except ValueError:
            names = list(NOISE_LEVELS)
            raise ValueError(f"unknown noise level {level!r}; expected one of {names} or a number") from None
    shot = float(level)
    if shot < 0 or not math.isfinite(shot):
        raise ValueError(f"noise must be a finite number >= 0, got {level}")
    return NoiseLevel(f"{shot:g}", shot, read_from_shot(shot))


# --- cameras ---------------------------------------------------------------------------------------------
# ColorMatrix (XYZ -> camera, D65) of four cameras as used by Brooks et al. (their unprocess.py); random
# training cameras are convex combinations of them.
BROOKS_XYZ_TO_CAMS = np.array(
    [
        [[1.0234, -0.2969, -0.2266], [-0.5625, 1.6328, -0.0469], [-0.0703, 0.2188, 0.6406]],
        [[0.4913, -0.0541, -0.0202], [-0.613, 1.3513, 0.2906], [-0.1564, 0.2151, 0.7183]],
        [[0.838, -0.263, -0.0639], [-0.2887, 1.0725, 0.2496], [-0.0627, 0.1427, 0.5438]],
        [[0.6596, -0.2079, -0.0562], [-0.4782, 1.3016, 0.1933], [-0.097, 0.1581, 0.5181]],
    ]
)
# The synthetic Phase One: ColorMatrix for D65 of the P 65+ back (Adobe's table via dcraw's adobe_coeff)
# and one for Standard light A derived from it with the A/D65 relation of a Canon EOS 5D Mark III's pair.
COLOR_MATRIX_D65 = np.array([[0.8035, 0.0435, -0.0962], [-0.6001, 1.3872, 0.2320], [-0.1159, 0.3065, 0.5434]])
_CANON_A = np.array([[0.7234, -0.1413, -0.0600], [-0.3631, 1.1150, 0.2850], [-0.0382, 0.1335, 0.6437]])
_CANON_D65 = np.array([[0.6722, -0.0635, -0.0963], [-0.4287, 1.2460, 0.2028], [-0.0908, 0.2162, 0.5668]])
COLOR_MATRIX_STD_A = np.round(_CANON_A @ np.linalg.inv(_CANON_D65) @ COLOR_MATRIX_D65, 4)


def forward_matrix_for(color_matrix: np.ndarray, white: tuple[float, float]) -> np.ndarray:
    """A ForwardMatrix consistent with ``color_matrix`` at its calibration white (camera (1,1,1) -> D50)."""
    cm = np.asarray(color_matrix, dtype=np.float64)
    fm = bradford_matrix(white, WHITE_D50) @ np.linalg.inv(cm) @ np.diag(cm @ xy_to_xyz(white))
    return np.round(fm, 4)


FORWARD_MATRIX_D65 = forward_matrix_for(COLOR_MATRIX_D65, WHITE_D65)
FORWARD_MATRIX_STD_A = forward_matrix_for(COLOR_MATRIX_STD_A, WHITE_A)


def synthetic_profile(forward_matrices: bool = True) -> CameraProfile:
    """The dual-illuminant profile written into synthetic DNGs: ColorMatrix1 = D65, ColorMatrix2 = StdA."""
    return CameraProfile(
        color_matrix_1=COLOR_MATRIX_D65,
        color_matrix_2=COLOR_MATRIX_STD_A,
        illuminant_1=ILLUMINANT_D65,
        illuminant_2=ILLUMINANT_STD_A,
        forward_matrix_1=FORWARD_MATRIX_D65 if forward_matrices else None,
        forward_matrix_2=FORWARD_MATRIX_STD_A if forward_matrices else None,
    )


def random_camera(rng: np.random.Generator) -> CameraProfile:
    """A single-illuminant (D65) camera whose ColorMatrix is a random convex mix of Brooks' four cameras."""
    w = rng.uniform(1e-8, 1.0, len(BROOKS_XYZ_TO_CAMS))
    cm = np.tensordot(w / w.sum(), BROOKS_XYZ_TO_CAMS, axes=1)
    return CameraProfile(color_matrix_1=cm, illuminant_1=ILLUMINANT_D65)


def planckian_white(cct: float) -> tuple[float, float]:
    """CIE xy of a blackbody-like white: CIE daylight locus at/above 4000 K, Kim et al. Planckian fit below."""
    t = float(cct)
    if t >= 4000.0:
        x = (-4.6070e9 / t**3 + 2.9678e6 / t**2 + 0.09911e3 / t + 0.244063) if t <= 7000.0 else (
            -2.0064e9 / t**3 + 1.9018e6 / t**2 + 0.24748e3 / t + 0.237040)
        return (x, -3.0 * x * x + 2.870 * x - 0.275)
    x = -0.2661239e9 / t**3 - 0.2343589e6 / t**2 + 0.8776956e3 / t + 0.179910
    if t <= 2222.0:
        y = -1.1063814 * x**3 - 1.34811020 * x**2 + 2.18555832 * x - 0.20219683
    else:
        y = -0.9549476 * x**3 - 1.37418593 * x**2 + 2.09137015 * x - 0.16748867
    return (x, y)


@dataclass(frozen=True)
class ShotColour:
    """The colour side of one synthetic shot: camera, scene white, and the renderer's transform for it."""

    profile: CameraProfile
    neutral: np.ndarray  # (3,) camera RGB of the white, largest channel 1 (AsShotNeutral)
    transform: ColourTransform  # gains + out_from_wb_cam for the output space

    @property
    def neutral_g(self) -> np.ndarray:
        """The neutral normalised to G = 1 (``1 / gains``)."""
        return self.neutral / self.neutral[1]


def shot_colour(
    profile: CameraProfile, white: tuple[float, float] = WHITE_D65, space: str = "srgb"
) -> ShotColour:
    """Camera neutral of ``white`` and the DNG transform that renders it (as the pipeline will)."""
    neutral = profile.xy_to_neutral(white)
    return ShotColour(profile, neutral, dng_colour_transform(profile, neutral=neutral, space=space))


def random_shot_colour(rng: np.random.Generator, cct_range: tuple[float, float] = (2800.0, 7500.0),
                       space: str = "linear") -> ShotColour:
    """A random camera (:func:`random_camera`) under a random white (CCT uniform in mired over the range)."""
    mired = rng.uniform(1e6 / cct_range[1], 1e6 / cct_range[0])
    return shot_colour(random_camera(rng), planckian_white(1e6 / mired), space)


# --- per-pixel ops (torch or numpy, (B, C, H, W)) --------------------------------------------------------
ArrayT = TypeVar("ArrayT", Tensor, np.ndarray)


def _torch(x: Tensor | np.ndarray) -> Tensor:
    return x if isinstance(x, Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def _like(out: Tensor, ref: Tensor | np.ndarray) -> Tensor | np.ndarray:
    return out if isinstance(ref, Tensor) else out.cpu().numpy()


def _check(x: Tensor, channels: int, name: str) -> None:
    if x.ndim != 4 or x.shape[1] != channels or not x.is_floating_point():
        raise ValueError(f"{name} must be floating (B, {channels}, H, W), got {tuple(x.shape)} {x.dtype}")


def _per_sample(values: Tensor | np.ndarray | float | list, like: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Scalar, (B,) or (B, ...) values as a tensor broadcastable to ``like`` with trailing ``shape``."""
    v = torch.as_tensor(np.asarray(values) if not isinstance(values, Tensor) else values,
                        dtype=like.dtype, device=like.device)
    if v.ndim == 0:
        return v.expand(like.shape[0], *shape).reshape(-1, *shape)
    return v.reshape(v.shape[0], *shape)


def cfa_index(cfa: str, height: int, width: int, device: torch.device | str = "cpu") -> Tensor:
    """Channel (0=R, 1=G, 2=B) of every pixel for a 2x2 pattern read row-major from the top-left, (H, W)."""
    if cfa not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {cfa!r}")
    site = torch.tensor([_CHANNEL[c] for c in cfa], device=device).reshape(2, 2)
    return site.repeat((height + 1) // 2, (width + 1) // 2)[:height, :width]


def mosaic(rgb: ArrayT, cfa: str) -> ArrayT:
    """(B, 3, H, W) -> (B, 1, H, W) Bayer mosaic; H and W may be odd."""
    x = _torch(rgb)
    _check(x, 3, "rgb")
    idx = cfa_index(cfa, x.shape[2], x.shape[3], x.device)  # (H, W)
    out = torch.gather(x, 1, idx.expand(x.shape[0], 1, -1, -1))  # (B, 1, H, W)
    return _like(out, rgb)  # type: ignore[return-value]


def apply_colour_matrix(rgb: ArrayT, matrix: np.ndarray | Tensor) -> ArrayT:
    """Per-pixel ``matrix @ rgb`` with a (3, 3) or per-sample (B, 3, 3) matrix on (B, 3, H, W)."""
    x = _torch(rgb)
    _check(x, 3, "rgb")
    m = torch.as_tensor(np.asarray(matrix) if not isinstance(matrix, Tensor) else matrix,
                        dtype=x.dtype, device=x.device)
    m = m.expand(x.shape[0], 3, 3) if m.ndim == 2 else m
    return _like(torch.einsum("bij,bjhw->bihw", m, x), rgb)  # type: ignore[return-value]


def unprocess_linear(
    linear: ArrayT,
    wb_cam_from_out: np.ndarray | Tensor,
    neutral_g: np.ndarray | Tensor,
    exposure: float | np.ndarray | Tensor = 1.0,
) -> tuple[ArrayT, ArrayT]:
    """Linear output RGB (B, 3, H, W) -> (camera RGB clipped to [0, 1], white-balanced camera RGB target).

    ``camera = clip(neutral_g * (wb_cam_from_out @ (exposure * linear)), 0, 1)`` is what the sensor records
    before noise (values above 1 saturate); the target is ``camera / neutral_g``, the ideal demosaicked,
    white-balanced image of the same clipped data. ``wb_cam_from_out`` and ``neutral_g`` may be per sample.
    """
    x = _torch(linear)
    _check(x, 3, "linear")
    x = x * _per_sample(exposure, x, (1, 1, 1))
    wb = apply_colour_matrix(x, wb_cam_from_out)
    n = torch.as_tensor(np.asarray(neutral_g) if not isinstance(neutral_g, Tensor) else neutral_g,
                        dtype=x.dtype, device=x.device).reshape(-1, 3, 1, 1)  # (1 or B, 3, 1, 1)
    camera = (wb * n).clamp(0.0, 1.0)
    return _like(camera, linear), _like(camera / n, linear)  # type: ignore[return-value]


_POISSON_EXACT_BELOW = 64.0  # expected counts below which the shot noise is drawn as an exact Poisson


def add_noise(
    clean_mosaic: ArrayT,
    shot: float | np.ndarray | Tensor,
    read: float | np.ndarray | Tensor,
    generator: torch.Generator | None = None,
    poisson: bool = True,
) -> ArrayT:
    """Heteroscedastic noise with ``variance = shot * x + read`` (per sample or scalar); not clipped.

    ``poisson=True`` draws the signal-dependent part as scaled Poisson counts (exactly below 64 expected
    counts, as a Gaussian of equal variance above), else a Gaussian of the total variance (Brooks et al.).
    Uses ``generator`` (on the data's device) for reproducibility.
    """
    x = _torch(clean_mosaic)
    s = _per_sample(shot, x, (1, 1, 1))  # (B, 1, 1, 1)
    r = _per_sample(read, x, (1, 1, 1))
    signal = x.clamp(min=0.0)
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    if poisson:
        safe = torch.where(s > 0, s, torch.ones_like(s))
        lam = (signal / safe).expand_as(x)  # expected photo-electron counts
        # Gaussian of the same variance where counts are high (indistinguishable there), Poisson below.
        counts = lam + lam.sqrt() * noise
        low = lam < _POISSON_EXACT_BELOW
        counts[low] = torch.poisson(lam[low], generator=generator)
        shot_part = torch.where(s > 0, counts * safe, signal)
        out = shot_part + torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype) * r.sqrt()
    else:
        out = signal + noise * (s * signal + r).sqrt()
    return _like(out, clean_mosaic)  # type: ignore[return-value]


def sample_noise(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Brooks' random (shot, read) pairs: log-uniform shot over :data:`SHOT_RANGE`, read on the line + jitter."""
    log_shot = rng.uniform(math.log(SHOT_RANGE[0]), math.log(SHOT_RANGE[1]), batch)
    log_read = READ_LOG_SLOPE * log_shot + READ_LOG_INTERCEPT + rng.normal(0.0, READ_LOG_SIGMA, batch)
    return np.exp(log_shot), np.exp(log_read)


@dataclass(frozen=True)
class UnprocessedBatch:
    """One training batch: ``noisy``/``clean`` mosaics (B, 1, H, W) before white balance, ``target`` the
    white-balanced camera RGB (B, 3, H, W), ``gains`` (B, 3) for the mosaic, ``out_from_wb_cam`` (B, 3, 3) to
    render linear sRGB, noise ``shot``/``read`` (B,), and the ``cfa`` of the batch."""

    noisy: Tensor
    clean: Tensor
    target: Tensor
    gains: Tensor
    out_from_wb_cam: Tensor
    shot: Tensor
    read: Tensor
    cfa: str


def unprocess_batch(
    srgb: Tensor,
    rng: np.random.Generator,
    generator: torch.Generator | None = None,
    *,
    cfa: str | None = None,
    noise: str | float | None = None,
    highlight_fraction: float = 0.25,
    max_exposure: float = 2.0,
) -> UnprocessedBatch:
    """Unprocess a batch of sRGB-encoded images (B, 3, H, W) in [0, 1] into noisy mosaics with targets.

    Per sample: a random camera and white (:func:`random_shot_colour`), exposure 1 or, with probability
    ``highlight_fraction``, uniform in [1, ``max_exposure``] (saturated highlights); noise from
    :func:`sample_noise` or the given level for all. ``cfa`` None picks one of the 4 phases for the batch.
    """
    _check(srgb, 3, "srgb")
    b = srgb.shape[0]
    pattern = cfa if cfa is not None else CFA_PATTERNS[int(rng.integers(4))]
    colours = [random_shot_colour(rng, space="linear") for _ in range(b)]
    wb_from_out = np.stack([c.transform.wb_cam_from_out for c in colours])  # (B, 3, 3)
    neutral_g = np.stack([c.neutral_g for c in colours])  # (B, 3)
    exposure = np.where(rng.random(b) < highlight_fraction, rng.uniform(1.0, max_exposure, b), 1.0)
    camera, target = unprocess_linear(srgb_decode(srgb), wb_from_out, neutral_g, exposure)
    clean = mosaic(camera, pattern)
    if noise is None:
        shot, read = sample_noise(b, rng)
    else:
        level = noise_level(noise)
        shot, read = np.full(b, level.shot), np.full(b, level.read)
    noisy = add_noise(clean, shot, read, generator)
    dev, dt = srgb.device, srgb.dtype
    return UnprocessedBatch(
        noisy=noisy,
        clean=clean,
        target=target,
        gains=torch.as_tensor(1.0 / neutral_g, dtype=dt, device=dev),
        out_from_wb_cam=torch.as_tensor(np.stack([c.transform.out_from_wb_cam for c in colours]), dtype=dt,
                                        device=dev),
        shot=torch.as_tensor(shot, dtype=dt, device=dev),
        read=torch.as_tensor(read, dtype=dt, device=dev),
        cfa=pattern,
    )


def random_crop(images: ArrayT, height: int, width: int, rng: np.random.Generator) -> ArrayT:
    """A (B, C, height, width) crop at a random offset (any parity; sizes may be odd)."""
    h, w = images.shape[-2:]
    if not (0 < height <= h and 0 < width <= w):
        raise ValueError(f"crop {height}x{width} does not fit {h}x{w}")
    y, x = int(rng.integers(0, h - height + 1)), int(rng.integers(0, w - width + 1))
    return images[..., y : y + height, x : x + width]


# --- content ---------------------------------------------------------------------------------------------


def photo_path(name: str, photos_dir: Path | str | None = None) -> Path:
    """Path of photograph ``NNN`` (e.g. "033") in ``photos_dir`` (default :data:`DEFAULT_PHOTOS_DIR`)."""
    root = Path(photos_dir) if photos_dir is not None else DEFAULT_PHOTOS_DIR
    path = root / f"{name}.png"
    if not path.is_file():
        raise ValueError(f"photograph {name!r} not found at {path}")
    return path


def content_problem(source: str, photos_dir: Path | str | None = None, seeded: bool = True) -> str | None:
    """Why a benchmark's content spec (``dead_leaves[:SEED]``, ``photo:NNN``, ``skimage:NAME``, ``pattern:NAME``, a
    test scene of :mod:`lab.synth.scenes`, or a file path) cannot be read, or None: checked before a run starts, so a
    typo is a usage error, not a traceback minutes in.
    ``seeded``: whether ``dead_leaves`` may carry a seed."""
    if source == "dead_leaves" or source.startswith("dead_leaves:"):
        seed = source.partition(":")[2]
        if seed and not seeded:
            return "dead_leaves takes no seed here (--seed sets it)"
        return None if not seed or seed.isdigit() else f"dead_leaves seed {seed!r} is not a whole number"
    if source.startswith("pattern:"):
        from lab.synth.scenes import SCENES

        name = source.split(":", 1)[1]
        return None if name in SCENES else f"no test scene {name!r} (one of {', '.join(SCENES)})"
    try:
        if source.startswith("skimage:"):
            import skimage.data

            if getattr(skimage.data, source.split(":", 1)[1], None) is None:
                return f"scikit-image has no image {source.split(':', 1)[1]!r}"
        elif source.startswith("photo:"):
            photo_path(source.split(":", 1)[1], photos_dir)
        elif not Path(source).is_file():
            return f"no image file {source}"
    except (ValueError, ImportError) as exc:
        return str(exc)
    return None


def load_srgb(source: str | Path, photos_dir: Path | str | None = None) -> np.ndarray:
    """An sRGB-encoded (H, W, 3) float32 image in [0, 1] from ``photo:NNN``, ``skimage:NAME`` or a file path."""
    text = str(source)
    if text.startswith("skimage:"):
        try:
            import skimage.data
        except ImportError as exc:  # the `train` extra
            raise ValueError("skimage content needs scikit-image (pip install strata[train])") from exc
        name = text.split(":", 1)[1]
        loader = getattr(skimage.data, name, None)
        if loader is None:
            raise ValueError(f"scikit-image has no image {name!r}")
        arr = np.asarray(loader())
    else:
        from PIL import Image

        path = photo_path(text.split(":", 1)[1], photos_dir) if text.startswith("photo:") else Path(text)
        if not path.is_file():
            raise ValueError(f"content image {path} not found")
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"))
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    arr = arr[..., :3]
    scale = 65535.0 if arr.dtype == np.uint16 else 255.0
    return (arr.astype(np.float32) / np.float32(scale)).clip(0.0, 1.0)
