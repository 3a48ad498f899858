"""DNG corrections LibRaw leaves undone, applied to the visible mosaic at decode: BlackLevelDeltaH/V (a black level
per column and per row on top of BlackLevel) and OpcodeList2's GainMap (lens shading, as phone, drone and many
converted DNGs carry it). Found from outside: both were ignored, so such files rendered with lifted, tinted
shadows or their vignetting left in, and the job reported nothing.

The DNG specification applies OpcodeList2 to the linearized, black-subtracted image of the active area; since that
mapping is affine, a gain on it is the same gain on the raw values above their black level, which is how it is
applied here (the black stays in, as the rest of the pipeline expects). Other opcodes (bad pixels, OpcodeList1's
and OpcodeList3's warps and vignetting) are not applied, as by LibRaw; :func:`unapplied_opcodes` names them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import tifffile

TAG_BLACK_LEVEL_DELTA_H, TAG_BLACK_LEVEL_DELTA_V = 50715, 50716
TAG_OPCODE_LISTS = {51008: 1, 51009: 2, 51022: 3}
OPCODE_GAIN_MAP = 9
OPCODE_NAMES = {1: "WarpRectilinear", 2: "WarpFisheye", 3: "FixVignetteRadial", 4: "FixBadPixelsConstant",
                5: "FixBadPixelsList", 6: "TrimBounds", 7: "MapTable", 8: "MapPolynomial", 9: "GainMap",
                10: "DeltaPerRow", 11: "DeltaPerColumn", 12: "ScalePerRow", 13: "ScalePerColumn"}
_GAIN_MAP_HEAD = struct.Struct(">IIIIIIIIII dddd I")  # the GainMap's fixed parameters, big-endian


@dataclass(frozen=True)
class GainMap:
    """One GainMap opcode: gains on a grid over the image, for the pixels of ``area`` (top, left, bottom, right,
    relative to the active area) taken every ``pitch`` (rows, cols); ``gains`` (points v, points h) in the image's
    relative coordinates from ``origin`` (v, h) every ``spacing`` (v, h)."""

    area: tuple[int, int, int, int]
    pitch: tuple[int, int]
    origin: tuple[float, float]
    spacing: tuple[float, float]
    gains: np.ndarray


@dataclass(frozen=True)
class Corrections:
    """What to apply to a DNG's mosaic (the active area's coordinates): per-column and per-row black deltas
    (None: absent) and OpcodeList2's gain maps; ``unapplied``: the other opcodes it holds, by name."""

    delta_h: np.ndarray | None = None
    delta_v: np.ndarray | None = None
    gain_maps: tuple[GainMap, ...] = ()
    unapplied: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return self.delta_h is not None or self.delta_v is not None or bool(self.gain_maps)


def _opcodes(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode id, parameters) of an opcode list (big-endian: count, then id, version, flags, size, parameters)."""
    (count,), pos, out = struct.unpack_from(">I", data, 0), 4, []
    for _ in range(count):
        opcode, _version, _flags, size = struct.unpack_from(">IIII", data, pos)
        out.append((opcode, data[pos + 16:pos + 16 + size]))
        pos += 16 + size
    return out


def _gain_map(params: bytes) -> GainMap | None:
    top, left, bottom, right, _plane, _planes, row_pitch, col_pitch, points_v, points_h, spacing_v, spacing_h, \
        origin_v, origin_h, map_planes = _GAIN_MAP_HEAD.unpack_from(params, 0)
    n = points_v * points_h * map_planes
    if n == 0 or len(params) < _GAIN_MAP_HEAD.size + 4 * n or min(row_pitch, col_pitch) < 1:
        return None
    gains = np.frombuffer(params, ">f4", n, _GAIN_MAP_HEAD.size).astype(np.float32)
    gains = gains.reshape(points_v, points_h, map_planes)[..., 0]  # a mosaic has one plane
    if not np.all(np.isfinite(gains)) or np.any(gains < 0):
        return None
    return GainMap((top, left, bottom, right), (row_pitch, col_pitch), (origin_v, origin_h),
                   (spacing_v or 1.0, spacing_h or 1.0), gains)


def _floats(tag: tifffile.TiffTag | None) -> np.ndarray | None:
    if tag is None:
        return None
    values = np.atleast_1d(np.asarray(tag.value, dtype=np.float64)).ravel()
    if int(tag.dtype) in (5, 10):  # (S)RATIONAL: flat (num, den) pairs
        with np.errstate(divide="ignore", invalid="ignore"):
            values = values[0::2] / values[1::2]
    return values if values.size and np.all(np.isfinite(values)) and np.any(values) else None


def read_corrections(page: tifffile.TiffPage) -> Corrections:
    """The corrections the raw IFD ``page`` states (its own tags)."""
    gains: list[GainMap] = []
    unapplied: list[str] = []
    for code, number in TAG_OPCODE_LISTS.items():
        tag = page.tags.get(code)
        if tag is None:
            continue
        try:
            opcodes = _opcodes(bytes(tag.value))
        except (struct.error, TypeError):
            unapplied.append(f"OpcodeList{number} (unreadable)")
            continue
        for opcode, params in opcodes:
            try:
                gain = _gain_map(params) if number == 2 and opcode == OPCODE_GAIN_MAP else None
            except struct.error:
                gain = None
            if gain is not None:
                gains.append(gain)
            else:
                unapplied.append(f"OpcodeList{number} {OPCODE_NAMES.get(opcode, f'opcode {opcode}')}")
    return Corrections(_floats(page.tags.get(TAG_BLACK_LEVEL_DELTA_H)), _floats(page.tags.get(TAG_BLACK_LEVEL_DELTA_V)),
                       tuple(gains), tuple(unapplied))


def _axis(n: int, image: int, origin: float, spacing: float, points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``n`` pixel positions 0..n-1 of an image ``image`` long: the map's lower index, upper index and weight
    (pixel centres in relative coordinates, clamped to the map's edge, as the DNG SDK interpolates)."""
    f = np.clip(((np.arange(n) + 0.5) / image - origin) / spacing, 0, points - 1)
    lo = np.floor(f).astype(np.int64)
    return lo, np.minimum(lo + 1, points - 1), (f - lo).astype(np.float32)


def gain_field(gain: GainMap, height: int, width: int) -> np.ndarray:
    """The gain of every pixel of an image of the active area's size (1 outside the map's area and pitch)."""
    v0, v1, wv = _axis(height, height, gain.origin[0], gain.spacing[0], gain.gains.shape[0])
    h0, h1, wh = _axis(width, width, gain.origin[1], gain.spacing[1], gain.gains.shape[1])
    g = gain.gains
    top = g[v0][:, h0] * (1 - wh) + g[v0][:, h1] * wh
    bottom = g[v1][:, h0] * (1 - wh) + g[v1][:, h1] * wh
    field = top * (1 - wv[:, None]) + bottom * wv[:, None]
    mask = np.zeros((height, width), bool)
    t, left, b, r = gain.area
    mask[max(t, 0):min(b, height):gain.pitch[0], max(left, 0):min(r, width):gain.pitch[1]] = True
    return np.where(mask, field, np.float32(1.0)).astype(np.float32)


def apply_corrections(pixels: np.ndarray, corrections: Corrections, black: np.ndarray,
                      offset: tuple[int, int], area: tuple[int, int]) -> np.ndarray:
    """``pixels`` (the visible mosaic, uint16), ``offset`` (rows, cols) into an active area of ``area`` (height,
    width), corrected: the black deltas subtracted, then OpcodeList2's gains applied above ``black`` (the per-pixel
    BlackLevel, the visible mosaic's shape). Returns uint16, clipped to its range."""
    h, w = pixels.shape
    r0, c0 = offset
    x = pixels.astype(np.float32)
    if corrections.delta_v is not None:
        x -= _padded(corrections.delta_v, area[0])[r0:r0 + h, None].astype(np.float32)
    if corrections.delta_h is not None:
        x -= _padded(corrections.delta_h, area[1])[None, c0:c0 + w].astype(np.float32)
    if corrections.gain_maps:
        gain = np.ones(area, np.float32)
        for g in corrections.gain_maps:
            gain *= gain_field(g, *area)
        x = black + (x - black) * gain[r0:r0 + h, c0:c0 + w]
    return np.clip(np.rint(x), 0, 65535).astype(np.uint16)


def _padded(values: np.ndarray, n: int) -> np.ndarray:
    """``values`` as ``n`` entries (a short list padded with its last value, a long one cut)."""
    return values[:n] if values.size >= n else np.concatenate([values, np.full(n - values.size, values[-1])])
