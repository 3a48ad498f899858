"""Multi-frame stack, first version: one global sub-pixel translation per frame, then a weighted sum.

A later version replaces this with tile-based robust alignment. Mosaics are (H, W) float, normalised, with
even H and W; all frames share the CFA phase of the reference. Shifts are in full-resolution pixels:
``(dy, dx)`` means ``frame(y, x) ~ reference(y - dy, x - dx)`` (the frame's content moved by +dy, +dx).

Fusing frame groups rendered apart (one per GPU): ``sum(sums) / sum(weights)`` over the groups, where
weight 0 (no frame covered the pixel) falls back to the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from services.pipeline.ops.cfa import cfa_channels

_SLOPE_BAND = 0.35  # cycles per binned pixel used by the phase-slope fit (above it CFA aliasing grows)
_SLOPE_ITERATIONS = 3
_SHIFT_DECIMALS = 4  # estimates are rounded: identical frames give exactly (0, 0)


def _check_mosaic(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor) or x.ndim != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (H, W) tensor, got {shape}")
    if x.shape[0] % 2 or x.shape[1] % 2 or min(x.shape) < 8:
        raise ValueError(f"{name} must have even H and W of at least 8, got {tuple(x.shape)}")


def _planes(mosaic: Tensor) -> Tensor:
    """(H, W) -> (4, H/2, W/2) CFA sub-planes, site order row-major."""
    h, w = mosaic.shape
    return mosaic.reshape(h // 2, 2, w // 2, 2).permute(1, 3, 0, 2).reshape(4, h // 2, w // 2)


def _unplanes(planes: Tensor) -> Tensor:
    """(4, H/2, W/2) -> (H, W), inverse of :func:`_planes`."""
    _, h2, w2 = planes.shape
    return planes.reshape(2, 2, h2, w2).permute(2, 0, 3, 1).reshape(2 * h2, 2 * w2)


def _binned_luma(mosaic: Tensor) -> Tensor:
    """Mean of each 2x2 CFA block, (R + 2G + B) / 4: green-weighted luminance at half resolution, float64."""
    return _planes(mosaic.to(torch.float64)).mean(dim=0)  # (H/2, W/2)


def _hann(n: int, like: Tensor) -> Tensor:
    return torch.hann_window(n, periodic=False, dtype=like.dtype, device=like.device)


def _freqs(n: int, like: Tensor) -> Tensor:
    return torch.fft.fftfreq(n, d=1.0 / n, dtype=torch.float64, device=like.device)  # integer frequencies


def _upsampled_peak(cross: Tensor, center: tuple[float, float], half_width: float, step: float) -> Tensor:
    """Real part of the inverse DFT of ``cross`` (N, M) on a fine grid around ``center``: (n, n) float64.

    Guizar-Sicairos et al. 2008: two small matrix products instead of a zero-padded inverse FFT.
    """
    n, m = cross.shape
    offsets = torch.arange(-half_width, half_width + step / 2, step, dtype=torch.float64, device=cross.device)
    ys = center[0] + offsets  # (k,)
    xs = center[1] + offsets  # (k,)
    ky = torch.exp(2j * math.pi * ys[:, None] * _freqs(n, cross)[None, :] / n)  # (k, N)
    kx = torch.exp(2j * math.pi * _freqs(m, cross)[:, None] * xs[None, :] / m)  # (M, k)
    return (ky @ cross @ kx).real  # (k, k)


def _refine(surface: Tensor, center: tuple[float, float], step: float) -> tuple[float, float]:
    """Argmax of ``surface`` (k, k) on the grid around ``center`` plus a parabolic fit on its neighbours."""
    k = surface.shape[0]
    iy, ix = divmod(int(torch.argmax(surface)), k)

    def vertex(lo: float, mid: float, hi: float) -> float:
        denom = lo - 2.0 * mid + hi
        return 0.0 if denom >= 0 else 0.5 * (lo - hi) / denom

    fy = vertex(*surface[iy - 1 : iy + 2, ix].tolist()) if 0 < iy < k - 1 else 0.0
    fx = vertex(*surface[iy, ix - 1 : ix + 2].tolist()) if 0 < ix < k - 1 else 0.0
    half = (k - 1) // 2
    return center[0] + (iy - half + fy) * step, center[1] + (ix - half + fx) * step


def _phase_slope(power: Tensor, dy: float, dx: float) -> tuple[float, float]:
    """Residual shift after removing (dy, dx): weighted least-squares fit of the cross-power phase slope.

    Uses the frequencies below ``_SLOPE_BAND`` cycles/pixel, weighted by cross-power magnitude, so
    high-SNR texture dominates and noise-only bins barely count.
    """
    h, w = power.shape
    fy = _freqs(h, power)[:, None] / h  # (h, 1) cycles per pixel
    fx = _freqs(w, power)[None, :] / w  # (1, w)
    residual = power * torch.exp(2j * math.pi * (fy * dy + fx * dx))  # (h, w) phase ~ -2 pi f . delta
    band = (fy.abs() <= _SLOPE_BAND) & (fx.abs() <= _SLOPE_BAND)  # (h, w)
    weight = residual.abs().square() * band  # (h, w)
    theta = residual.angle()  # (h, w)
    gy = (-2.0 * math.pi * fy).expand(h, w)
    gx = (-2.0 * math.pi * fx).expand(h, w)
    a = torch.stack([
        torch.stack([(weight * gy * gy).sum(), (weight * gy * gx).sum()]),
        torch.stack([(weight * gx * gy).sum(), (weight * gx * gx).sum()]),
    ])  # (2, 2) normal equations
    rhs = torch.stack([(weight * gy * theta).sum(), (weight * gx * theta).sum()])  # (2,)
    delta = torch.linalg.solve(a, rhs)
    return float(delta[0]), float(delta[1])


def estimate_shift(reference: Tensor, frame: Tensor, cfa: str) -> tuple[float, float]:
    """Global translation (dy, dx) of ``frame`` relative to ``reference``, in full-resolution pixels.

    Phase correlation of the 2x2-binned luminance (Hann window) finds the peak, refined on a 1/8-pixel
    upsampled DFT grid; a power-weighted least-squares fit of the cross-power phase slope then gives the
    sub-pixel shift (robust to noise). The binned shift is doubled; ``cfa`` is validated only.
    """
    cfa_channels(cfa)
    _check_mosaic(reference, "reference")
    _check_mosaic(frame, "frame")
    if reference.shape != frame.shape:
        raise ValueError(f"frame shape {tuple(frame.shape)} differs from reference {tuple(reference.shape)}")
    a = _binned_luma(reference)  # (h, w)
    b = _binned_luma(frame.to(reference.device))  # (h, w)
    h, w = a.shape
    window = _hann(h, a)[:, None] * _hann(w, a)[None, :]  # (h, w)
    fa = torch.fft.fft2((a - a.mean()) * window)  # (h, w) complex128
    fb = torch.fft.fft2((b - b.mean()) * window)  # (h, w) complex128
    power = fb * fa.conj()  # (h, w) cross-power spectrum
    mag = power.abs()
    cross = power / (mag + mag.mean() * 1e-2)  # (h, w) near-whitened: a sharp peak for the coarse search
    surface = torch.fft.ifft2(cross).real  # (h, w)
    py, px = divmod(int(torch.argmax(surface)), w)
    py = py - h if py > h // 2 else py
    px = px - w if px > w // 2 else px
    coarse = _upsampled_peak(cross, (float(py), float(px)), 1.0, 1.0 / 8)
    dy, dx = _refine(coarse, (float(py), float(px)), 1.0 / 8)
    for _ in range(_SLOPE_ITERATIONS):
        ddy, ddx = _phase_slope(power, dy, dx)
        dy, dx = dy + ddy, dx + ddx
    return round(2.0 * dy, _SHIFT_DECIMALS) + 0.0, round(2.0 * dx, _SHIFT_DECIMALS) + 0.0


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
    _check_mosaic(frame, "frame")
    if not frame.is_floating_point():
        raise TypeError(f"frame must be floating, got {frame.dtype}")
    planes = _planes(frame)  # (4, h, w)
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
    return _unplanes(out), _unplanes(weight)


def accumulate_frames(reference: Tensor, frames: Sequence[Tensor], cfa: str
                      ) -> tuple[Tensor, Tensor, list[tuple[float, float]]]:
    """Align each frame to ``reference`` and sum: (sum (H, W) float32, weight (H, W) float32, shifts).

    The reference is not added implicitly; pass it in ``frames`` to include it. The merged mosaic is
    ``sum / weight`` (where weight > 0); groups fuse as ``sum(sums) / sum(weights)``.
    """
    _check_mosaic(reference, "reference")
    ref = reference.to(torch.float32)
    total = torch.zeros_like(ref)  # (H, W)
    weight = torch.zeros_like(ref)  # (H, W)
    shifts: list[tuple[float, float]] = []
    for frame in frames:
        f = frame.to(device=ref.device, dtype=torch.float32)
        dy, dx = estimate_shift(ref, f, cfa)
        moved, valid = shift_mosaic(f, dy, dx, cfa)  # (H, W) each
        total += moved
        weight += valid
        shifts.append((dy, dx))
    return total, weight, shifts
