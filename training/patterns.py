"""Procedural hard content for training (recipe ``patterns``): a new random scene for every crop.

Photographs and dead leaves almost never hold what makes a joint demosaic + denoise network fail: detail at the
sampling limit (checkerboards and gratings of period 2-8 pixels, where the CFA aliases luma into chroma), fine
texture beside a large flat black or white area (the network's reach carries colour into the flat area) and fine
neutral texture (which a colour bias turns into a tint). :func:`hard_pattern` draws such a scene from a NumPy
generator, so it is deterministic in the generator's state and never repeats an image:

* a texture, one of: square-wave grating, sine grating, checkerboard (periods 2-8 px, or 3-8 with ``shortest=3``,
  axis-aligned, diagonal or at any angle, at a random phase), basket weave, herringbone, text-like strokes (short
  1-2 px bars in rows), or two gratings crossed;
* in two colours: neutral greys, a saturated colour over a dark or light one, or any two colours, high or low
  contrast;
* laid out over the whole crop, or beside a flat area (black, white or a colour) across a random straight edge, or
  as patches on a flat background;
* sharp (pixel-exact edges where the geometry is axis-aligned) or rendered at 2x and box-averaged (anti-aliased);
* with ``hue_share``, that share of the scenes is fine texture in ONE saturated hue at two shades (the texture lives
  in one or two channels only, as in green foliage or a fine cyan fabric), or 40 % of them its neutral counterpart:
  a dot grid, a twill or 1-px grain besides the textures above. A network that learned neutral patterns of period
  3 reads such a mosaic as a pattern and draws a false grid into it (2.2.0 on saturated green and cyan,
  docs/QUALITY.md): these scenes teach it what the truth is.

Everything is computed with torch on the training device (a few small kernels per crop); the random draws are a
handful of scalars from the NumPy generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

TEXTURES = ("square", "sine", "checker", "weave", "herringbone", "strokes", "crossed")
LAYOUTS = ("full", "beside_flat", "patches")
_LAYOUT_P = (0.4, 0.4, 0.2)
_HUE_LAYOUT_P = (0.7, 0.2, 0.1)  # the scenes in one saturated hue
# The shortest period drawn by default (recipe ``patterns`` as run in session 38). A neutral pattern of period 2 px
# puts its bright pixels on the same CFA sites as a flat saturated colour does (a 1-px checkerboard is a magenta
# mosaic, a dot grid on the R sites a red one): a network taught such patterns draws a fine grid into saturated red
# fabric (photograph 040, -1.0 dB; docs/training/README.md "2.2.0"). ``--hard-min-period 3`` leaves them out.
SHORTEST_PERIOD = 2.0


def _period(rng: np.random.Generator, shortest: float) -> float:
    """A period in pixels, ``shortest``-8: half of the time a whole number (pixel-exact repeats, the worst case for
    a CFA)."""
    if rng.random() < 0.5:
        return float(rng.integers(math.ceil(shortest), 9))
    return float(np.exp(rng.uniform(math.log(shortest), math.log(8.0))))


def _angle(rng: np.random.Generator) -> float:
    """An orientation: half of the time axis-aligned or diagonal, else any."""
    if rng.random() < 0.5:
        return float(rng.integers(4)) * math.pi / 4
    return float(rng.uniform(0.0, math.pi))


def _rotated(yy: Tensor, xx: Tensor, theta: float) -> tuple[Tensor, Tensor]:
    return xx * math.cos(theta) + yy * math.sin(theta), -xx * math.sin(theta) + yy * math.cos(theta)


def _square(u: Tensor, period: float, duty: float, phase: float) -> Tensor:
    return (torch.remainder(u / period + phase, 1.0) < duty).float()


def _stripes(rng: np.random.Generator, yy: Tensor, xx: Tensor, kind: str, shortest: float) -> Tensor:
    """Gratings and checkerboards of periods ``shortest``-8 px: (H, W) in [0, 1]."""
    u, v = _rotated(yy, xx, _angle(rng))
    period, phase = _period(rng, shortest), float(rng.random())
    if kind == "square":
        return _square(u, period, float(rng.uniform(0.3, 0.7)) if rng.random() < 0.5 else 0.5, phase)
    if kind == "sine":
        return 0.5 + 0.5 * torch.sin(2 * math.pi * (u / period + phase))
    if kind == "checker":
        cell = period / 2
        return torch.remainder(torch.floor(u / cell + phase) + torch.floor(v / cell + float(rng.random())), 2.0)
    other = _rotated(yy, xx, _angle(rng))[0]  # crossed: two square waves XOR'd
    return (_square(u, period, 0.5, phase) + _square(other, _period(rng, shortest), 0.5, float(rng.random()))) % 2


def _woven(rng: np.random.Generator, yy: Tensor, xx: Tensor, kind: str, shortest: float) -> Tensor:
    """Basket weave (blocks of horizontal and vertical stripes) or herringbone (diagonal stripes whose slope flips
    from one column band to the next), stripes of period ``shortest``-4 px: (H, W) in [0, 1]."""
    stripe = float(rng.integers(math.ceil(shortest), 5))
    block = float(rng.integers(2, 9))
    duty = float(rng.uniform(0.35, 0.65))
    if kind == "weave":
        across = torch.remainder(torch.floor(yy / block) + torch.floor(xx / block), 2.0)
        return across * _square(yy, stripe, duty, 0.0) + (1 - across) * _square(xx, stripe, duty, 0.0)
    slope = 1.0 - 2.0 * torch.remainder(torch.floor(xx / block), 2.0)  # +1 / -1 per band of columns
    return _square(yy + slope * xx, stripe, duty, float(rng.random()))


def _cell_hash(row: Tensor, col: Tensor, seed: float) -> Tensor:
    """A pseudo-random value in [0, 1) per (row, col) cell, computed on the device (no host-to-device copy)."""
    return torch.remainder(torch.sin(row * 12.9898 + col * 78.233 + seed) * 43758.5453, 1.0)


def _strokes(rng: np.random.Generator, yy: Tensor, xx: Tensor) -> Tensor:
    """Text-like strokes: rows of glyph cells, each a random set of bars 1-2 px wide (top, middle, bottom, left,
    right, diagonal, as on a segment display), some cells blank (spaces): (H, W) in {0, 1}."""
    gh = float(rng.uniform(5.0, 14.0))  # glyph height
    gw = gh * float(rng.uniform(0.5, 0.8))
    line = gh * float(rng.uniform(1.2, 1.8))  # line pitch
    width = float(rng.choice([1.0, 1.0, 1.5, 2.0]))
    m = width / 2 + 0.5
    ly, lx = torch.remainder(yy, line), torch.remainder(xx, gw + 1.0)
    inside_y, inside_x = (ly >= m) & (ly <= gh - m), (lx >= m) & (lx <= gw - m)
    slope = (gw - 2 * m) / max(gh - 2 * m, 1.0)
    segments = torch.stack([
        ((ly - m).abs() < width / 2) & inside_x, ((ly - gh / 2).abs() < width / 2) & inside_x,
        ((ly - gh + m).abs() < width / 2) & inside_x, ((lx - m).abs() < width / 2) & inside_y,
        ((lx - gw + m).abs() < width / 2) & inside_y, ((lx - m - slope * (ly - m)).abs() < width / 2) & inside_y,
    ]).float()  # (6, H, W)
    row = torch.div(yy, line, rounding_mode="floor")
    col = torch.div(xx, gw + 1.0, rounding_mode="floor")
    seed = float(rng.uniform(0.0, 1000.0))
    on = [_cell_hash(row, col, seed + 17.0 * k) < 0.4 for k in range(6)]  # the segments each cell draws
    blank = _cell_hash(row, col, seed + 101.0) < 0.2  # spaces between words
    cell = torch.stack(on).float() * (~blank).float()  # (6, H, W)
    return (segments * cell).amax(dim=0)


def _fine(rng: np.random.Generator, yy: Tensor, xx: Tensor, shortest: float) -> Tensor:
    """A dot grid of period ``shortest``-4 px (axis-aligned, at a random phase), a twill (diagonal stripes of that
    period) or 1-px grain (each pixel on or off at random): (H, W) in {0, 1}."""
    roll = rng.random()
    period = float(rng.integers(math.ceil(shortest), 5))
    py, px = float(rng.integers(int(period))), float(rng.integers(int(period)))
    iy, ix = torch.floor(yy + 0.5), torch.floor(xx + 0.5)  # the output pixel a (super)sample falls in
    if roll < 0.35:
        return ((torch.remainder(iy + py, period) < 1) & (torch.remainder(ix + px, period) < 1)).float()
    if roll < 0.7:
        sign = 1.0 if rng.random() < 0.5 else -1.0
        return (torch.remainder(iy + sign * ix + py, period) < float(rng.integers(1, int(period)))).float()
    return (_cell_hash(iy, ix, float(rng.uniform(0.0, 1000.0))) < float(rng.uniform(0.3, 0.7))).float()


def _hue_shades(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two shades of one saturated sRGB hue (any hue; HSV saturation 0.75-1): a bright one and one 30-85 % of it.
    40 % of the time the same in grey (saturation 0): the neutral counterpart of the same fine texture, so the
    network learns to tell the two apart from the samples rather than read every such mosaic as one of them."""
    hue, sat = float(rng.uniform(0.0, 6.0)), float(rng.uniform(0.75, 1.0)) if rng.random() < 0.6 else 0.0
    k = (np.array([5.0, 3.0, 1.0]) + hue) % 6.0
    colour = 1.0 - sat * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)
    bright = float(rng.uniform(0.5, 1.0))
    return colour * bright * float(rng.uniform(0.3, 0.85)), colour * bright


def _texture(rng: np.random.Generator, yy: Tensor, xx: Tensor, shortest: float) -> Tensor:
    kind = TEXTURES[int(rng.integers(len(TEXTURES)))]
    if kind in ("square", "sine", "checker", "crossed"):
        return _stripes(rng, yy, xx, kind, shortest)
    if kind in ("weave", "herringbone"):
        return _woven(rng, yy, xx, kind, shortest)
    return _strokes(rng, yy, xx)


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The texture's two sRGB colours: neutral (30 %), a saturated colour over a dark or light grey (35 %), any
    two colours (35 %); high contrast most of the time."""
    roll = rng.random()
    lo, hi = sorted(rng.uniform(0.0, 1.0, 2))
    if rng.random() < 0.6:
        lo, hi = rng.uniform(0.0, 0.25), rng.uniform(0.6, 1.0)
    if roll < 0.3:
        return np.full(3, lo), np.full(3, hi)
    if roll < 0.65:
        hue = rng.random(3) ** 2
        hue = hue / max(float(hue.max()), 1e-3) * rng.uniform(0.5, 1.0)
        grey = np.full(3, lo if rng.random() < 0.6 else hi)
        return (hue, grey) if rng.random() < 0.5 else (grey, hue)
    return rng.random(3) ** 1.2, rng.random(3) ** 1.2


def _flat(rng: np.random.Generator) -> np.ndarray:
    """A flat area's sRGB colour: black (45 %), white (30 %) or any colour."""
    roll = rng.random()
    if roll < 0.45:
        return np.full(3, rng.uniform(0.0, 0.03))
    if roll < 0.75:
        return np.full(3, rng.uniform(0.85, 1.0))
    return rng.random(3)


def _layout_mask(rng: np.random.Generator, yy: Tensor, xx: Tensor, layout: str, size: float) -> Tensor:
    """Where the texture is (1) and the flat area is (0): (H, W) over a ``size`` x ``size`` crop."""
    if layout == "full":
        return torch.ones_like(yy)
    if layout == "beside_flat":  # a straight edge at a random angle through a random point of the middle half
        theta = _angle(rng)
        u, _ = _rotated(yy - size * rng.uniform(0.25, 0.75), xx - size * rng.uniform(0.25, 0.75), theta)
        return (u < 0).float()
    mask = torch.zeros_like(yy)
    for _ in range(int(rng.integers(1, 5))):
        y0, x0 = rng.uniform(-0.1, 0.9, 2) * size
        h, w = rng.uniform(0.1, 0.5, 2) * size
        mask = torch.maximum(mask, ((yy >= y0) & (yy < y0 + h) & (xx >= x0) & (xx < x0 + w)).float())
    return mask


def hard_pattern(rng: np.random.Generator, size: int, device: torch.device | str = "cpu",
                 shortest: float = SHORTEST_PERIOD, hue_share: float = 0.0) -> Tensor:
    """A random hard scene (3, size, size) float32 sRGB in [0, 1] on ``device``; deterministic in ``rng``'s state.

    Half of the scenes are rendered at 2x and box-averaged (soft, anti-aliased edges), half at 1x (exact).
    ``shortest``: the shortest period of the gratings, checkerboards and woven stripes (2-4 px; see
    :data:`SHORTEST_PERIOD`). ``hue_share``: the share of scenes of fine texture in one saturated hue (module
    docstring); 0 draws exactly the scenes of session 39 (2.2.0's recipe)."""
    if not 2.0 <= shortest <= 4.0:
        raise ValueError(f"the shortest period must be 2-4 px, got {shortest}")
    ss = 2 if rng.random() < 0.5 else 1
    n = size * ss
    grid = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / ss - 0.5  # output-pixel units
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    layout_p = _LAYOUT_P
    if hue_share > 0 and rng.random() < hue_share:  # mostly over the whole crop: foliage, fabric
        t = _fine(rng, yy, xx, max(shortest, 3.0)) if rng.random() < 0.6 else _texture(rng, yy, xx, shortest)
        c0, c1 = _hue_shades(rng)
        layout_p = _HUE_LAYOUT_P
    else:
        t = _texture(rng, yy, xx, shortest)
        c0, c1 = _colours(rng)  # Python scalars only below: no host-to-device copy, no wait for the device
    img = torch.stack([float(c0[k]) + float(c1[k] - c0[k]) * t for k in range(3)])  # (3, n, n)
    layout = LAYOUTS[int(rng.choice(len(LAYOUTS), p=layout_p))]
    if layout == "full" and rng.random() < 0.3:  # a soft illumination gradient
        img = img * (1 + float(rng.normal(0.0, 0.2)) * (yy / n - 0.5))
    mask = _layout_mask(rng, yy, xx, layout, float(size))
    flat = _flat(rng)
    img = mask * img + (1 - mask) * torch.stack([torch.full_like(mask, float(v)) for v in flat])
    if ss > 1:
        img = torch.nn.functional.avg_pool2d(img[None], ss)[0]
    return img.clamp(0.0, 1.0)


__all__ = ["LAYOUTS", "SHORTEST_PERIOD", "TEXTURES", "hard_pattern"]
