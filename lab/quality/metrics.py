"""Image-quality metrics against a ground truth: PSNR, SSIM, registration and a flat-area colour check.

Values are scored on [0, 1] sRGB (uint16 / uint8 images are scaled), excluding a :data:`BORDER` of pixels.
SSIM follows Wang et al. 2004: Gaussian window sigma 1.5, K1 = 0.01, K2 = 0.03, per channel, averaged.
"""

from __future__ import annotations

import math

import numpy as np

BORDER = 8  # pixels excluded from every metric (demosaic borders)
SSIM_SIGMA, SSIM_TRUNCATE, SSIM_K1, SSIM_K2 = 1.5, 3.5, 0.01, 0.03


def _crop_border(image: np.ndarray, border: int) -> np.ndarray:
    return image[border : image.shape[0] - border, border : image.shape[1] - border] if border else image


def to_unit(image: np.ndarray) -> np.ndarray:
    """uint16 (or uint8) image -> float64 in [0, 1]; float input is returned as float64 unchanged."""
    if image.dtype == np.uint16:
        return image.astype(np.float64) / 65535.0
    if image.dtype == np.uint8:
        return image.astype(np.float64) / 255.0
    return image.astype(np.float64)


def psnr(a: np.ndarray, b: np.ndarray, border: int = BORDER) -> float:
    """PSNR in dB of two images with values in [0, 1] (peak 1), excluding ``border`` pixels; ``inf`` if equal."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    diff = _crop_border(to_unit(a), border) - _crop_border(to_unit(b), border)
    mse = float(np.mean(diff * diff))
    return math.inf if mse == 0.0 else 10.0 * math.log10(1.0 / mse)


def gaussian_window(sigma: float = SSIM_SIGMA, truncate: float = SSIM_TRUNCATE) -> np.ndarray:
    """Normalised 1-D Gaussian taps, radius ``int(truncate * sigma + 0.5)`` (11 taps for sigma 1.5)."""
    radius = int(truncate * sigma + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    return taps / taps.sum()


def _filter_valid(x: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of (H, W, C) float64 along H and W."""
    n = len(taps)
    h, w = x.shape[0] - n + 1, x.shape[1] - n + 1
    rows = np.zeros((h, x.shape[1], x.shape[2]))
    for i, t in enumerate(taps):
        rows += t * x[i : i + h]
    out = np.zeros((h, w, x.shape[2]))
    for i, t in enumerate(taps):
        out += t * rows[:, i : i + w]
    return out


def ssim(a: np.ndarray, b: np.ndarray, border: int = BORDER, data_range: float = 1.0) -> float:
    """Mean SSIM (Wang et al. 2004) of (H, W) or (H, W, C) images, per channel then averaged.

    Gaussian window sigma 1.5 (11 taps), K1 = 0.01, K2 = 0.03, population covariances; the mean runs over the
    positions where the window fits inside the (border-cropped) image, which is what scikit-image's
    ``structural_similarity(gaussian_weights=True, use_sample_covariance=False)`` averages too.
    """
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    x, y = _crop_border(to_unit(a), border), _crop_border(to_unit(b), border)
    if x.ndim == 2:
        x, y = x[..., None], y[..., None]
    taps = gaussian_window()
    if min(x.shape[:2]) < len(taps):
        raise ValueError(f"image {x.shape[:2]} smaller than the SSIM window ({len(taps)} px)")
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    mx, my = _filter_valid(x, taps), _filter_valid(y, taps)
    vx = _filter_valid(x * x, taps) - mx * mx
    vy = _filter_valid(y * y, taps) - my * my
    cxy = _filter_valid(x * y, taps) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())



def align_to_truth(image: np.ndarray, truth: np.ndarray, search: int = 2) -> tuple[np.ndarray, np.ndarray, dict]:
    """Register a render with the ground truth: returns both cropped to their common area and what was found.

    A smaller render (margins cropped) is located inside the truth; a same-size one is checked for a shift of
    up to ``search`` pixels. The offset is chosen by the least squared error on a central window.
    """
    hi, wi = image.shape[:2]
    ht, wt = truth.shape[:2]
    if hi > ht or wi > wt:  # larger than the truth: locate the truth inside it instead
        t, i, info = align_to_truth(truth, image, search)
        return i, t, {**info, "offset": [-v for v in info["offset"]]}
    a, t = to_unit(image), to_unit(truth)
    dh, dw = ht - hi, wt - wi
    if (dh, dw) == (0, 0):
        candidates = [(dy, dx) for dy in range(-search, search + 1) for dx in range(-search, search + 1)]
    else:
        candidates = [(dy, dx) for dy in range(dh + 1) for dx in range(dw + 1)]
    win = min(256, hi - 2 * search - 2 * BORDER, wi - 2 * search - 2 * BORDER)
    cy, cx = (hi - win) // 2, (wi - win) // 2
    ref = a[cy : cy + win, cx : cx + win]

    def err(dy: int, dx: int) -> float:
        patch = t[cy + dy : cy + dy + win, cx + dx : cx + dx + win]
        return float(np.mean((patch - ref) ** 2))

    best = min(candidates, key=lambda d: err(*d))
    dy, dx = best
    info = {"image_shape": [hi, wi], "truth_shape": [ht, wt], "offset": [dy, dx], "aligned": best == (0, 0)}
    if (dh, dw) != (0, 0):
        return image, truth[dy : dy + hi, dx : dx + wi], info
    # same size, shifted: image(y, x) ~ truth(y + dy, x + dx); keep the overlap
    y0, y1 = max(0, -dy), hi - max(0, dy)
    x0, x1 = max(0, -dx), wi - max(0, dx)
    return image[y0:y1, x0:x1], truth[y0 + dy : y1 + dy, x0 + dx : x1 + dx], info


def _box_mean(x: np.ndarray, r: int) -> np.ndarray:
    """Mean over (2r+1)^2 windows, 'valid' positions, of (H, W, C)."""
    c = np.cumsum(np.cumsum(np.pad(x, ((1, 0), (1, 0), (0, 0))), axis=0), axis=1)
    n = 2 * r + 1
    return (c[n:, n:] - c[:-n, n:] - c[n:, :-n] + c[:-n, :-n]) / (n * n)


def colour_check(image: np.ndarray, truth: np.ndarray, radius: int = 3, flat_std: float = 2e-3,
                 bright: float = 0.9) -> dict:
    """Compare a noise-free render with the truth on the truth's flat, unsaturated areas.

    Flat: local std (window ``2 radius + 1``) below ``flat_std`` in every channel. Unsaturated: every channel
    of the truth below ``bright`` (encoded): near-white colours can exceed the sensor's white level once
    unprocessed to camera RGB, so every renderer clips them alike and they say nothing about colour. Returns the
    number of such pixels, the mean absolute and the mean signed difference per channel ([0, 1] sRGB units);
    interior pixels only (``BORDER`` + ``radius``).
    """
    a, t = _crop_border(to_unit(image), BORDER), _crop_border(to_unit(truth), BORDER)
    mean = _box_mean(t, radius)
    std = np.sqrt(np.maximum(_box_mean(t * t, radius) - mean * mean, 0.0)).max(axis=2)
    inner = (a - t)[radius : a.shape[0] - radius, radius : a.shape[1] - radius]
    flat = (std < flat_std) & (t[radius : t.shape[0] - radius, radius : t.shape[1] - radius].max(axis=2) < bright)
    n = int(flat.sum())
    if n == 0:
        return {"flat_pixels": 0, "mean_abs_diff": None, "mean_signed_diff": None}
    d = inner[flat]
    return {"flat_pixels": n, "mean_abs_diff": float(np.abs(d).mean()),
            "mean_signed_diff": [float(v) for v in d.mean(axis=0)]}
