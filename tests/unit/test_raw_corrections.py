"""BlackLevelDeltaH/V and OpcodeList2's GainMap, applied at decode (found from outside: both were ignored, so such
DNGs rendered with lifted, tinted shadows or their lens shading left in). Real DNGs through LibRaw's path."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from services.raw.corrections import GainMap, gain_field
from services.raw.decode import decode_raw
from tests.raw_layouts import PHOTOMETRIC_CFA, _mosaic, _tags, _tiff

BLACK = 256  # tests.raw_layouts' BlackLevel


def _cfa_tags() -> list:
    from services.raw.dng import TAG_CFA_PATTERN, TAG_CFA_PLANE_COLOR, TAG_CFA_REPEAT_PATTERN_DIM

    return _tags([(TAG_CFA_REPEAT_PATTERN_DIM, "H", 2, (2, 2), True), (TAG_CFA_PATTERN, "B", 4, (0, 1, 1, 2), True),
                  (TAG_CFA_PLANE_COLOR, "B", 3, (0, 1, 2), True)])


def _srational(values: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for pair in ((round(x * 100), 100) for x in values) for v in pair)


def _gain_map_list(gains: np.ndarray, area: tuple[int, int, int, int], pitch: int = 1) -> bytes:
    v, h = gains.shape
    params = struct.pack(">IIIIIIIIII dddd I", *area, 0, 1, pitch, pitch, v, h, 1 / max(v - 1, 1),
                         1 / max(h - 1, 1), 0.0, 0.0, 1) + gains.astype(">f4").tobytes()
    return struct.pack(">I", 1) + struct.pack(">IIII", 9, 0x01030000, 0, len(params)) + params


def _decode(tmp_path: Path, raw: np.ndarray, extra: list) -> np.ndarray:
    path = tmp_path / "f.dng"
    path.write_bytes(_tiff(raw, PHOTOMETRIC_CFA, _cfa_tags() + extra))
    decode_raw(path, tmp_path / "f.npy")
    return np.load(tmp_path / "f.npy").astype(np.int64)


def test_black_level_deltas_are_subtracted(tmp_path: Path) -> None:
    scene = _mosaic(48, 72, seed=5)
    dh = np.linspace(0, 440, 72)
    dv = np.linspace(0, 300, 48)
    raw = np.clip(np.rint(scene + dh[None, :] + dv[:, None]), 0, 65535).astype(np.uint16)
    out = _decode(tmp_path, raw, [(50715, "2i", 72, _srational(dh), True), (50716, "2i", 48, _srational(dv), True)])
    assert out.shape == scene.shape and np.abs(out - scene).max() <= 1


def test_a_gain_map_is_applied_above_black(tmp_path: Path) -> None:
    scene = _mosaic(48, 72, seed=6)
    two = np.full((2, 2), 2.0, np.float32)  # a constant gain of 2: the raw holds half the signal above black
    raw = np.rint(BLACK + (scene.astype(np.float64) - BLACK) / 2).astype(np.uint16)
    out = _decode(tmp_path, raw, [(51009, 7, None, _gain_map_list(two, (0, 0, 48, 72)), True)])
    assert np.abs(out - scene).max() <= 2
    # Lens shading: 1.0 in the centre to 1.6 in the corners, interpolated between the map's points.
    shading = np.array([[1.6, 1.2, 1.6], [1.2, 1.0, 1.2], [1.6, 1.2, 1.6]], np.float32)
    field = gain_field(GainMap((0, 0, 48, 72), (1, 1), (0.0, 0.0), (0.5, 0.5), shading), 48, 72)
    assert field.min() >= 1.0 and field[24, 36] < 1.01 and field[0, 0] > 1.55
    raw = np.rint(BLACK + (scene.astype(np.float64) - BLACK) / field).astype(np.uint16)
    out = _decode(tmp_path, raw, [(51009, 7, None, _gain_map_list(shading, (0, 0, 48, 72)), True)])
    assert np.abs(out - scene).max() <= 2


def test_an_odd_active_area_origin_keeps_its_first_row_and_column(tmp_path: Path) -> None:
    """Found from outside: LibRaw rounds an odd ActiveArea origin up to even, so a 600 x 400 area (the size the
    upload reported) came out 599 x 399, shifted by a pixel. The file's area is taken as it states it."""
    raw = _mosaic(404, 606, seed=7)
    area = (1, 1, 401, 601)
    path = tmp_path / "f.dng"
    path.write_bytes(_tiff(raw, PHOTOMETRIC_CFA, _cfa_tags() + [(50829, "I", 4, area, True)]))
    meta = decode_raw(path, tmp_path / "f.npy")
    out = np.load(tmp_path / "f.npy")
    assert out.shape == (400, 600) and (meta.height, meta.width) == (400, 600)
    np.testing.assert_array_equal(out, raw[1:401, 1:601])
    assert meta.cfa == "RGGB"  # the pattern as the file states it, from the area's corner
