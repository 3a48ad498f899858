"""Bayer demosaicing: Malvar-He-Cutler (2004) gradient-corrected linear filters, and bilinear as a baseline.

Input mosaic (B, 1, H, W), linear and white-balanced; output (B, 3, H, W) RGB, same device and dtype.
Borders are reflect-padded, which keeps the CFA parity (row -1 mirrors row 1, a row of the same colours).
Receptive radius 2 (Malvar) and 1 (bilinear).
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.pipeline.ops._checks import check_image, check_min_size
from services.pipeline.ops.cfa import cfa_channels, cfa_masks
from services.pipeline.ops.filters import reflect_pad, shifted

MALVAR_RADIUS = 2
BILINEAR_RADIUS = 1


class _Taps:
    """Neighbourhood sums of a reflect-padded mosaic, named by compass direction."""

    def __init__(self, mosaic: Tensor, radius: int) -> None:
        self._p = reflect_pad(mosaic, radius)  # (B, 1, H+2r, W+2r)
        self._r = radius

    def at(self, dy: int, dx: int) -> Tensor:
        return shifted(self._p, self._r, dy, dx)  # (B, 1, H, W)

    def cross1(self) -> Tensor:  # the 4 direct neighbours
        return (self.at(-1, 0) + self.at(1, 0)) + (self.at(0, -1) + self.at(0, 1))

    def diag1(self) -> Tensor:  # the 4 diagonal neighbours
        return (self.at(-1, -1) + self.at(-1, 1)) + (self.at(1, -1) + self.at(1, 1))

    def vert(self, d: int) -> Tensor:
        return self.at(-d, 0) + self.at(d, 0)

    def horiz(self, d: int) -> Tensor:
        return self.at(0, -d) + self.at(0, d)


def _site_masks(cfa: str, mosaic: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Boolean (H, W) masks: R sites, B sites, G sites in R rows, G sites in B rows, all G sites."""
    h, w = mosaic.shape[-2:]
    masks = cfa_masks(cfa, h, w, mosaic.device, mosaic.dtype).bool()  # (3, H, W)
    is_r, is_g, is_b = masks[0], masks[1], masks[2]
    # A G site's row holds R or B; find it from the pattern: row 0 of the 2x2 holds R iff R is at (0,0)/(0,1).
    ch = cfa_channels(cfa)
    r_row = 0 if 0 in ch[:2] else 1
    row_parity = (torch.arange(h, device=mosaic.device) % 2 == r_row).view(h, 1)  # (H, 1) True on R rows
    g_in_r_row = is_g & row_parity  # (H, W)
    g_in_b_row = is_g & ~row_parity  # (H, W)
    return is_r, is_b, g_in_r_row, g_in_b_row, is_g


def _check(mosaic: Tensor, radius: int) -> None:
    check_image(mosaic, 1, "mosaic")
    check_min_size(mosaic, radius, "mosaic")


def _assemble(mosaic: Tensor, cfa: str, g_at_rb: Tensor, c_row: Tensor, c_col: Tensor,
              c_diag: Tensor) -> Tensor:
    """Pick per site from the four interpolants.

    ``c_row``: the colour whose samples lie left/right of a G site; ``c_col``: above/below a G site;
    ``c_diag``: the opposite colour at an R or B site.
    """
    is_r, is_b, g_r_row, g_b_row, is_g = _site_masks(cfa, mosaic)
    # At a G site in an R row, R is horizontal (c_row) and B vertical (c_col); swapped in a B row.
    r = mosaic.where(is_r, c_diag.where(is_b, c_row.where(g_r_row, c_col)))  # (B, 1, H, W)
    b = mosaic.where(is_b, c_diag.where(is_r, c_row.where(g_b_row, c_col)))  # (B, 1, H, W)
    g = mosaic.where(is_g, g_at_rb)  # (B, 1, H, W)
    return torch.cat([r, g, b], dim=1)  # (B, 3, H, W)


def demosaic_malvar(mosaic: Tensor, cfa: str) -> Tensor:
    """Malvar-He-Cutler demosaic: (B, 1, H, W) Bayer mosaic -> (B, 3, H, W) RGB (all 4 CFA phases)."""
    _check(mosaic, MALVAR_RADIUS)
    t = _Taps(mosaic, MALVAR_RADIUS)
    c = t.at(0, 0)
    axis2 = t.vert(2) + t.horiz(2)  # same-colour samples 2 away on the axes
    diag = t.diag1()
    # Coefficients of the paper (Fig. 2), all over 8.
    g_at_rb = (c * 4.0 + t.cross1() * 2.0 - axis2) * 0.125
    c_row = (c * 5.0 + t.horiz(1) * 4.0 - t.horiz(2) - diag + t.vert(2) * 0.5) * 0.125
    c_col = (c * 5.0 + t.vert(1) * 4.0 - t.vert(2) - diag + t.horiz(2) * 0.5) * 0.125
    c_diag = (c * 6.0 + diag * 2.0 - axis2 * 1.5) * 0.125
    return _assemble(mosaic, cfa, g_at_rb, c_row, c_col, c_diag)


def demosaic_bilinear(mosaic: Tensor, cfa: str) -> Tensor:
    """Bilinear demosaic (baseline): (B, 1, H, W) Bayer mosaic -> (B, 3, H, W) RGB."""
    _check(mosaic, BILINEAR_RADIUS)
    t = _Taps(mosaic, BILINEAR_RADIUS)
    g_at_rb = t.cross1() * 0.25
    c_row = t.horiz(1) * 0.5
    c_col = t.vert(1) * 0.5
    c_diag = t.diag1() * 0.25
    return _assemble(mosaic, cfa, g_at_rb, c_row, c_col, c_diag)
