"""Shot-level parameters, computed once per shot and shared by every shard: white balance, noise, colour."""

from __future__ import annotations

import numpy as np

from services.pipeline.ops.colour import camera_to_srgb_matrix
from services.pipeline.render import RenderParams
from services.raw.meta import RawMeta

_SITES = ((0, 0), (0, 1), (1, 0), (1, 1))


def _cfa_planes(mosaic: np.ndarray, meta: RawMeta) -> dict[str, list[np.ndarray]]:
    """The normalised CFA sub-planes of a (subsampled) mosaic, grouped by colour letter."""
    white = float(meta.white_level)
    planes: dict[str, list[np.ndarray]] = {"R": [], "G": [], "B": []}
    for (dy, dx), letter, black in zip(_SITES, meta.cfa, meta.black_levels, strict=True):
        plane = mosaic[dy::2, dx::2].astype(np.float32)
        planes[letter].append((plane - black) / max(white - black, 1.0))
    return planes


def white_balance_gains(meta: RawMeta, mosaic: np.ndarray) -> tuple[float, float, float]:
    """Gains R, G, B = 1 / AsShotNeutral (G = 1); without a neutral in the file, a grey-world estimate."""
    if meta.as_shot_neutral and all(v > 0 for v in meta.as_shot_neutral):
        n = np.asarray(meta.as_shot_neutral, dtype=np.float64)
        n = n / n[1]
        return (float(1 / n[0]), 1.0, float(1 / n[2]))
    sample = mosaic[: (mosaic.shape[0] // 16) * 16 : 8, : (mosaic.shape[1] // 16) * 16 : 8]
    planes = _cfa_planes(np.ascontiguousarray(sample), meta)
    means = {c: float(np.mean([p.mean() for p in ps])) for c, ps in planes.items()}
    g = max(means["G"], 1e-6)
    return (g / max(means["R"], 1e-6), 1.0, g / max(means["B"], 1e-6))


def estimate_noise(meta: RawMeta, mosaic: np.ndarray) -> tuple[float, float]:
    """Noise model (shot, read) in normalised units: the file's NoiseProfile, else a robust estimate.

    The estimate is a signal-independent variance from the median absolute difference of horizontally
    adjacent same-colour sites of the green plane (robust to edges).
    """
    if meta.noise_profile is not None:
        return (float(meta.noise_profile.shot), float(meta.noise_profile.read))
    rows = mosaic[: min(mosaic.shape[0], 2048)]
    plane = _cfa_planes(rows, meta)["G"][0]
    diff = np.abs(np.diff(plane, axis=1))
    sigma = 1.4826 * float(np.median(diff)) / np.sqrt(2.0)
    return (0.0, sigma * sigma)


def shot_render_params(meta: RawMeta, mosaic: np.ndarray) -> RenderParams:
    """The parameters every shard of this shot renders with (computed once, on the reference frame)."""
    shot, read = estimate_noise(meta, mosaic)
    rgb_cam = camera_to_srgb_matrix(np.asarray(meta.color_matrix, dtype=np.float64))
    return RenderParams(
        cfa=meta.cfa,
        black=tuple(float(b) for b in meta.black_levels),  # type: ignore[arg-type]
        white=float(meta.white_level),
        gains=white_balance_gains(meta, mosaic),
        rgb_cam=tuple(tuple(float(v) for v in row) for row in rgb_cam),
        noise_shot=shot,
        noise_read=read,
    )
