"""Bayer colour-filter-array helpers. A CFA is named by its 2x2 pattern read row-major ("RGGB", ...)."""

from __future__ import annotations

import torch
from torch import Tensor

from services.pipeline.ops._checks import small

CFA_PATTERNS: tuple[str, ...] = ("RGGB", "BGGR", "GRBG", "GBRG")
_CHANNEL = {"R": 0, "G": 1, "B": 2}


def cfa_channels(cfa: str) -> tuple[int, int, int, int]:
    """Channel index (0 R, 1 G, 2 B) of the four 2x2 sites, row-major: (0,0), (0,1), (1,0), (1,1)."""
    if not isinstance(cfa, str) or cfa.upper() not in CFA_PATTERNS:
        raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {cfa!r}")
    c = [_CHANNEL[ch] for ch in cfa.upper()]
    return c[0], c[1], c[2], c[3]


def site_map(values: Tensor, h: int, w: int) -> Tensor:
    """Tile a (2, 2) per-site tensor to (H, W): out[y, x] = values[y % 2, x % 2]."""
    if values.shape != (2, 2):
        raise ValueError(f"per-site values must have shape (2, 2), got {tuple(values.shape)}")
    return values.repeat((h + 1) // 2, (w + 1) // 2)[:h, :w]  # (H, W)


def cfa_masks(cfa: str, h: int, w: int, device: torch.device | str | None = None,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """One-hot colour masks (3, H, W): mask[c, y, x] = 1 where site (y, x) records channel c."""
    sites = small(cfa_channels(cfa), device).view(2, 2)
    channel = site_map(sites, h, w)  # (H, W) channel index per pixel
    wanted = torch.arange(3, device=device).view(3, 1, 1)
    return (channel.unsqueeze(0) == wanted).to(dtype)  # (3, H, W)


# The 8 orientations of the square's symmetry group as (transpose, flip columns, flip rows), applied in that order:
# identity, rotations by 180, 90 and 270 degrees, then the four reflections. Even H and W keep every one of them
# on whole CFA cells, so an oriented mosaic is again a Bayer mosaic (of another pattern, see oriented_cfa).
ORIENTATIONS: tuple[tuple[bool, bool, bool], ...] = (
    (False, False, False), (False, True, True), (True, True, False), (True, False, True),
    (False, True, False), (False, False, True), (True, False, False), (True, True, True),
)


def _orientation(k: int) -> tuple[bool, bool, bool]:
    if not 0 <= k < len(ORIENTATIONS):
        raise ValueError(f"orientation must be 0..{len(ORIENTATIONS) - 1}, got {k}")
    return ORIENTATIONS[k]


def orient(x: Tensor, k: int) -> Tensor:
    """``x`` (..., H, W) in orientation ``k`` (:data:`ORIENTATIONS`); :func:`unorient` undoes it."""
    transpose, flip_x, flip_y = _orientation(k)
    if transpose:
        x = x.transpose(-1, -2)
    if flip_x:
        x = x.flip(-1)
    if flip_y:
        x = x.flip(-2)
    return x


def unorient(x: Tensor, k: int) -> Tensor:
    """Inverse of :func:`orient`."""
    transpose, flip_x, flip_y = _orientation(k)
    if flip_y:
        x = x.flip(-2)
    if flip_x:
        x = x.flip(-1)
    if transpose:
        x = x.transpose(-1, -2)
    return x


def oriented_cfa(cfa: str, k: int, h: int = 0, w: int = 0) -> str:
    """The pattern of a ``cfa`` mosaic of ``h`` x ``w`` pixels after :func:`orient` by ``k`` (a flip moves the
    last row or column to the front, so what lands there depends on the size's parity; 0 x 0: even sizes)."""
    s = cfa.upper()
    cfa_channels(s)
    transpose, flip_x, flip_y = _orientation(k)
    grid = [[s[(y % 2) * 2 + x % 2] for x in range(2 + w % 2)] for y in range(2 + h % 2)]  # the sizes' parity
    if transpose:
        grid = [list(col) for col in zip(*grid, strict=True)]
    if flip_x:
        grid = [row[::-1] for row in grid]
    if flip_y:
        grid = grid[::-1]
    return grid[0][0] + grid[0][1] + grid[1][0] + grid[1][1]


def split_sites(mosaic: Tensor) -> Tensor:
    """(H, W) -> (4, H/2, W/2) CFA sub-planes, site order row-major."""
    h, w = mosaic.shape
    return mosaic.reshape(h // 2, 2, w // 2, 2).permute(1, 3, 0, 2).reshape(4, h // 2, w // 2)


def join_sites(planes: Tensor) -> Tensor:
    """(4, H/2, W/2) -> (H, W), inverse of :func:`split_sites`."""
    _, h2, w2 = planes.shape
    return planes.reshape(2, 2, h2, w2).permute(2, 0, 3, 1).reshape(2 * h2, 2 * w2)
