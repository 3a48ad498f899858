"""Unprocessing (Brooks et al.): exact round trip, CFA phases, noise statistics, levels, content split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lab.synth import unprocess as up
from services.pipeline.ops.colour import apply_matrix, srgb_decode


def test_noise_free_unprocess_then_process_returns_input() -> None:
    rng = np.random.default_rng(0)
    srgb = torch.rand(3, 3, 9, 11, dtype=torch.float64)  # odd sizes
    batch = up.unprocess_batch(srgb, rng, noise="none", highlight_fraction=0.0)
    assert batch.noisy.shape == batch.clean.shape == (3, 1, 9, 11) and batch.target.shape == (3, 3, 9, 11)
    torch.testing.assert_close(batch.noisy, batch.clean)
    # process: white balance the (full-resolution) camera RGB, then the per-sample DNG matrix
    for i in range(3):
        out = apply_matrix(batch.target[i : i + 1], batch.out_from_wb_cam[i].numpy())
        torch.testing.assert_close(out, srgb_decode(srgb[i : i + 1]), atol=1e-10, rtol=0)
    # the mosaic holds target * neutral at its CFA sites
    camera = batch.target * (1.0 / batch.gains)[:, :, None, None]
    torch.testing.assert_close(batch.clean, up.mosaic(camera, batch.cfa))


def test_highlights_saturate_and_target_is_clipped_camera() -> None:
    srgb = torch.ones(2, 3, 4, 4, dtype=torch.float64)
    batch = up.unprocess_batch(srgb, np.random.default_rng(1), noise="none", highlight_fraction=1.0,
                               max_exposure=3.0)
    assert batch.clean.max() == 1.0  # clipped at the white level
    camera = batch.target * (1.0 / batch.gains)[:, :, None, None]
    assert camera.max() <= 1.0 + 1e-12


@pytest.mark.parametrize("cfa", up.CFA_PATTERNS)
def test_mosaic_phases(cfa: str) -> None:
    rgb = torch.arange(3, dtype=torch.float32).view(1, 3, 1, 1).expand(2, 3, 5, 7).contiguous()
    m = up.mosaic(rgb, cfa)
    assert m.shape == (2, 1, 5, 7)
    assert "".join("RGB"[int(v)] for v in m[0, 0, :2, :2].flatten()) == cfa
    np_out = up.mosaic(rgb.numpy(), cfa)
    assert isinstance(np_out, np.ndarray) and np.array_equal(np_out, m.numpy())
    with pytest.raises(ValueError):
        up.mosaic(rgb, "RGBG")


@pytest.mark.parametrize("poisson", [True, False])
def test_noise_statistics_match_shot_and_read(poisson: bool) -> None:
    shot, read = 2e-3, 4e-5
    gen = torch.Generator().manual_seed(0)
    for level in (0.05, 0.5):
        clean = torch.full((1, 1, 256, 256), level, dtype=torch.float64)
        noisy = up.add_noise(clean, shot, read, gen, poisson=poisson)
        var = float((noisy - clean).var())
        assert var == pytest.approx(shot * level + read, rel=0.05)
        assert float((noisy - clean).mean()) == pytest.approx(0.0, abs=3 * (var / clean.numel()) ** 0.5)


def test_per_sample_noise_and_numpy_input() -> None:
    clean = np.full((2, 1, 128, 128), 0.25)
    noisy = up.add_noise(clean, np.array([0.0, 1e-2]), np.array([0.0, 0.0]), torch.Generator().manual_seed(1))
    assert isinstance(noisy, np.ndarray)
    assert np.array_equal(noisy[0], clean[0])
    assert np.var(noisy[1] - clean[1]) == pytest.approx(1e-2 * 0.25, rel=0.1)


def test_noise_levels_on_brooks_line() -> None:
    assert up.noise_level("none").shot == 0.0 and up.noise_level("none").read == 0.0
    shots = [up.NOISE_LEVELS[n].shot for n in ("low", "mid", "high")]
    assert shots == sorted(shots)
    for name in ("low", "mid", "high"):
        lvl = up.NOISE_LEVELS[name]
        assert np.log(lvl.read) == pytest.approx(2.18 * np.log(lvl.shot) + 1.2)
    assert up.noise_level("0.002").shot == 0.002 and up.noise_level(0.0).read == 0.0
    with pytest.raises(ValueError):
        up.noise_level("extreme")
    s, r = up.sample_noise(1000, np.random.default_rng(0))
    assert s.min() >= up.SHOT_RANGE[0] and s.max() <= up.SHOT_RANGE[1]
    resid = np.log(r) - (2.18 * np.log(s) + 1.2)
    assert abs(resid.mean()) < 0.05 and resid.std() == pytest.approx(0.26, rel=0.15)


def test_content_split_is_disjoint_and_deterministic() -> None:
    assert len(up.PHOTOS_TRAIN) == 32 and len(up.PHOTOS_HELD_OUT) == 8
    assert not set(up.PHOTOS_TRAIN) & set(up.PHOTOS_HELD_OUT)
    assert Path(__file__).resolve().parents[3] / "shared" / "data" / "photos" == up.DEFAULT_PHOTOS_DIR


def test_load_content_sources() -> None:
    if (up.DEFAULT_PHOTOS_DIR / "040.png").is_file():
        photo = up.load_srgb("photo:040")
        assert photo.ndim == 3 and photo.shape[2] == 3 and photo.dtype == np.float32 and photo.max() <= 1.0
    pytest.importorskip("skimage")
    img = up.load_srgb("skimage:astronaut")
    assert img.shape == (512, 512, 3)
    with pytest.raises(ValueError):
        up.load_srgb("skimage:no_such_image")
    with pytest.raises(ValueError):
        up.load_srgb("photo:999")


def test_random_crop_any_parity() -> None:
    x = torch.zeros(1, 3, 20, 21)
    rng = np.random.default_rng(0)
    assert up.random_crop(x, 7, 9, rng).shape == (1, 3, 7, 9)
    with pytest.raises(ValueError):
        up.random_crop(x, 30, 9, rng)


def test_random_shot_colour_is_realistic() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        sc = up.random_shot_colour(rng, space="srgb")
        assert 2700 < sc.transform.cct < 7700
        assert all(0.5 < g < 4.0 for g in sc.transform.gains)
        np.testing.assert_allclose(sc.transform.out_from_wb_cam @ np.ones(3), 1 / sc.neutral[1], atol=1e-9)
