"""DNG writer: round trip through LibRaw (rawpy) for every CFA phase, plus exact tag read-back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rawpy

from lab.synth.synth import COLOR_MATRIX
from services.raw.colour import CameraProfile, as_shot_neutral, camera_rgb_matrix
from services.raw.dng import read_dng_tags, write_dng
from services.raw.meta import CFA_PATTERNS, NoiseProfile

BLACK, WHITE = 1024, 65535


def _write(path: Path, mosaic: np.ndarray, cfa: str, noise: NoiseProfile | None = None) -> None:
    write_dng(
        path,
        mosaic,
        cfa=cfa,
        black_level=BLACK,
        white_level=WHITE,
        profile=CameraProfile(COLOR_MATRIX),
        as_shot_neutral=as_shot_neutral(COLOR_MATRIX).tolist(),
        make="Phase One",
        model="IQ3_S",
        noise_profile=noise,
    )


@pytest.mark.parametrize("shape", [(32, 48), (33, 47)])
@pytest.mark.parametrize("cfa", CFA_PATTERNS)
def test_rawpy_reads_what_we_wrote(tmp_path: Path, cfa: str, shape: tuple[int, int]) -> None:
    mosaic = np.random.default_rng(1).integers(0, WHITE + 1, shape).astype(np.uint16)
    path = tmp_path / "x.dng"
    _write(path, mosaic, cfa)
    with rawpy.imread(str(path)) as raw:
        np.testing.assert_array_equal(raw.raw_image_visible, mosaic)
        desc = raw.color_desc.decode()
        assert "".join(desc[c] for c in raw.raw_colors_visible[:2, :2].ravel()) == cfa
        assert list(raw.black_level_per_channel) == [BLACK] * 4
        assert raw.white_level == WHITE
        # LibRaw turns AsShotNeutral into camera multipliers 1/neutral (4th = 0: "same as green").
        np.testing.assert_allclose(raw.camera_whitebalance[:3], 1 / as_shot_neutral(COLOR_MATRIX), rtol=1e-6)
        # LibRaw keeps DNG colour in rgb_cam = inv(row-normalised ColorMatrix @ sRGB->XYZ); its own sRGB
        # constants have fewer digits, hence the tolerance. rgb_xyz_matrix (cam_xyz) is only filled from
        # LibRaw's built-in camera table, so for our DNGs it stays zero.
        np.testing.assert_allclose(
            raw.color_matrix[:, :3], np.linalg.inv(camera_rgb_matrix(COLOR_MATRIX)), rtol=1e-4, atol=1e-4
        )
        rgb_xyz = raw.rgb_xyz_matrix[:3]
        if np.any(rgb_xyz):
            np.testing.assert_allclose(rgb_xyz, COLOR_MATRIX, rtol=1e-4)


def test_tags_read_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "x.dng"
    _write(path, np.zeros((8, 8), np.uint16), "GRBG", NoiseProfile(shot=0.002, read=2e-6))
    tags = read_dng_tags(path)
    assert tags is not None
    assert (tags["make"], tags["model"]) == ("Phase One", "IQ3_S")
    assert tags["color_matrix"] == COLOR_MATRIX.ravel().tolist()
    np.testing.assert_allclose(tags["as_shot_neutral"], as_shot_neutral(COLOR_MATRIX), rtol=1e-8)
    assert tags["noise_profile"] == [0.002, 2e-6]
    assert tags["black_level"] == [BLACK] and tags["black_level_repeat"] == (1, 1)
    assert tags["white_level"] == WHITE
    assert [p.name for p in tmp_path.iterdir()] == ["x.dng"]  # no temp file left behind


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="uint16"):
        _write(tmp_path / "a.dng", np.zeros((8, 8), np.float32), "RGGB")
    with pytest.raises(ValueError, match="cfa"):
        _write(tmp_path / "b.dng", np.zeros((8, 8), np.uint16), "RGBG")
    assert not list(tmp_path.iterdir())
