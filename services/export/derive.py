"""Outputs derived on the CPU from the 16-bit render of their colour space: 8-bit codes, resized proofs.

Resizing happens in linear light (the space's transfer decoded to float32, then a bicubic filter with
antialiasing, then encoded again), so fine detail keeps its brightness (a gamma-space average darkens it);
optional output sharpening (the pipeline's halo-free unsharp mask) is applied on the encoded result. Images are
only ever made smaller (a long edge at or above the image's keeps its size). Pure torch on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from services.export.tiff import Bands
from services.pipeline.ops import decode_transfer, encode_transfer, sharpen, to_uint16

OUTPUT_SHARPEN_SIGMA = 0.8
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


def fit_long_edge(height: int, width: int, long_edge: int) -> tuple[int, int]:
    """The (height, width) with the long edge at ``long_edge`` (never larger than now), aspect kept."""
    scale = long_edge / max(height, width)
    if scale >= 1.0:
        return height, width
    return max(1, round(height * scale)), max(1, round(width * scale))


def _linear(rgb16: np.ndarray, transfer: str) -> torch.Tensor:
    """(H, W, 3) uint16 codes -> (1, 3, H, W) float32 linear light."""
    out = torch.empty((1, 3, *rgb16.shape[:2]), dtype=torch.float32)
    for y0 in range(0, rgb16.shape[0], _ROWS):
        rows = torch.from_numpy(np.ascontiguousarray(rgb16[y0 : y0 + _ROWS]).astype(np.float32) / 65535.0)
        out[0, :, y0 : y0 + _ROWS] = decode_transfer(rows.permute(2, 0, 1), transfer)
    return out


@torch.inference_mode()
def resize_linear(rgb16: np.ndarray, long_edge: int, transfer: str, sharpen_amount: float = 0.0) -> torch.Tensor:
    """Resize (H, W, 3) uint16 ``transfer``-encoded codes to ``long_edge`` in linear light; optional output
    sharpening. Returns the encoded result (1, 3, h, w) float32 in [0, 1]."""
    h, w = fit_long_edge(rgb16.shape[0], rgb16.shape[1], long_edge)
    x = _linear(rgb16, transfer)
    if (h, w) != tuple(x.shape[-2:]):
        x = F.interpolate(x, size=(h, w), mode="bicubic", antialias=True, align_corners=False)
    x = encode_transfer(x.clamp(0.0, 1.0), transfer)
    if sharpen_amount > 0 and min(h, w) > 2:
        x = sharpen(x, sharpen_amount, OUTPUT_SHARPEN_SIGMA)
    return x


def quantise(x: torch.Tensor, bits: int) -> np.ndarray:
    """(1, 3, h, w) encoded floats in [0, 1] -> (h, w, 3) uint8 or uint16 codes (round half up)."""
    if bits == 16:
        codes = to_uint16(x)[0].permute(1, 2, 0)
        return codes.contiguous().numpy()
    return torch.floor(x * 255.0 + 0.5).clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).contiguous().numpy()


def derive_bands(bands: Bands, *, bits: int, long_edge: int | None, transfer: str,
                 sharpen_amount: float = 0.0) -> Bands:
    """The bands a recipe writes, from the 16-bit render of its space: as they are (16-bit, full size), as
    8-bit codes, or resized in linear light (one band)."""
    if long_edge is None:
        return bands if bits == 16 else bands_8bit(bands)
    return [(0, quantise(resize_linear(stitch(bands), long_edge, transfer, sharpen_amount), bits))]
