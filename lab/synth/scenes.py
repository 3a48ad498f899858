"""Named test scenes for the artefacts a joint demosaic + denoise network shows (content ``pattern:NAME``).

Pixel-exact sRGB scenes built at the frame's own size (no resampling), each with the regions its artefact is
measured in (:func:`scene`); ``strata quality --artefacts`` renders them at every CFA phase and scores them with
:mod:`lab.quality.artefacts`. They reproduce, in kind, what was found from outside (docs/QUALITY.md, "Artefacts
found from outside"); the training's hard content (training/patterns.py) is drawn at random and never uses them.

* ``checker``: a neutral checkerboard of 2-pixel squares (period 4) -- false colour at the sampling limit;
  region ``pattern`` (chroma error).
* ``lines``: lines of period 4 (2 on, 2 off), vertical on the left half, horizontal on the right -- the same;
  region ``pattern``.
* ``weave_black``: a red basket weave on the left 40 % beside flat black -- colour glowing into the black; region
  ``flat`` (3-30 px from the texture; truth 0).
* ``bright_black``: a bright neutral fine texture beside flat black -- the same (magenta); region ``flat``.
* ``herringbone``: a neutral 3-pixel herringbone, mean about 123/255 -- a tint at noise; region ``neutral`` (the
  mean colour of the texture; truth neutral).
* ``hue_tex``: fine texture at the sampling limit in 12 saturated hues (bands 30 degrees apart; in each, a period-3
  dot grid, a period-3 twill and 1-px grain, each in a bright and a darker shade of the band's hue, at high and at low
  contrast) -- a false grid, stripes or blotches where the red or blue samples are near black (green, cyan; found
  from outside on 2.2.0); regions ``texture`` (all of it) and ``grain`` (the low-contrast grain, where 2.2.0 draws
  coloured blotches into yellow-green to cyan), RMS error away from the bands' edges.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

SCENES = ("checker", "lines", "weave_black", "bright_black", "herringbone", "hue_tex")
DARK, LIGHT = 0.08, 0.85  # sRGB levels of the neutral sampling-limit patterns
FLAT_BAND = (3, 30)  # pixels from the texture's edge where the glow into flat black is measured
TEXTURE_SHARE = 0.4  # of the width, for the scenes with a texture beside flat black
HUES = 12  # bands of ``hue_tex``, 360 / HUES degrees apart
EDGE_MARGIN = 4  # pixels of ``hue_tex`` left out of its region on each side of a band's edge

Regions = dict[str, np.ndarray]


def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:height, 0:width]
    return yy, xx


def _two_tone(t: np.ndarray, c0: tuple[float, ...], c1: tuple[float, ...]) -> np.ndarray:
    a, b = np.asarray(c0, np.float32), np.asarray(c1, np.float32)
    return (a * (1 - t[..., None]) + b * t[..., None]).astype(np.float32)


def _checker(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    t = ((yy // 2 + xx // 2) % 2).astype(np.float32)
    return _two_tone(t, (DARK,) * 3, (LIGHT,) * 3), {"pattern": np.ones((height, width), bool)}


def _lines(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    t = np.where(xx < width // 2, (xx // 2) % 2, (yy // 2) % 2).astype(np.float32)
    return _two_tone(t, (DARK,) * 3, (LIGHT,) * 3), {"pattern": np.ones((height, width), bool)}


def _beside_black(texture: np.ndarray, width: int) -> tuple[np.ndarray, Regions]:
    """``texture`` (H, W, 3) kept on the left :data:`TEXTURE_SHARE` of the frame, flat black (0) on the right."""
    edge = int(width * TEXTURE_SHARE) // 2 * 2
    img = texture.copy()
    img[:, edge:] = 0.0
    flat = np.zeros(img.shape[:2], bool)
    flat[:, edge + FLAT_BAND[0] : edge + FLAT_BAND[1]] = True
    return img, {"flat": flat}


def _weave(yy: np.ndarray, xx: np.ndarray, stripe: int = 2, block: int = 4) -> np.ndarray:
    across = (yy // block + xx // block) % 2
    return np.where(across == 1, (yy // stripe) % 2, (xx // stripe) % 2).astype(np.float32)


def _weave_black(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    return _beside_black(_two_tone(_weave(yy, xx), (0.45, 0.0, 0.02), (1.0, 0.10, 0.06)), width)


def _herringbone_t(yy: np.ndarray, xx: np.ndarray, period: int = 3, band: int = 6) -> np.ndarray:
    slope = 1 - 2 * ((xx // band) % 2)
    return (((yy + slope * xx) % period) < 2).astype(np.float32)


def _bright_black(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    return _beside_black(_two_tone(_herringbone_t(yy, xx), (0.55,) * 3, (1.0,) * 3), width)


def _herringbone(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    img = _two_tone(_herringbone_t(yy, xx), (0.20,) * 3, (0.62,) * 3)  # mean 0.48: about 123 / 255
    return img, {"neutral": np.ones((height, width), bool)}


def _hue_rgb(hue: float, value: float) -> tuple[float, float, float]:
    """A fully saturated sRGB colour of ``hue`` (degrees) at HSV value ``value``."""
    k = (np.array([5.0, 3.0, 1.0]) + hue / 60.0) % 6.0
    rgb = value * (1.0 - np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0))
    return float(rgb[0]), float(rgb[1]), float(rgb[2])


def _hue_tex(height: int, width: int) -> tuple[np.ndarray, Regions]:
    yy, xx = _grid(height, width)
    dots = ((yy % 3 == 0) & (xx % 3 == 0)).astype(np.float32)
    twill = (((yy + xx) % 3) == 0).astype(np.float32)
    grain = (np.random.default_rng(17).random((height, width)) < 0.5).astype(np.float32)
    row = np.minimum(yy * 6 // max(height, 1), 5)  # dots, twill, grain at high contrast, then at low contrast
    t = np.choose(row % 3, [dots, twill, grain])
    band = np.minimum(xx * HUES // max(width, 1), HUES - 1)
    img = np.zeros((height, width, 3), np.float32)
    for b in range(HUES):
        hue = 360.0 * b / HUES
        for low, dark in ((False, 0.5), (True, 0.8)):
            sel = (band == b) & ((row >= 3) == low)
            img[sel] = _two_tone(t[sel], _hue_rgb(hue, dark), _hue_rgb(hue, 0.95))
    edges, margin = np.zeros((height, width), bool), min(EDGE_MARGIN, width // HUES // 4)
    for cut in [width * b // HUES for b in range(1, HUES)]:
        edges[:, max(cut - margin, 0) : cut + margin] = True
    for cut in [height * r // 6 for r in range(1, 6)]:
        edges[max(cut - margin, 0) : cut + margin] = True
    return img, {"texture": ~edges, "grain": ~edges & (row == 5)}


_BUILDERS: dict[str, Callable[[int, int], tuple[np.ndarray, Regions]]] = {
    "checker": _checker, "lines": _lines, "weave_black": _weave_black, "bright_black": _bright_black,
    "herringbone": _herringbone, "hue_tex": _hue_tex,
}


def scene(name: str, height: int, width: int) -> tuple[np.ndarray, Regions]:
    """Scene ``name`` (:data:`SCENES`) as (H, W, 3) float32 sRGB in [0, 1] and its measurement regions (name ->
    (H, W) bool)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown scene {name!r}; expected one of {', '.join(SCENES)}")
    return _BUILDERS[name](height, width)


def scene_name(content: str) -> str | None:
    """``pattern:NAME`` -> NAME, anything else -> None."""
    return content.split(":", 1)[1] if content.startswith("pattern:") else None


__all__ = ["FLAT_BAND", "SCENES", "scene", "scene_name"]
