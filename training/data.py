"""Synthetic RAW training data, generated on the fly on the training device (Brooks et al. 2019 unprocessing).

Content: the photographs in ``--photos`` (8-bit sRGB PNGs, read in place, never copied), the colour images
scikit-image bundles (when it is installed), and procedural dead leaves (Achddou et al. 2021). Each crop is
unprocessed the way a camera would have recorded it:

    sRGB crop -> inverse sRGB transfer -> random exposure -> random camera matrix (rgb -> white-balanced camera
    RGB, rows sum to 1) -> divide by random white-balance gains (raw) -> Bayer mosaic -> Poisson-Gaussian noise
    (variance ``shot * x + read``, Gaussian approximation) -> clip to [0, 1] (saturation, black clip as
    ``normalize_levels`` does) -> multiply by the gains again (the enhancer's white-balanced input).

The target is the clean white-balanced camera RGB with the same saturation (``min(cam, gain)``). The noise the
network is told is the white-balanced model ``shot_c = g_c shot``, ``read_c = g_c^2 read`` (as the renderer
computes it), jittered a little, and sometimes replaced by a signal-independent equivalent, the form
``services.pipeline.shot.estimate_noise`` returns for files without a NoiseProfile.

Held out (never trained on): photos :data:`HELD_OUT_PHOTOS` and dead leaves seeds
:data:`DEAD_LEAVES_HELD_OUT_SEEDS`; with recipe ``v2`` also the scikit-image photographs, a source of another
origin than the training photographs (:func:`held_out_batches` scores them apart).

Recipe ``v2`` (the ``strata_jdd_v2`` package, :class:`Recipe`) adds what the first package lacked for photographs
it has never seen: procedural hard patterns (gratings, zone plates, hatching and thin strokes near the sampling
limit, where demosaickers alias: Gharbi et al. 2016 mined such patches), crops downscaled with an anti-aliasing
filter (denser detail than these web photographs), real fine texture (grain) in the scene, and saturation
variety. ``lab/synth/unprocess.py`` (colour engineer) will own the shared
unprocessing; until then this module is the reference and its constants are the ones to align on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from services.pipeline.ops import SRGB_TO_XYZ_D65, cfa_masks, srgb_decode, srgb_encode
from services.pipeline.ops.merge import frame_noise_share
from training.patterns import SHORTEST_PERIOD, hard_pattern

HELD_OUT_PHOTOS: tuple[str, ...] = tuple(f"{i:03d}.png" for i in range(33, 41))
DEAD_LEAVES_HELD_OUT_SEEDS = range(900_000, 900_016)
DEAD_LEAVES_TRAIN_SEED_BASE = 0  # training pools use seeds base + seed * 10_000 + i, far below the held-out range
# Evaluation noise levels in normalised raw units (variance = shot * x + read before white balance).
NOISE_LEVELS: dict[str, tuple[float, float]] = {
    "none": (0.0, 0.0),
    "low": (2e-4, 1e-6),
    "mid": (2e-3, 1e-5),
    "high": (1e-2, 1e-4),
}
# XYZ -> camera matrices (D65): the four of Brooks et al. 2019 (Canon 5D Mark II, Canon 5D, Nikon D700,
# Nikon D3) and the Phase One P 65+ ColorMatrix1 that lab/synth/synth.py renders with (dcraw adobe_coeff).
XYZ_TO_CAMS = np.array(
    [
        [[1.0234, -0.2969, -0.2266], [-0.5625, 1.6328, -0.0469], [-0.0703, 0.2188, 0.6406]],
        [[0.4913, -0.0541, -0.0202], [-0.6130, 1.3513, 0.2906], [-0.1564, 0.2151, 0.7183]],
        [[0.8380, -0.2630, -0.0639], [-0.2887, 1.0725, 0.2496], [-0.0627, 0.1427, 0.5438]],
        [[0.6596, -0.2079, -0.0562], [-0.4782, 1.3016, 0.1933], [-0.0970, 0.1581, 0.5181]],
        [[0.8035, 0.0435, -0.0962], [-0.6001, 1.3872, 0.2320], [-0.1159, 0.3065, 0.5434]],
    ]
)
SKIMAGE_IMAGES: tuple[str, ...] = ("astronaut", "chelsea", "coffee", "rocket")
# "patterns": recipe v2's fixed pool of pattern_image scenes; "hard": a new training.patterns.hard_pattern per crop
_SOURCE_WEIGHTS = {"photos": 0.5, "skimage": 0.1, "dead_leaves": 0.4, "patterns": 0.0, "hard": 0.0}


@dataclass(frozen=True)
class Recipe:
    """What a training run draws: source weights and the v2 augmentations (shares of crops / images)."""

    name: str
    weights: dict[str, float]
    upscale_share: float = 0.35  # crops taken smaller and enlarged 1.25x-upscale_max (bicubic)
    downscale_share: float = 0.0  # crops taken larger and reduced 1.25-2x (area filter): denser content
    grain_share: float = 0.0  # images given fine scene texture (film grain), std 0.5-4 / 255 in sRGB
    saturation_share: float = 0.0  # images with saturation scaled by 0.5-1.5
    upscale_max: float = 2.0  # the largest enlargement of an upscaled crop
    gray_share: float = 0.0  # images made neutral (luma only): monochrome scenes, grey products, B&W prints
    hard_min_period: float = SHORTEST_PERIOD  # the hard scenes' shortest period, px (training.patterns)
    hard_hue_share: float = 0.0  # of the hard scenes, fine texture in one saturated hue (training.patterns)


RECIPES: dict[str, Recipe] = {
    "v1": Recipe("v1", dict(_SOURCE_WEIGHTS)),
    # skimage's photographs are held out in v2: an evaluation source of another origin than the training one
    "v2": Recipe("v2", {"photos": 0.5, "skimage": 0.0, "dead_leaves": 0.3, "patterns": 0.2},
                 upscale_share=0.25, downscale_share=0.3, grain_share=0.2, saturation_share=0.3),
    # a fine-tuning recipe for the best package (issue 17): more soft (lens-limited, enlarged up to 3x) and
    # neutral content, scikit-image held out; used from the v2 weights (``--init``)
    "soft": Recipe("soft", {"photos": 0.55, "skimage": 0.0, "dead_leaves": 0.45, "patterns": 0.0},
                   upscale_share=0.5, upscale_max=3.0, saturation_share=0.2, gray_share=0.15),
    # soft plus 15 % of crops of procedural hard content drawn anew per crop (training/patterns.py): detail at the
    # sampling limit, fine texture beside flat black / white, neutral fine texture (issue 17, QUALITY.md "Artefacts
    # found from outside"); photographs stay the bulk
    "patterns": Recipe("patterns", {"photos": 0.5, "skimage": 0.0, "dead_leaves": 0.35, "patterns": 0.0, "hard": 0.15},
                       upscale_share=0.5, upscale_max=3.0, saturation_share=0.2, gray_share=0.15),
}


def with_hard_share(recipe: Recipe, share: float) -> Recipe:
    """``recipe`` with a share ``share`` of its crops drawn by :func:`training.patterns.hard_pattern` (source
    ``hard``), the other sources scaled to keep their proportions (``--hard-share``)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"hard share must be in [0, 1), got {share}")
    rest = {k: v for k, v in recipe.weights.items() if k != "hard"}
    total = sum(rest.values())
    weights = {**{k: v * (1.0 - share) / total for k, v in rest.items()}, "hard": share}
    return replace(recipe, name=f"{recipe.name}-hard{share:g}", weights=weights)


def with_hard_hue_share(recipe: Recipe, share: float) -> Recipe:
    """``recipe`` whose hard scenes are, a share ``share`` of them, fine texture in one saturated hue at two shades
    (``--hard-hue-share``; :func:`training.patterns.hard_pattern`)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the hard scenes' hue share must be in [0, 1], got {share}")
    return replace(recipe, name=f"{recipe.name}-hue{share:g}", hard_hue_share=share)


def with_hard_min_period(recipe: Recipe, period: float) -> Recipe:
    """``recipe`` whose hard scenes' gratings, checkerboards and woven stripes are at least ``period`` px long
    (2-4; ``--hard-min-period``): 3 leaves out the 2-px patterns whose mosaic is a saturated colour's."""
    if not 2.0 <= period <= 4.0:
        raise ValueError(f"the hard scenes' shortest period must be 2-4 px, got {period}")
    return replace(recipe, name=f"{recipe.name}-minp{period:g}", hard_min_period=period)


# ----------------------------------------------------------------------------------------------- content


def photo_paths(directory: str | Path, held_out: bool) -> list[Path]:
    """The training (or held-out) PNG photographs in ``directory``, sorted by name."""
    paths = sorted(Path(directory).glob("*.png"))
    if not paths:
        raise FileNotFoundError(f"no *.png photographs in {directory}")
    return [p for p in paths if (p.name in HELD_OUT_PHOTOS) == held_out]


def _load_rgb8(path: Path) -> Tensor:
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)  # (3, H, W) uint8


def load_photos(directory: str | Path, held_out: bool, device: torch.device) -> list[Tensor]:
    """Photographs as (3, H, W) uint8 tensors on ``device``."""
    return [_load_rgb8(p).to(device) for p in photo_paths(directory, held_out)]


def skimage_images(device: torch.device) -> list[Tensor]:
    """The bundled scikit-image colour photographs as (3, H, W) uint8; empty when scikit-image is missing."""
    try:
        from skimage import data
    except ImportError:
        return []
    out = []
    for name in SKIMAGE_IMAGES:
        try:
            arr = np.asarray(getattr(data, name)())
        except Exception:  # noqa: BLE001 - a missing bundled file must not stop training (no network)
            continue
        if arr.ndim == 3 and arr.shape[2] >= 3:
            out.append(torch.from_numpy(np.ascontiguousarray(arr[..., :3])).permute(2, 0, 1).to(device))
    return out


def dead_leaves(seed: int, size: int, r_min: float = 1.5, coverage: float = 4.0) -> Tensor:
    """A dead-leaves image (3, size, size) uint8 sRGB: opaque discs, radii ~ r^-3, over a gradient.

    Rendered at 2x and box-averaged (anti-aliased edges); discs get a random flat colour with a slight
    per-disc linear shading so regions are not perfectly flat. Deterministic in ``seed``.
    """
    rng = np.random.default_rng(seed)
    s2 = 2 * size
    r_max = size / 3.0
    yy, xx = np.mgrid[0:s2, 0:s2].astype(np.float32) / s2
    c0, c1 = rng.random(3), rng.random(3)
    img = (c0[:, None, None] * (1 - yy) + c1[:, None, None] * yy).astype(np.float32)  # (3, 2S, 2S)
    mean_area = math.pi * 2 * r_min**2 * math.log(r_max / r_min)
    n = int(coverage * size * size / mean_area)
    u = rng.random(n)
    radii = (r_min**-2 - u * (r_min**-2 - r_max**-2)) ** -0.5 * 2  # in 2x pixels
    centres = rng.random((n, 2)) * s2
    colours = rng.random((n, 3)) ** 1.3
    shades = rng.normal(0.0, 0.15, (n, 2))
    for (cy, cx), r, col, (gy, gx) in zip(centres, radii, colours, shades, strict=True):
        y0, y1 = max(int(cy - r), 0), min(int(cy + r) + 2, s2)
        x0, x1 = max(int(cx - r), 0), min(int(cx + r) + 2, s2)
        if y0 >= y1 or x0 >= x1:
            continue
        dy = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
        dx = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
        inside = dy * dy + dx * dx <= r * r  # (h, w)
        shade = 1.0 + (gy * dy + gx * dx) / max(r, 1.0)
        patch = img[:, y0:y1, x0:x1]
        val = np.clip(col[:, None, None] * shade[None], 0.0, 1.0)
        img[:, y0:y1, x0:x1] = np.where(inside[None], val, patch)
    small = img.reshape(3, size, 2, size, 2).mean(axis=(2, 4))
    return torch.from_numpy(np.round(small * 255.0).astype(np.uint8))


def pattern_image(seed: int, size: int) -> Tensor:
    """A procedural hard pattern (3, size, size) uint8 sRGB, deterministic in ``seed``: the content that makes
    demosaickers alias (zippers, mazes, colour moire). One of: an oriented sine grating or a square-wave stripe
    pattern up to near the sampling limit, a zone plate (a chirp through every frequency), cross hatching, or thin
    strokes at random angles; in two random colours over a soft gradient. Rendered at 2x and box-averaged."""
    rng = np.random.default_rng(seed)
    s2 = 2 * size
    yy, xx = np.mgrid[0:s2, 0:s2].astype(np.float32) / 2.0  # output-pixel units
    kind = int(rng.integers(5))
    theta = rng.uniform(0, math.pi)
    u = xx * math.cos(theta) + yy * math.sin(theta)
    if kind == 0:  # sine grating, 0.05-0.45 cycles per pixel
        t = 0.5 + 0.5 * np.sin(2 * math.pi * rng.uniform(0.05, 0.45) * u + rng.uniform(0, 2 * math.pi))
    elif kind == 1:  # square-wave stripes (sharp edges), period 2.2-12 pixels
        t = (np.mod(u / rng.uniform(2.2, 12.0), 1.0) < rng.uniform(0.3, 0.7)).astype(np.float32)
    elif kind == 2:  # zone plate centred anywhere: frequency rises to ~0.5 cycles/pixel at the far corner
        cy, cx = rng.uniform(0, size, 2)
        r2 = (yy - cy) ** 2 + (xx - cx) ** 2
        k = 0.5 * math.pi / (math.sqrt(2.0) * size) * rng.uniform(0.5, 1.0)  # local frequency k r / pi
        t = 0.5 + 0.5 * np.cos(k * r2)
    elif kind == 3:  # cross hatching: two square waves at different angles and periods
        v = xx * math.cos(theta + rng.uniform(0.4, 1.2)) + yy * math.sin(theta + rng.uniform(0.4, 1.2))
        t = ((np.mod(u / rng.uniform(2.5, 9.0), 1.0) < 0.5) ^ (np.mod(v / rng.uniform(2.5, 9.0), 1.0) < 0.5))
        t = t.astype(np.float32)
    else:  # thin strokes: lines 0.6-2.5 px wide at random positions and angles (text, wires, hair)
        t = np.zeros((s2, s2), np.float32)
        for _ in range(int(rng.integers(20, 80))):
            a = rng.uniform(0, math.pi)
            d = (xx - rng.uniform(0, size)) * math.sin(a) - (yy - rng.uniform(0, size)) * math.cos(a)
            t = np.maximum(t, (np.abs(d) < rng.uniform(0.3, 1.25)).astype(np.float32))
    c0, c1 = rng.random(3) ** 1.2, rng.random(3) ** 1.2
    ramp = (yy / size)[None] * rng.normal(0.0, 0.15, (3, 1, 1))
    img = np.clip(c0[:, None, None] * (1 - t) + c1[:, None, None] * t + ramp, 0.0, 1.0)  # (3, 2S, 2S)
    small = img.reshape(3, size, 2, size, 2).mean(axis=(2, 4))
    return torch.from_numpy(np.round(small * 255.0).astype(np.uint8))


# ----------------------------------------------------------------------------------------------- unprocess


def rgb_to_cam(weights: Tensor) -> Tensor:
    """Linear sRGB -> white-balanced camera RGB (B, 3, 3): a convex mix of :data:`XYZ_TO_CAMS` (weights (B, K)),
    times sRGB -> XYZ, rows normalised to sum to 1 (white stays white after white balance)."""
    xyz_to_cams = torch.as_tensor(XYZ_TO_CAMS, dtype=torch.float32, device=weights.device)  # (K, 3, 3)
    w = weights / weights.sum(dim=1, keepdim=True)  # (B, K)
    xyz_to_cam = torch.einsum("bk,kij->bij", w, xyz_to_cams)  # (B, 3, 3)
    rgb_to_xyz = torch.as_tensor(SRGB_TO_XYZ_D65, dtype=torch.float32, device=weights.device)
    m = xyz_to_cam @ rgb_to_xyz  # (B, 3, 3)
    return m / m.sum(dim=2, keepdim=True)


def mosaic_of(rgb: Tensor, cfa: str) -> Tensor:
    """(B, 3, H, W) -> (B, 1, H, W) Bayer mosaic of phase ``cfa``."""
    masks = cfa_masks(cfa, rgb.shape[-2], rgb.shape[-1], rgb.device, rgb.dtype)  # (3, H, W)
    return (rgb * masks).sum(dim=1, keepdim=True)


def apply_matrix_batch(rgb: Tensor, m: Tensor) -> Tensor:
    """Per-image 3x3 matrix: (B, 3, H, W), (B, 3, 3) -> (B, 3, H, W)."""
    return torch.einsum("bij,bjhw->bihw", m, rgb)


@dataclass
class RawBatch:
    """One batch: white-balanced noisy mosaics, clean targets, and what the renderer would know."""

    mosaic: Tensor  # (B, 1, H, W) white-balanced, clipped, noisy; CFA phase ``cfa``
    target: Tensor  # (B, 3, H - 2m, W - 2m) clean white-balanced camera RGB (saturated as the raw was)
    shot: Tensor  # (B, 3) reported white-balanced noise model
    read: Tensor  # (B, 3)
    cam_to_rgb: Tensor  # (B, 3, 3) white-balanced camera RGB -> linear sRGB (the renderer's rgb_cam)
    cfa: str


def unprocess(srgb: Tensor, *, cfa: str, margin: int, gen: torch.Generator, shot: Tensor, read: Tensor,
              exposure: Tensor, gains: Tensor, mix: Tensor, report_jitter: bool) -> RawBatch:
    """(B, 3, H, W) sRGB in [0, 1] -> :class:`RawBatch`; ``margin`` pixels each side are context only.

    ``shot``/``read`` (B,) raw-domain noise; ``exposure`` (B,); ``gains`` (B, 3) white balance; ``mix`` (B, K)
    camera-matrix weights; ``gen`` draws the noise (and the report jitter when ``report_jitter``).
    """
    b = srgb.shape[0]
    lin = srgb_decode(srgb.clamp(0.0, 1.0)) * exposure.view(b, 1, 1, 1)  # (B, 3, H, W) linear sRGB
    m = rgb_to_cam(mix)  # (B, 3, 3)
    cam = apply_matrix_batch(lin, m).clamp(min=0.0)  # (B, 3, H, W) white-balanced camera RGB
    g = gains.view(b, 3, 1, 1)
    raw = mosaic_of(cam / g, cfa)  # (B, 1, H, W) before white balance
    std = (shot.view(b, 1, 1, 1) * raw + read.view(b, 1, 1, 1)).sqrt()
    noise = torch.randn(raw.shape, generator=gen, device=raw.device, dtype=raw.dtype)
    noisy = (raw + std * noise).clamp(0.0, 1.0)
    wb = noisy * mosaic_of(g.expand_as(cam), cfa)  # (B, 1, H, W)
    target = torch.minimum(cam, g)  # saturation where the raw clipped
    if margin:
        target = target[..., margin:-margin, margin:-margin]
    shot_c = shot.view(b, 1) * gains  # (B, 3)
    read_c = read.view(b, 1) * gains * gains
    if report_jitter:
        shot_c, read_c = _jitter_report(shot_c, read_c, gen)
    return RawBatch(mosaic=wb, target=target, shot=shot_c, read=read_c, cam_to_rgb=torch.linalg.inv(m), cfa=cfa)


def _jitter_report(shot_c: Tensor, read_c: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Noise the renderer reports is an estimate: scale by ~10 %, and for 1 in 5 images give the
    signal-independent equivalent at a mid level (what ``estimate_noise`` returns without a NoiseProfile)."""
    b, dev = shot_c.shape[0], shot_c.device
    scale = torch.exp(0.1 * torch.randn(b, 1, generator=gen, device=dev))
    level = 0.05 + 0.3 * torch.rand(b, 1, generator=gen, device=dev)
    flat = torch.rand(b, 1, generator=gen, device=dev) < 0.2
    shot_r = torch.where(flat, torch.zeros_like(shot_c), shot_c) * scale
    read_r = torch.where(flat, shot_c * level + read_c, read_c) * scale
    return shot_r, read_r


def sample_noise(b: int, gen: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor]:
    """Raw-domain (shot, read) (B,) each: 10 % noise-free, else log-uniform shot in [5e-5, 2e-2] and read from
    Brooks' log-linear relation with scatter."""
    log_shot = torch.empty(b, device=device).uniform_(math.log(5e-5), math.log(2e-2), generator=gen)
    log_read = 2.18 * log_shot + 1.2 + 0.26 * torch.randn(b, generator=gen, device=device)
    clean = torch.rand(b, generator=gen, device=device) < 0.1
    shot = torch.where(clean, torch.zeros(b, device=device), log_shot.exp())
    read = torch.where(clean, torch.zeros(b, device=device), log_read.exp())
    return shot, read


# ----------------------------------------------------------------------------------------------- sources


UPSCALE_SHARE = RECIPES["v1"].upscale_share


def _pool(make: object, seeds: list[int], size: int, device: torch.device) -> list[Tensor]:
    """Procedural images made on a thread pool (NumPy releases the GIL in its array work)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as ex:
        images = list(ex.map(lambda s: make(s, size), seeds))  # type: ignore[operator]
    return [im.to(device) for im in images]


class TrainingSource:
    """Random (B, 3, size, size) sRGB crops from the content pools, with flips and transposes."""

    def __init__(self, photos: str | Path, device: torch.device, seed: int, dead_leaves_pool: int = 48,
                 dead_leaves_size: int = 384, recipe: Recipe | str = "v1") -> None:
        self.device = device
        self.recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
        weights = self.recipe.weights
        base = DEAD_LEAVES_TRAIN_SEED_BASE + seed * 10_000
        self.pools: dict[str, list[Tensor]] = {
            "photos": load_photos(photos, held_out=False, device=device),
            "skimage": skimage_images(device) if weights.get("skimage", 0) > 0 else [],
            "dead_leaves": _pool(dead_leaves, [base + i for i in range(dead_leaves_pool)], dead_leaves_size, device),
            "patterns": (_pool(pattern_image, [base + 5_000 + i for i in range(dead_leaves_pool)], dead_leaves_size,
                               device) if weights.get("patterns", 0) > 0 else []),
        }
        self.names = [k for k, v in self.pools.items() if v and weights.get(k, 0) > 0]
        if weights.get("hard", 0) > 0:  # no pool: training.patterns.hard_pattern draws a new scene per crop
            self.names.append("hard")
        w = np.array([weights[k] for k in self.names])
        self.weights = w / w.sum()
        self.rng = np.random.default_rng(seed)

    def describe(self) -> dict[str, int]:
        """Images per content pool (``hard``: -1, a new scene per crop)."""
        return {k: len(self.pools.get(k, [])) or -1 for k in self.names}

    def crops(self, b: int, size: int) -> Tensor:
        """(B, 3, size, size) float sRGB in [0, 1].

        Scale augmentation: a share of the crops (``recipe.upscale_share``) is taken smaller and enlarged by
        1.25 to ``recipe.upscale_max`` times (bicubic), so the network also sees content softer than these
        downscaled web photographs, as a lens-limited medium-format frame often is; with recipe v2 another share
        (``downscale_share``) is taken larger and reduced by up to 2x with an area filter, so it also sees denser
        detail than they hold.
        """
        out = []
        for src in self.rng.choice(len(self.names), size=b, p=self.weights):
            if self.names[src] == "hard":  # its own scale variety; flips and transposes as for every crop
                crop = hard_pattern(self.rng, size, self.device, self.recipe.hard_min_period,
                                    self.recipe.hard_hue_share) * 255.0
            else:
                crop = self._crop(self.names[src], size)
            if self.rng.random() < 0.5:
                crop = crop.flip(-1)
            if self.rng.random() < 0.5:
                crop = crop.flip(-2)
            if self.rng.random() < 0.5:
                crop = crop.transpose(-1, -2)
            out.append(crop)
        return torch.stack(out) / 255.0

    def _crop(self, name: str, size: int) -> Tensor:
        """A (3, size, size) float crop in [0, 255] of a random image of pool ``name``, enlarged or reduced as the
        recipe draws (:meth:`crops`)."""
        pool = [im for im in self.pools[name] if min(im.shape[-2:]) >= size]
        if not pool:
            raise ValueError(f"no {name} image is at least {size} pixels on each side")
        im = pool[self.rng.integers(len(pool))]
        take, down = size, False
        # v1 draws its scale roll after the position (its runs repeat exactly); v2 needs it first
        roll = self.rng.random() if self.recipe.downscale_share > 0 else -1.0
        if roll >= 1.0 - self.recipe.downscale_share:
            take = int(size * self.rng.uniform(1.25, min(2.0, min(im.shape[-2:]) / size)))
            down = take > size
        y = int(self.rng.integers(im.shape[-2] - take + 1))
        x = int(self.rng.integers(im.shape[-1] - take + 1))
        roll = roll if roll >= 0 else self.rng.random()
        crop = im[:, y : y + take, x : x + take].float()
        if down:
            return F.interpolate(crop[None], size=(size, size), mode="area")[0]  # (3, size, size)
        if roll < self.recipe.upscale_share:
            small = max(16, int(round(size / self.rng.uniform(1.25, self.recipe.upscale_max))))
            crop = F.interpolate(crop[None, :, :small, :small], size=(size, size), mode="bicubic",
                                 align_corners=False)[0].clamp(0, 255)  # (3, size, size)
        return crop


def scene_variety(srgb: Tensor, recipe: Recipe, gen: torch.Generator) -> Tensor:
    """The recipes' per-image scene augmentations on (B, 3, H, W) sRGB: a share made neutral (luma only),
    saturation scaled by 0.5-1.5 for a share of the images, and fine texture added to the scene for another
    share (film grain, fabric, foliage at the limit of resolution: detail that is really there, which a
    noise-free input must keep): Gaussian, std 0.5-4 / 255, monochrome or coloured, half of it softened by a
    3x3 blur."""
    b, dev = srgb.shape[0], srgb.device
    luma_weights = torch.tensor([0.2126, 0.7152, 0.0722], device=dev).view(1, 3, 1, 1)
    if recipe.gray_share > 0:
        pick = (torch.rand(b, 1, 1, 1, generator=gen, device=dev) < recipe.gray_share).float()
        luma = (srgb * luma_weights).sum(1, keepdim=True)
        srgb = pick * luma.expand_as(srgb) + (1 - pick) * srgb
    if recipe.saturation_share > 0:
        pick = (torch.rand(b, 1, 1, 1, generator=gen, device=dev) < recipe.saturation_share).float()
        s = 1.0 + pick * (torch.rand(b, 1, 1, 1, generator=gen, device=dev) - 0.5)
        luma = (srgb * luma_weights).sum(1, keepdim=True)
        srgb = (luma + s * (srgb - luma)).clamp(0.0, 1.0)
    if recipe.grain_share > 0:
        pick = (torch.rand(b, 1, 1, 1, generator=gen, device=dev) < recipe.grain_share).float()
        std = pick * (0.5 + 3.5 * torch.rand(b, 1, 1, 1, generator=gen, device=dev)) / 255.0
        mono = torch.randn(b, 1, *srgb.shape[-2:], generator=gen, device=dev)
        colour = torch.randn(srgb.shape, generator=gen, device=dev)
        mix = torch.rand(b, 1, 1, 1, generator=gen, device=dev)
        grain = mix * mono + (1 - mix) * colour
        soft = F.avg_pool2d(F.pad(grain, (1, 1, 1, 1), mode="reflect"), 3, stride=1) * 3.0  # same std, softer
        blur = (torch.rand(b, 1, 1, 1, generator=gen, device=dev) < 0.5).float()
        srgb = (srgb + std * (blur * soft + (1 - blur) * grain)).clamp(0.0, 1.0)
    return srgb


def training_batch(source: TrainingSource, b: int, size: int, margin: int, gen: torch.Generator) -> RawBatch:
    """A batch of RGGB canvases of ``size + 2 margin``; targets are the central ``size`` x ``size``.

    RGGB only: the enhancer maps every CFA phase onto RGGB exactly (a shift of the canvas), so a random phase
    in training would be a relabelling; the content's position relative to the CFA is random anyway.
    """
    dev = source.device
    srgb = scene_variety(source.crops(b, size + 2 * margin), source.recipe, gen)
    shot, read = sample_noise(b, gen, dev)
    exposure = torch.empty(b, device=dev).uniform_(math.log(0.4), math.log(1.6), generator=gen).exp()
    red = torch.empty(b, device=dev).uniform_(1.6, 2.6, generator=gen)
    blue = torch.empty(b, device=dev).uniform_(1.3, 2.2, generator=gen)
    gains = torch.stack([red, torch.ones(b, device=dev), blue], dim=1)  # (B, 3)
    mix = torch.rand(b, len(XYZ_TO_CAMS), generator=gen, device=dev) + 1e-3
    return unprocess(srgb, cfa="RGGB", margin=margin, gen=gen, shot=shot, read=read, exposure=exposure,
                     gains=gains, mix=mix, report_jitter=True)


# Stacks (the frames' package): each frame sees the scene moved by a whole pixel or not in each direction, so the
# frames sample every colour at other sites, as a stack's sub-pixel shifts do
STACK_OFFSETS = ((0, 0), (0, 1), (1, 0), (1, 1))
SUBPIXEL_TRIM = 6  # pixels a side a sub-pixel stack's square loses: the Lanczos-5 warp's taps (5) and a guard pixel


@dataclass
class StackBatch:
    """``stacks`` stacks of ``frames`` frames each, frame-major within a stack: ``raw.mosaic`` (stacks * frames, 1,
    S + 2m, S + 2m) and the noise each frame is told (``raw.shot``/``raw.read``: the stack's merge told,
    :func:`stack_told`); ``offsets[i]``: where frame i's canvas starts in the stack's scene, (dy, dx) in {0, 1}.
    A frame's output (S x S, :func:`training.train.predict`) covers scene rows and columns ``offset + m`` on; all
    frames share the scene's ``[m + 1, m + S)`` square, whose clean target is ``target`` (stacks, 3, S - 1, S - 1).
    With ``fractions`` (sub-pixel stacks) frame i's canvas starts at ``offsets[i] + fractions[i]``: :func:`aligned`
    resamples each frame's output onto frame 0's grid with the service's stack warp (Lanczos-5) and keeps the
    square less :data:`SUBPIXEL_TRIM` pixels a side (the warp's clamped edges); ``target`` likewise."""

    raw: RawBatch
    target: Tensor
    offsets: list[tuple[int, int]]
    stacks: int
    frames: int
    fractions: list[tuple[float, float]] | None = None


def stack_told(frames: int) -> float:
    """The share of its noise a frame of a stack of ``frames`` is told by the merge (services.pipeline.stack)."""
    return frame_noise_share(frames)


def aligned(out: Tensor, batch: StackBatch) -> Tensor:
    """(stacks * frames, 3, S, S) outputs -> (stacks, frames, 3, S - 1, S - 1): each frame's part of the square
    all frames share."""
    s = out.shape[-1]
    views = out.view(batch.stacks, batch.frames, *out.shape[1:])
    if batch.fractions is None:
        return torch.stack([views[:, i, :, 1 - dy : s - dy, 1 - dx : s - dx]
                            for i, (dy, dx) in enumerate(batch.offsets)], dim=1)
    t = SUBPIXEL_TRIM
    moved = lanczos_shift(views, [f[0] for f in batch.fractions], dim=-2)
    moved = lanczos_shift(moved, [f[1] for f in batch.fractions], dim=-1)
    return torch.stack([moved[:, i, :, 1 - dy + t : s - dy - t, 1 - dx + t : s - dx - t]
                        for i, (dy, dx) in enumerate(batch.offsets)], dim=1)


def lanczos_shift(frames: Tensor, fractions: list[float], dim: int, a: int = 5) -> Tensor:
    """(stacks, frames, C, H, W) with frame i sampled at ``-fractions[i]`` along ``dim`` (-2 rows, -1 columns), each
    in [0, 1): what the stack merge's Lanczos-``a`` warp (:func:`services.pipeline.ops.align.warp`) computes under
    that constant flow (the same 2a taps and normalised weights, edges clamped), as 2a weighted slices of the whole
    batch: differentiable and cheap."""
    n = frames.shape[dim]
    taps = torch.arange(1 - a, a + 1, dtype=torch.float64)  # around base y - 1, at fraction 1 - f
    x = math.pi * ((1.0 - torch.tensor(fractions, dtype=torch.float64))[:, None] - taps[None, :])  # (frames, 2a)
    k = torch.where(x.abs() < 1e-9, torch.ones_like(x), a * torch.sin(x) * torch.sin(x / a) / x.square().clamp(1e-24))
    weights = (k / k.sum(dim=1, keepdim=True)).to(frames.dtype).to(frames.device)  # (frames, 2a)
    pad = (a, a, 0, 0) if dim == -1 else (0, 0, a, a)  # F.pad's order: last dimension first
    flat = F.pad(frames.flatten(0, 1), pad, mode="replicate")  # (stacks * frames, C, H', W')
    padded = flat.view(*frames.shape[:2], *flat.shape[1:])
    out = torch.zeros_like(frames)
    for j, tap in enumerate(range(1 - a, a + 1)):
        start = a - 1 + tap  # input index y - 1 + tap, shifted by the padding
        out += weights[:, j].view(1, -1, 1, 1, 1) * padded.narrow(dim, start, n)
    return out


def fourier_shift(x: Tensor, fy: float, fx: float, pad: int = 16) -> Tensor:
    """(N, C, H, W) sampled at ``(y + fy, x + fx)`` by a phase ramp: the band-limited shift (a sub-pixel frame of a
    scene, not the service's warp), borders reflected so the image's edges do not ring into it."""
    h, w = x.shape[-2:]
    pad = min(pad, h - 1, w - 1)
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    ky = torch.fft.fftfreq(padded.shape[-2], device=x.device).view(-1, 1)
    kx = torch.fft.rfftfreq(padded.shape[-1], device=x.device).view(1, -1)
    ramp = torch.exp(2j * math.pi * (ky * fy + kx * fx))
    moved = torch.fft.irfft2(torch.fft.rfft2(padded) * ramp, s=padded.shape[-2:])
    return moved[..., pad : pad + h, pad : pad + w]


def stack_of(srgb: Tensor, frames: int, margin: int, gen: torch.Generator, *, shot: Tensor, read: Tensor,
             exposure: Tensor, gains: Tensor, mix: Tensor, report_jitter: bool, subpixel: bool = False) -> StackBatch:
    """(stacks, 3, L + 1, L + 1) sRGB scenes (L = S + 2 margin) -> :class:`StackBatch`: every frame of a stack with
    the stack's exposure, white balance, camera and noise level, its own noise draw and offset (frame 0 at (0, 0),
    the others through :data:`STACK_OFFSETS` in a random order), told :func:`stack_told` of the noise. With
    ``subpixel`` every frame but the first also moves by a random fraction of a pixel on each axis
    (:func:`fourier_shift` of the linear scene)."""
    stacks, length = srgb.shape[0], srgb.shape[-1] - 1
    order = torch.randperm(len(STACK_OFFSETS) - 1, generator=gen, device=gen.device).tolist()
    rest = [STACK_OFFSETS[1 + k] for k in order]
    offsets = [STACK_OFFSETS[0], *(rest * frames)][:frames]
    fractions = None
    if subpixel:
        draws = torch.rand(frames - 1, 2, generator=gen, device=gen.device).tolist()
        fractions = [(0.0, 0.0), *((float(a), float(b)) for a, b in draws)]
        linear = srgb_decode(srgb.clamp(0.0, 1.0))
        moved = [srgb if not (fy or fx) else srgb_encode(fourier_shift(linear, fy, fx).clamp(0.0, 1.0))
                 for fy, fx in fractions]
        scenes = torch.stack([m[..., dy : dy + length, dx : dx + length] for m, (dy, dx) in zip(moved, offsets,
                                                                                                strict=True)], dim=1)
    else:
        scenes = torch.stack([srgb[..., dy : dy + length, dx : dx + length] for dy, dx in offsets], dim=1)
    per = {k: v.repeat_interleave(frames, dim=0) for k, v in
           {"shot": shot, "read": read, "exposure": exposure, "gains": gains, "mix": mix}.items()}
    raw = unprocess(scenes.flatten(0, 1), cfa="RGGB", margin=margin, gen=gen, report_jitter=False, **per)
    told = stack_told(frames)
    shot_c, read_c = raw.shot[::frames], raw.read[::frames]
    if report_jitter:
        shot_c, read_c = _jitter_report(shot_c, read_c, gen)
    raw.shot = shot_c.repeat_interleave(frames, dim=0) * told
    raw.read = read_c.repeat_interleave(frames, dim=0) * told
    batch = StackBatch(raw=raw, target=raw.target, offsets=offsets, stacks=stacks, frames=frames, fractions=fractions)
    batch.target = aligned(raw.target, batch)[:, 0]
    return batch


def training_stack_batch(source: TrainingSource, frames_per_step: int, size: int, margin: int,
                         gen: torch.Generator, frames: int, subpixel: bool = False) -> StackBatch:
    """About ``frames_per_step`` frames in stacks of ``frames``, from the source's content, with the noise and
    colour variety of :func:`training_batch` (each stack one draw)."""
    dev = source.device
    b = max(1, frames_per_step // frames)
    srgb = scene_variety(source.crops(b, size + 2 * margin + 1), source.recipe, gen)
    shot, read = sample_noise(b, gen, dev)
    exposure = torch.empty(b, device=dev).uniform_(math.log(0.4), math.log(1.6), generator=gen).exp()
    red = torch.empty(b, device=dev).uniform_(1.6, 2.6, generator=gen)
    blue = torch.empty(b, device=dev).uniform_(1.3, 2.2, generator=gen)
    gains = torch.stack([red, torch.ones(b, device=dev), blue], dim=1)
    mix = torch.rand(b, len(XYZ_TO_CAMS), generator=gen, device=dev) + 1e-3
    return stack_of(srgb, frames, margin, gen, shot=shot, read=read, exposure=exposure, gains=gains, mix=mix,
                    report_jitter=True, subpixel=subpixel)


def held_out_stacks(photos: str | Path, device: torch.device, margin: int, size: int = 128,
                    frames: tuple[int, ...] = (4, 8), per_photo: int = 2, subpixel: bool = False
                    ) -> dict[str, StackBatch]:
    """Fixed evaluation stacks at mid noise (:data:`NOISE_LEVELS`) from the held-out photographs: one
    :class:`StackBatch` per stack size, named ``"<frames> frames"``."""
    rng = np.random.default_rng(24680)
    length = size + 2 * margin + 1
    crops = _random_crops(load_photos(photos, held_out=True, device=device), rng, length, per_photo)
    if not crops:
        return {}
    srgb = torch.stack(crops).float() / 255.0
    n = srgb.shape[0]
    gains = torch.tensor(np.stack([rng.uniform(1.7, 2.5, n), np.ones(n), rng.uniform(1.4, 2.1, n)], 1),
                         dtype=torch.float32, device=device)
    mix = torch.tensor(rng.random((n, len(XYZ_TO_CAMS))) + 1e-3, dtype=torch.float32, device=device)
    exposure = torch.tensor(np.exp(rng.uniform(math.log(0.5), math.log(1.3), n)), dtype=torch.float32, device=device)
    shot, read = NOISE_LEVELS["mid"]
    out = {}
    for count in frames:
        gen = torch.Generator(device=device).manual_seed(4242 + count)
        out[f"{count} frames"] = stack_of(srgb, count, margin, gen, shot=torch.full((n,), shot, device=device),
                                          read=torch.full((n,), read, device=device), exposure=exposure,
                                          gains=gains, mix=mix, report_jitter=False, subpixel=subpixel)
    return out


def held_out_batches(photos: str | Path, device: torch.device, size: int = 192, per_photo: int = 2,
                     dead_leaves_count: int = 8) -> dict[str, list[RawBatch]]:
    """Fixed evaluation sets per noise level (:data:`NOISE_LEVELS`) from held-out content only.

    Crops from photos :data:`HELD_OUT_PHOTOS` and dead leaves :data:`DEAD_LEAVES_HELD_OUT_SEEDS`; each crop gets
    a fixed white balance, camera matrix and CFA phase (the four phases in turn). One batch per phase.
    """
    rng = np.random.default_rng(12345)
    crops: list[Tensor] = []
    for im in load_photos(photos, held_out=True, device=device):
        for _ in range(per_photo):
            y = int(rng.integers(im.shape[-2] - size + 1))
            x = int(rng.integers(im.shape[-1] - size + 1))
            crops.append(im[:, y : y + size, x : x + size])
    for seed in list(DEAD_LEAVES_HELD_OUT_SEEDS)[:dead_leaves_count]:
        crops.append(dead_leaves(seed, size).to(device))
    return _level_sets(crops, rng, device)


def held_out_other_source(device: torch.device, size: int = 192, per_image: int = 3) -> dict[str, list[RawBatch]]:
    """Evaluation sets like :func:`held_out_batches` from scikit-image's photographs, a source of another origin
    than the training photographs (held out by recipe v2; v1 trained on them); empty without scikit-image."""
    rng = np.random.default_rng(54321)
    crops = _random_crops(skimage_images(device), rng, size, per_image)
    return _level_sets(crops, rng, device) if len(crops) >= 4 else {}


def _random_crops(images: list[Tensor], rng: np.random.Generator, size: int, per_image: int) -> list[Tensor]:
    """``per_image`` random ``size`` x ``size`` crops of each image at least that large (positions from ``rng``)."""
    crops: list[Tensor] = []
    for im in images:
        if min(im.shape[-2:]) < size:
            continue
        for _ in range(per_image):
            y = int(rng.integers(im.shape[-2] - size + 1))
            x = int(rng.integers(im.shape[-1] - size + 1))
            crops.append(im[:, y : y + size, x : x + size])
    return crops


def _level_sets(crops: list[Tensor], rng: np.random.Generator, device: torch.device) -> dict[str, list[RawBatch]]:
    """Crops -> one batch per CFA phase per noise level, each crop with a fixed white balance, camera matrix and
    exposure drawn from ``rng``."""
    srgb = torch.stack(crops).float() / 255.0  # (N, 3, S, S)
    n = srgb.shape[0]
    gains = torch.tensor(np.stack([rng.uniform(1.7, 2.5, n), np.ones(n), rng.uniform(1.4, 2.1, n)], 1),
                         dtype=torch.float32, device=device)
    mix = torch.tensor(rng.random((n, len(XYZ_TO_CAMS))) + 1e-3, dtype=torch.float32, device=device)
    exposure = torch.tensor(np.exp(rng.uniform(math.log(0.5), math.log(1.3), n)), dtype=torch.float32,
                            device=device)
    out: dict[str, list[RawBatch]] = {}
    phases = ("RGGB", "BGGR", "GRBG", "GBRG")
    for level, (shot, read) in NOISE_LEVELS.items():
        gen = torch.Generator(device=device).manual_seed(777)
        out[level] = []
        for k, cfa in enumerate(phases):
            idx = torch.arange(k, n, len(phases), device=device)
            m = len(idx)
            out[level].append(unprocess(
                srgb[idx], cfa=cfa, margin=0, gen=gen, shot=torch.full((m,), shot, device=device),
                read=torch.full((m,), read, device=device), exposure=exposure[idx], gains=gains[idx],
                mix=mix[idx], report_jitter=False))
    return out


__all__ = ["DEAD_LEAVES_HELD_OUT_SEEDS", "HELD_OUT_PHOTOS", "NOISE_LEVELS", "RECIPES", "STACK_OFFSETS", "XYZ_TO_CAMS",
           "RawBatch", "Recipe", "StackBatch", "TrainingSource", "aligned", "dead_leaves", "held_out_batches",
           "held_out_other_source", "held_out_stacks", "load_photos", "mosaic_of", "pattern_image", "photo_paths",
           "rgb_to_cam", "sample_noise", "scene_variety", "skimage_images", "stack_of", "stack_told",
           "training_batch", "training_stack_batch", "unprocess", "with_hard_hue_share", "with_hard_min_period",
           "with_hard_share"]
