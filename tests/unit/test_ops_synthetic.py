"""Synthetic inputs shared by the pipeline op tests (numpy/torch only), and checks of the helpers."""

from __future__ import annotations

import numpy as np
import torch

from services.pipeline.ops import cfa_masks

# A plausible DNG ColorMatrix (XYZ -> camera), used to build the colour contract in tests.
COLOR_MATRIX = np.array([[0.6722, -0.0635, -0.0963], [-0.4287, 1.2460, 0.2028], [-0.0908, 0.2162, 0.5668]])


def textured_rgb(h: int, w: int, seed: int = 0, cutoff: float = 0.15, shift: tuple[float, float] = (0.0, 0.0),
                 lo: float = 0.1, hi: float = 0.8) -> np.ndarray:
    """(3, H, W) float64 band-limited random texture in [lo, hi], optionally moved by a sub-pixel ``shift``.

    Channels are correlated like a natural image's.

    The content is periodic (Fourier synthesis), so shifted copies are exact translations.
    """
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.fftfreq(w)[None, :]
    envelope = np.exp(-(fy**2 + fx**2) / (2 * cutoff**2))
    phase = np.exp(-2j * np.pi * (fy * shift[0] + fx * shift[1]))
    # Natural images: channels share most of their texture (a luminance) and differ by a weaker chroma.
    luma = rng.standard_normal((h, w))
    spectra = [np.fft.fft2(luma * gain + 0.3 * rng.standard_normal((h, w))) * envelope
               for gain in (0.8, 1.0, 0.7)]
    base = np.stack([np.fft.ifft2(s).real for s in spectra])
    moved = np.stack([np.fft.ifft2(s * phase).real for s in spectra])
    mn, mx = base.min(), base.max()
    return lo + (hi - lo) * (moved - mn) / (mx - mn)


def mosaic_of(rgb: np.ndarray | torch.Tensor, cfa: str) -> torch.Tensor:
    """(3, H, W) -> (H, W) Bayer mosaic (same dtype for tensors, float64 for numpy)."""
    t = torch.as_tensor(rgb)
    return (t * cfa_masks(cfa, t.shape[-2], t.shape[-1], dtype=t.dtype)).sum(0)


def psnr(a: np.ndarray, b: np.ndarray, peak: float) -> float:
    """Peak signal-to-noise ratio in dB."""
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float(10 * np.log10(peak**2 / mse))


def test_mosaic_of_picks_one_channel_per_site() -> None:
    rgb = torch.arange(3.0).view(3, 1, 1).expand(3, 4, 4)
    m = mosaic_of(rgb, "GRBG")
    assert m[0, 0] == 1 and m[0, 1] == 0 and m[1, 0] == 2 and m[1, 1] == 1


def test_textured_rgb_range_and_shift() -> None:
    img = textured_rgb(32, 48, seed=3)
    assert img.shape == (3, 32, 48) and img.min() >= 0.1 - 1e-12 and img.max() <= 0.8 + 1e-12
    moved = textured_rgb(32, 48, seed=3, shift=(2.0, -3.0))
    np.testing.assert_allclose(moved[:, 2:, :-3], img[:, :-2, 3:], atol=1e-9)
