"""Outputs derived on the CPU from the 16-bit render of their colour space: 8-bit codes, resized proofs.

Resizing happens in linear light (the space's transfer decoded through a lookup table, box-binned by an integer
factor, then a bicubic filter with antialiasing for the last factor, then encoded again), so fine detail keeps
its brightness (a gamma-space average darkens it); optional output sharpening (the pipeline's halo-free unsharp
mask) is applied on the encoded result. Images are only ever made smaller (a long edge at or above the image's
keeps its size). Pure torch on the CPU, band by band: no whole float image is held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from services.export.recipes import Recipe
from services.export.tiff import Bands
from services.pipeline.binning import binned, finish_resized, quantise

_ROWS = 512  # decode/encode in chunks of rows: fewer float temporaries of a whole image


def stitch(bands: Bands) -> np.ndarray:
    """The bands as one (H, W, C) array (a view when there is one band)."""
    if len(bands) == 1:
        return np.asarray(bands[0][1])
    return np.concatenate([np.asarray(rows) for _, rows in bands])


def to_8bit(rgb16: np.ndarray) -> np.ndarray:
    """uint16 codes -> uint8 codes, rounded (``v * 255 / 65535`` to nearest)."""
    return ((rgb16.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def bands_8bit(bands: Bands) -> list[tuple[int, np.ndarray]]:
    return [(top, to_8bit(np.asarray(rows))) for top, rows in bands]


ProofSpec = tuple[str, int, int, float]  # (colour space, long edge, bits, sharpen amount) of a resized output


def proof_spec(recipe: Recipe) -> ProofSpec:
    """What identifies a resized recipe's pixels (its file's other settings, format and quality, do not change
    them): the key of an output a worker finished (:func:`services.pipeline.binning.proof_from_bins`)."""
    return recipe.colour_space, int(recipe.long_edge or 0), recipe.bits, float(recipe.sharpen)


def fit_long_edge(height: int, width: int, long_edge: int) -> tuple[int, int]:
    """The (height, width) with the long edge at ``long_edge`` (never larger than now), aspect kept."""
    scale = long_edge / max(height, width)
    if scale >= 1.0:
        return height, width
    return max(1, round(height * scale)), max(1, round(width * scale))


def box_factor(height: int, width: int, h: int, w: int) -> int:
    """The integer box-binning done before the final filter: as much as leaves it at least a 2x reduction (an
    area average in linear light is an exact antialiasing step; the filter then only does the last factor)."""
    return max(1, int(min(height / max(h, 1), width / max(w, 1)) // 2))


PreBinned = Sequence[tuple[int, np.ndarray]]  # (first bin row, (n, W // k, 3) float32) made beside the strips


def _linear_binned(bands: Bands, transfer: str, k: int, prebinned: PreBinned = ()) -> torch.Tensor:
    """The image of ``bands`` ((rows, W, 3) uint16 codes) in linear light, box-binned by ``k``: (1, 3, H//k, W//k)
    float32, held channels-last (the bins' own layout: filled row by row, no transposing copy; the resize reads
    it as it is, 0.08 s less per proof on one core). Bin rows already made (``prebinned``, by the GPU workers) are
    taken as they are; the rest are decoded through a lookup, band by band in chunks of rows (never a whole float
    image)."""
    rows = [np.asarray(b) for _, b in bands]
    height, width = sum(r.shape[0] for r in rows), rows[0].shape[1]
    hk, wk = height // k, width // k
    hwc = np.empty((hk, wk, 3), dtype=np.float32)
    have = np.zeros(hk, dtype=bool)
    for first, made in prebinned:
        n = min(made.shape[0], hk - first)
        if n > 0 and made.shape[1] == wk:
            hwc[first : first + n] = made[:n]
            have[first : first + n] = True
    stitched = rows[0] if len(rows) == 1 else None
    j = 0
    while j < hk:  # each run of bin rows still missing
        if have[j]:
            j += 1
            continue
        j1 = j
        while j1 < hk and not have[j1]:
            j1 += 1
        for a in range(j, j1, max(1, _ROWS // k)):
            b = min(a + max(1, _ROWS // k), j1)
            chunk = stitched[a * k : b * k] if stitched is not None else _rows_of(rows, a * k, b * k)
            hwc[a:b] = binned(chunk, a * k, k, transfer, bins=range(a, b))
        j = j1
    return torch.from_numpy(hwc).permute(2, 0, 1)[None]


def _rows_of(rows: list[np.ndarray], y0: int, y1: int) -> np.ndarray:
    """Rows [y0, y1) of the image the bands make up (joined where they straddle two)."""
    parts, top = [], 0
    for r in rows:
        lo, hi = max(y0, top), min(y1, top + r.shape[0])
        if lo < hi:
            parts.append(r[lo - top : hi - top])
        top += r.shape[0]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@torch.inference_mode()
def resize_linear(bands: Bands | np.ndarray, long_edge: int, transfer: str, sharpen_amount: float = 0.0,
                  prebinned: Mapping[int, PreBinned] | None = None) -> torch.Tensor:
    """Resize an image of ``transfer``-encoded uint16 codes (its row bands, or one (H, W, 3) array) to
    ``long_edge`` in linear light: box-binned by an integer factor, then a bicubic filter with antialiasing for
    the rest; optional output sharpening. Returns the encoded result (1, 3, h, w) float32 in [0, 1].
    ``prebinned``: bins by factor already made beside the strips (:mod:`services.pipeline.binning`)."""
    if isinstance(bands, np.ndarray):
        bands = [(0, bands)]
    rows = [np.asarray(b) for _, b in bands]
    height, width = sum(r.shape[0] for r in rows), rows[0].shape[1]
    h, w = fit_long_edge(height, width, long_edge)
    k = box_factor(height, width, h, w)
    return finish_resized(_linear_binned(bands, transfer, k, (prebinned or {}).get(k, ())), (h, w), transfer,
                          sharpen_amount)


def derive_bands(bands: Bands, *, bits: int, long_edge: int | None, transfer: str,
                 sharpen_amount: float = 0.0, prebinned: Mapping[int, PreBinned] | None = None) -> Bands:
    """The bands a recipe writes, from the 16-bit render of its space: as they are (16-bit, full size), as
    8-bit codes, or resized in linear light (one band)."""
    if long_edge is None:
        return bands if bits == 16 else bands_8bit(bands)
    return [(0, quantise(resize_linear(bands, long_edge, transfer, sharpen_amount, prebinned), bits))]
