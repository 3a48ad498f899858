"""Recipe ``patterns``: the per-crop hard-content generator (training/patterns.py) and the artefact benchmark's
scenes and measures (lab/synth/scenes.py, lab/quality/artefacts.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lab.quality.artefacts import ARTEFACT_CONTENT, MEASURES, every_phase, measure
from lab.synth.scenes import SCENES, scene
from training import data
from training.patterns import hard_pattern


def test_hard_patterns_are_in_range_deterministic_by_seed_and_new_per_crop() -> None:
    rng = np.random.default_rng(7)
    images = [hard_pattern(rng, 40) for _ in range(40)]
    for im in images:
        assert im.shape == (3, 40, 40) and im.dtype == torch.float32
        assert float(im.min()) >= 0.0 and float(im.max()) <= 1.0 and torch.isfinite(im).all()
    again = np.random.default_rng(7)
    assert all(torch.equal(im, hard_pattern(again, 40)) for im in images)  # the generator's state decides
    assert len({im.numpy().tobytes() for im in images}) == len(images)  # never the same scene twice
    assert sum(float(im.std()) > 0.05 for im in images) >= 30  # most scenes hold visible structure
    fine = [im for im in images if float((im[:, :, 1:] - im[:, :, :-1]).abs().mean()) > 0.05]
    assert len(fine) >= 10  # detail near the sampling limit is common


def test_hard_patterns_include_neutral_scenes_and_flat_black() -> None:
    rng = np.random.default_rng(3)
    images = [hard_pattern(rng, 48) for _ in range(80)]
    neutral = [im for im in images if float((im.max(0).values - im.min(0).values).max()) < 1e-6]
    black = [im for im in images if float((im.amax(0) < 0.035).float().mean()) > 0.2]
    assert len(neutral) >= 5 and len(black) >= 5


def _nyquist_share(image: torch.Tensor) -> float:
    """The share of a scene's luminance energy (its mean removed) at a period of 2 px across rows or columns: the
    frequencies at which a Bayer mosaic cannot tell luminance from colour."""
    y = image.mean(0).numpy().astype(np.float64)
    power = np.abs(np.fft.fft2(y - y.mean())) ** 2
    h = y.shape[0] // 2
    return float((power[h, :].sum() + power[:, h].sum() - power[h, h]) / max(power.sum(), 1e-12))


def test_the_shortest_period_leaves_out_the_patterns_that_alias_with_colour() -> None:
    """--hard-min-period 3: no scene is a 2-px grating or checkerboard (whose mosaic is a flat saturated colour's,
    what taught the 2-px default to draw a grid into red fabric); the default still draws them."""
    def shares(shortest: float) -> list[float]:
        rng = np.random.default_rng(1)
        return [_nyquist_share(hard_pattern(rng, 48, shortest=shortest)) for _ in range(150)]

    assert max(shares(2.0)) > 0.99  # pure 2-px patterns among the default's scenes
    assert max(shares(3.0)) < 0.9
    recipe = data.with_hard_min_period(data.with_hard_share(data.RECIPES["patterns"], 0.05), 3)
    assert recipe.hard_min_period == 3 and recipe.weights["hard"] == pytest.approx(0.05)
    assert data.RECIPES["patterns"].hard_min_period == 2
    for bad in (1.5, 5.0):
        with pytest.raises(ValueError, match="2-4 px"):
            data.with_hard_min_period(recipe, bad)
        with pytest.raises(ValueError, match="2-4 px"):
            hard_pattern(np.random.default_rng(0), 16, shortest=bad)


def _one_hue(image: torch.Tensor) -> str:
    """``saturated``: every pixel a multiple of one colour (two shades of a hue, blends of them, black), that colour
    not grey; ``grey``: the same in grey; else ``other``."""
    px = image.reshape(3, -1).T.double().numpy()
    s = np.linalg.svd(px, compute_uv=False)
    colour = np.abs(np.linalg.svd(px, full_matrices=False)[2][0])
    if s[1] >= 1e-4 * s[0]:
        return "other"
    return "saturated" if np.ptp(colour) > 0.3 * colour.max() else "grey"


def test_the_hue_share_draws_fine_texture_in_one_saturated_hue() -> None:
    """--hard-hue-share: that share of the hard scenes is texture in two shades of one saturated hue (the texture in
    one or two channels only: green foliage, cyan fabric) or of grey; 0 draws exactly the scenes 2.2.0 was trained
    on."""
    def kinds(hue_share: float) -> list[str]:
        rng = np.random.default_rng(2)
        return [_one_hue(hard_pattern(rng, 48, shortest=3.0, hue_share=hue_share)) for _ in range(120)]

    every, none = kinds(1.0), kinds(0.0)
    assert every.count("saturated") > 0.3 * 120 and every.count("other") < 0.4 * 120
    assert none.count("saturated") < 0.1 * 120
    for seed in range(5):
        a = hard_pattern(np.random.default_rng(seed), 32)
        assert torch.equal(a, hard_pattern(np.random.default_rng(seed), 32, hue_share=0.0))
    recipe = data.with_hard_hue_share(data.RECIPES["patterns"], 0.4)
    assert recipe.hard_hue_share == 0.4 and data.RECIPES["patterns"].hard_hue_share == 0.0
    with pytest.raises(ValueError, match="hue share"):
        data.with_hard_hue_share(recipe, 1.5)


def test_the_patterns_recipe_mixes_hard_crops_into_soft() -> None:
    recipe, soft = data.RECIPES["patterns"], data.RECIPES["soft"]
    assert recipe.weights["hard"] == pytest.approx(0.15) and recipe.weights["photos"] >= 0.5
    assert (recipe.upscale_share, recipe.upscale_max, recipe.gray_share) == (soft.upscale_share, soft.upscale_max,
                                                                             soft.gray_share)
    assert recipe.weights["skimage"] == 0
    less = data.with_hard_share(recipe, 0.10)
    assert less.weights["hard"] == pytest.approx(0.10) and sum(less.weights.values()) == pytest.approx(1.0)
    assert less.weights["photos"] / less.weights["dead_leaves"] == pytest.approx(0.5 / 0.35)
    assert data.with_hard_share(soft, 0.2).weights["hard"] == pytest.approx(0.2)


def test_artefact_scenes_and_measures() -> None:
    assert len(every_phase(ARTEFACT_CONTENT)) == 4 * len(ARTEFACT_CONTENT)
    for name in SCENES:
        img, regions = scene(name, 64, 48)
        assert img.shape == (64, 48, 3) and img.dtype == np.float32 and img.min() >= 0 and img.max() <= 1
        assert regions and all(m.shape == (64, 48) and m[8:-8, 8:-8].any() for m in regions.values())
        truth = (img * 65535).round().astype(np.uint16)
        exact = measure(f"pattern:{name}", truth, truth)
        assert all(abs(exact[k]) < 1e-6 for k in MEASURES if k in exact)
        tinted = np.clip(img + np.array([0.0, 0.0, 0.1], np.float32), 0, 1)
        off = measure(f"pattern:{name}", (tinted * 65535).round().astype(np.uint16), truth)
        assert any(off[k] > 5 for k in MEASURES if k in off)
    assert measure("photo:033", np.zeros((4, 4, 3)), np.zeros((4, 4, 3))) == {}
