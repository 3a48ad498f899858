"""Synthetic shots: sizes, determinism, shifts, ground truth and the colour contract, read back by LibRaw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rawpy
import tifffile

from lab.synth import synth
from lab.synth.synth import CAMERAS, shot_size, synthesize_shot
from lab.synth.unprocess import NOISE_LEVELS, read_from_shot
from services.raw.colour import render_colour, srgb_decode, srgb_encode
from services.raw.decode_child import extract
from services.raw.dng import read_dng_tags
from services.raw.meta import RawMeta

SCALE = 0.02  # IQ3_S -> 154 x 206


def test_shot_size_rounds_down_to_even() -> None:
    assert shot_size("IQ3_S", 0.1) == (772, 1030)
    assert shot_size("IQ2_XS", 0.1) == (690, 730)
    assert shot_size("IQ3_S", 1.0) == CAMERAS["IQ3_S"]
    with pytest.raises(ValueError):
        shot_size("IQ4", 0.1)


def test_iq3_single_frame_files(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ3_S", tmp_path, scale=SCALE)
    width, height = shot_size("IQ3_S", SCALE)
    assert [f.name for f in shot.files] == ["frame_00.dng"]
    assert shot.shifts == [(0.0, 0.0)]
    gt = tifffile.imread(shot.ground_truth)
    linear = np.load(tmp_path / "ground_truth_linear.npy")
    assert gt.shape == (height, width, 3) and gt.dtype == np.uint16
    assert linear.shape == (height, width, 3) and linear.dtype == np.float32
    assert linear.min() >= 0.0 and linear.max() <= 0.9
    np.testing.assert_allclose(srgb_decode(gt / 65535.0), linear, atol=2e-4)
    tags = read_dng_tags(shot.files[0])
    assert tags is not None and (tags["make"], tags["model"]) == ("Phase One", "IQ3_S")
    with rawpy.imread(str(shot.files[0])) as raw:
        assert raw.raw_image_visible.shape == (height, width)
    with pytest.raises(ValueError):
        synthesize_shot("IQ3_S", tmp_path, scale=SCALE, frames=2)


def test_iq2_stack_and_shifts(tmp_path: Path) -> None:
    shot = synthesize_shot("IQ2_XS", tmp_path, scale=SCALE, frames=3, max_shift=1.0)
    assert [f.name for f in shot.files] == ["frame_00.dng", "frame_01.dng", "frame_02.dng"]
    assert shot.shifts[0] == (0.0, 0.0) and len(shot.shifts) == 3
    assert all(abs(dy) <= 1.0 and abs(dx) <= 1.0 for dy, dx in shot.shifts)
    assert len({s for s in shot.shifts}) == 3
    tags = read_dng_tags(shot.files[2])
    assert tags is not None and tags["model"] == "IQ2_XS"
    assert tags["noise_profile"] == [0.002, read_from_shot(0.002)]
    for bad in (1, 17):
        with pytest.raises(ValueError):
            synthesize_shot("IQ2_XS", tmp_path / "bad", scale=SCALE, frames=bad)


def test_deterministic_from_seed(tmp_path: Path) -> None:
    a = synthesize_shot("IQ2_XS", tmp_path / "a", scale=SCALE, frames=2, seed=7)
    b = synthesize_shot("IQ2_XS", tmp_path / "b", scale=SCALE, frames=2, seed=7)
    c = synthesize_shot("IQ2_XS", tmp_path / "c", scale=SCALE, frames=2, seed=8)
    assert a.shifts == b.shifts != c.shifts
    for fa, fb, fc in zip(a.files, b.files, c.files, strict=True):
        assert fa.read_bytes() == fb.read_bytes() != fc.read_bytes()
    assert a.ground_truth.read_bytes() == b.ground_truth.read_bytes()


def test_renderer_shift_convention() -> None:
    """frame_k(y, x) == frame_0(y - dy, x - dx): content moves by +shift."""
    scene = synth._make_scene(np.random.default_rng(3), 64, 80)
    base = synth._render(scene, 0.0, 0.0)
    moved = synth._render(scene, 2.0, -3.0)
    np.testing.assert_allclose(moved[2:, :-3], base[:-2, 3:], atol=1e-4)


@pytest.mark.parametrize("cfa", ["RGGB", "BGGR", "GRBG", "GBRG"])
def test_noise_free_shot_inverts_to_ground_truth(tmp_path: Path, cfa: str) -> None:
    """The DNG colour pipeline (gains, out_from_wb_cam) recovers the linear truth at every CFA site."""
    shot = synthesize_shot("IQ3_S", tmp_path, scale=SCALE, noise=0.0, cfa=cfa)
    truth = np.load(tmp_path / "ground_truth_linear.npy").astype(np.float64)  # [H, W, 3]
    meta = RawMeta.from_dict(extract(shot.files[0], tmp_path / "m.npy"))
    rc = render_colour(meta)
    gains, m = np.asarray(rc.gains), rc.out_from_wb_cam
    with rawpy.imread(str(shot.files[0])) as raw:
        x = (raw.raw_image_visible - 1024.0) / (65535.0 - 1024.0)  # [H, W]
        channel = np.array(["RGB".index(raw.color_desc.decode()[c]) for c in raw.raw_colors_visible.ravel()])
    channel = channel.reshape(x.shape)
    assert "".join("RGB"[c] for c in channel[:2, :2].ravel()) == cfa
    # White-balanced camera RGB of the truth, with the measured raw value substituted at each CFA site.
    balanced = truth @ np.linalg.inv(m).T  # [H, W, 3]
    site = np.take_along_axis(balanced, channel[..., None], axis=2)[..., 0]
    measured = x * gains[channel]
    np.testing.assert_allclose(measured, site, atol=3e-5)  # 16-bit quantisation times the gain
    np.put_along_axis(balanced, channel[..., None], measured[..., None], axis=2)
    np.testing.assert_allclose(balanced @ m.T, truth, atol=1e-4)


def test_noise_follows_profile(tmp_path: Path) -> None:
    noise = 0.002
    clean = synthesize_shot("IQ3_S", tmp_path / "clean", scale=SCALE, noise=0.0, seed=5)
    noisy = synthesize_shot("IQ3_S", tmp_path / "noisy", scale=SCALE, noise=noise, seed=5)
    with rawpy.imread(str(clean.files[0])) as a, rawpy.imread(str(noisy.files[0])) as b:
        x = (a.raw_image_visible.astype(np.float64) - 1024) / (65535 - 1024)
        y = (b.raw_image_visible.astype(np.float64) - 1024) / (65535 - 1024)
    ratio = np.mean((y - x) ** 2) / np.mean(noise * x + read_from_shot(noise))
    assert 0.9 < ratio < 1.1


def test_named_noise_level_and_photo_content(tmp_path: Path) -> None:
    photos = Path(__file__).resolve().parents[3] / "shared" / "data" / "photos"
    if not (photos / "033.png").is_file():
        pytest.skip("shared photographs not present")
    shot = synthesize_shot("IQ2_XS", tmp_path, scale=SCALE, frames=2, noise="mid", content="photo:033",
                           photos_dir=photos)
    tags = read_dng_tags(shot.files[0])
    assert tags is not None and tags["noise_profile"] == [NOISE_LEVELS["mid"].shot, NOISE_LEVELS["mid"].read]
    linear = np.load(tmp_path / "ground_truth_linear.npy")
    assert linear.shape == (*shot_size("IQ2_XS", SCALE)[::-1], 3)
    assert linear.min() >= 0.0 and linear.max() <= 1.0 and linear.std() > 0.05
    with pytest.raises(ValueError, match="noise level"):
        synthesize_shot("IQ3_S", tmp_path, scale=SCALE, noise="loud")


def test_srgb_curve_round_trip() -> None:
    v = np.linspace(0, 1, 1001)
    np.testing.assert_allclose(srgb_decode(srgb_encode(v)), v, atol=1e-12)
    assert srgb_encode(np.array([0.0031308]))[0] == pytest.approx(0.04045, abs=1e-6)
