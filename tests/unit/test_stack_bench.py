"""Stack benchmark: CIEDE2000 against colour-science, PSNR, and a tiny end-to-end case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lab.quality.stack_bench import StackCase, delta_e_2000, format_table, psnr, run_case, srgb16_to_lab


def test_delta_e_2000_matches_colour_science() -> None:
    colour = pytest.importorskip("colour")
    rng = np.random.default_rng(0)
    lab1 = np.stack([rng.uniform(0, 100, 500), rng.uniform(-100, 100, 500), rng.uniform(-100, 100, 500)], -1)
    lab2 = lab1 + rng.normal(0, 5, lab1.shape)
    lab2[:50] = lab1[:50]  # zero differences
    lab2[50:60, 1:] = 0.0  # neutral colours (hue undefined)
    np.testing.assert_allclose(delta_e_2000(lab1, lab2), colour.delta_E(lab1, lab2, method="CIE 2000"), atol=1e-9)


def test_delta_e_2000_sharma_reference_pairs() -> None:
    # Pairs 1, 7 and 17 of Sharma, Wu & Dalal (2005), Table 1.
    lab1 = np.array([[50.0, 2.6772, -79.7751], [50.0, 0.0, 0.0], [50.0, 2.5, 0.0]])
    lab2 = np.array([[50.0, 0.0, -82.7485], [50.0, -1.0, 2.0], [73.0, 25.0, -18.0]])
    np.testing.assert_allclose(delta_e_2000(lab1, lab2), [2.0425, 2.3669, 27.1492], atol=1e-4)


def test_srgb16_to_lab_and_psnr() -> None:
    white = np.full((1, 3), 65535, np.uint16)
    np.testing.assert_allclose(srgb16_to_lab(white), [[100.0, 0.0, 0.0]], atol=1e-2)
    a = np.zeros((4, 4, 3), np.uint16)
    b = a.copy()
    b[0, 0, 0] = 655
    assert psnr(a, a) == float("inf") and 50 < psnr(a, b) < 60


def test_tiny_case_runs_end_to_end(tmp_path: Path) -> None:
    result = run_case(StackCase("tiny", 2), tmp_path, scale=0.02, seed=1, noise=0.002, device="cpu")
    assert result.gain_db > 0 and result.groups_max_lsb == 0 and result.groups_delta_e_mean == 0.0
    assert result.long_exposure_gain_db is not None and result.long_exposure_gain_db > 0
    assert "tiny" in format_table([result]) and result.seconds["merge_1g"] > 0


def test_the_walking_object_case_is_asked_for_by_name(tmp_path: Path) -> None:
    from lab.quality.stack_bench import DEFAULT_CASES, EXTRA_CASES

    (walker,) = EXTRA_CASES
    assert walker not in DEFAULT_CASES and walker.walking and walker.moving_object
    result = run_case(walker, tmp_path, scale=0.02, seed=1, noise=0.002, device="cpu")
    assert result.psnr_motion_stack is not None and result.long_exposure_gain_db is None
    assert result.groups_max_lsb == 0


def test_beside_libraw_with_a_crop_strip(tmp_path: Path) -> None:
    """--libraw / --crops: LibRaw AHD scored on the reference frame's DNG (well below the stack on a noisy tiny
    scene), one PNG strip per case (truth, LibRaw, single, stack, long exposure)."""
    from PIL import Image

    from lab.quality.anchors import LibRawRunner

    with LibRawRunner() as runner:
        result = run_case(StackCase("tiny", 2), tmp_path / "work", scale=0.02, seed=1, noise=0.002, device="cpu",
                          libraw=runner, crops_dir=tmp_path / "crops")
    assert result.psnr_libraw_single is not None and result.psnr_libraw_single < result.psnr_stack
    assert result.crop is not None
    with Image.open(result.crop) as strip:
        assert strip.width > 4 * strip.height - 16  # five tiles side by side under a label row
    assert "LibRaw" in format_table([result])
