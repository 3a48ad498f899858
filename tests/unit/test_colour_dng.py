"""DNG colour pipeline: 3x3 colorimetry against colour-science, the synthetic contract, LibRaw's rendering."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import rawpy
import torch

from lab.synth import synth
from lab.synth import unprocess as up
from services.pipeline.ops.colour import decode_transfer, encode_transfer
from services.raw.colour import (
    OUTPUT_SPACES,
    WHITE_A,
    WHITE_D50,
    WHITE_D65,
    CameraProfile,
    bradford_matrix,
    camera_to_srgb_matrix,
    cct_from_xy,
    dng_colour_transform,
    render_colour,
    rgb_to_xyz_matrix,
    xy_to_xyz,
    xyz_d50_to_output_matrix,
)
from services.raw.decode_child import extract
from services.raw.dng import write_dng
from services.raw.meta import RawMeta

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import colour  # colour-science: the independent reference (tests only)

_COLOUR_NAMES = {"srgb": "sRGB", "adobergb": "Adobe RGB (1998)", "prophoto": "ProPhoto RGB", "linear": "sRGB"}


@pytest.mark.parametrize("space", sorted(OUTPUT_SPACES))
def test_rgb_to_xyz_matrices_match_colour_science(space: str) -> None:
    cs = colour.RGB_COLOURSPACES[_COLOUR_NAMES[space]]
    np.testing.assert_allclose(rgb_to_xyz_matrix(space), colour.normalised_primary_matrix(cs.primaries, cs.whitepoint),
                               atol=1e-12)


def test_bradford_matches_colour_science() -> None:
    for src, dst in ((WHITE_D50, WHITE_D65), (WHITE_A, WHITE_D50), (WHITE_D65, WHITE_A)):
        ref = colour.adaptation.matrix_chromatic_adaptation_VonKries(
            xy_to_xyz(src), xy_to_xyz(dst), transform="Bradford"
        )
        np.testing.assert_allclose(bradford_matrix(src, dst), ref, atol=1e-12)


@pytest.mark.parametrize("xy", [WHITE_D65, WHITE_D50, WHITE_A, (0.40, 0.39), (0.30, 0.31)])
def test_cct_matches_robertson(xy: tuple[float, float]) -> None:
    ref = colour.temperature.uv_to_CCT_Robertson1968(colour.xy_to_UCS_uv(np.array(xy)))[0]
    assert cct_from_xy(xy) == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("space", ["srgb", "adobergb", "prophoto"])
def test_transfer_functions_match_colour_science(space: str) -> None:
    x = np.linspace(0.0, 1.0, 2001)
    ours = encode_transfer(torch.from_numpy(x), OUTPUT_SPACES[space].transfer).numpy()
    cs = colour.RGB_COLOURSPACES[_COLOUR_NAMES[space]]
    np.testing.assert_allclose(ours, cs.cctf_encoding(x), atol=1e-9)
    back = decode_transfer(torch.from_numpy(ours), OUTPUT_SPACES[space].transfer).numpy()
    np.testing.assert_allclose(back, x, atol=1e-9)
    assert encode_transfer(torch.tensor([0.3]), "linear").item() == pytest.approx(0.3)
    with pytest.raises(ValueError, match="transfer"):
        encode_transfer(torch.zeros(1), "gamma22")


def test_output_matrices_map_d50_white_to_white() -> None:
    for space in OUTPUT_SPACES:
        np.testing.assert_allclose(xyz_d50_to_output_matrix(space) @ xy_to_xyz(WHITE_D50), 1.0, atol=1e-12)


def test_single_d65_matrix_matches_legacy_dcraw_style() -> None:
    profile = CameraProfile(synth.COLOR_MATRIX)
    t = dng_colour_transform(profile, white_xy=WHITE_D65)
    np.testing.assert_allclose(t.out_from_wb_cam, camera_to_srgb_matrix(synth.COLOR_MATRIX), atol=1e-3)
    np.testing.assert_allclose(t.out_from_wb_cam @ np.ones(3), 1.0, atol=1e-12)  # white stays white


def test_interpolation_weights_and_neutral_round_trip() -> None:
    p = up.synthetic_profile()
    assert p.weight_1(WHITE_D65) == 1.0  # ColorMatrix1 is the D65 one (6500 K); D65 xy is 6504 K
    assert p.weight_1(up.planckian_white(2700.0)) == 0.0  # below StdA (2850 K, the DNG SDK's value)
    assert 0.0 < p.weight_1(WHITE_A) < 0.01  # A's xy is 2856 K
    mid = up.planckian_white(1.0 / (0.5 / 2850.0 + 0.5 / 6500.0))  # halfway in inverse CCT
    assert p.weight_1(mid) == pytest.approx(0.5, abs=0.01)
    for cct in (2900.0, 4000.0, 5500.0, 7000.0):
        xy = up.planckian_white(cct)
        back = p.neutral_to_xy(p.xy_to_neutral(xy))
        assert back == pytest.approx(xy, abs=1e-6)


def test_interpolated_matrix_is_inverse_cct_blend() -> None:
    p = up.synthetic_profile(forward_matrices=False)
    xy = up.planckian_white(4000.0)
    cct = cct_from_xy(xy)
    g = (1 / cct - 1 / 2850.0) / (1 / 6500.0 - 1 / 2850.0)
    norm = [m / np.max(m @ xy_to_xyz(WHITE_D50)) for m in (p.color_matrix_1, p.color_matrix_2)]
    np.testing.assert_allclose(p.xyz_to_camera(xy), g * norm[0] + (1 - g) * norm[1], atol=1e-12)


def _patch_image(rng: np.random.Generator, patches: int = 12, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    colours = np.concatenate([rng.uniform(0.02, 0.95, (patches - 2, 3)), [[0.18] * 3, [0.9] * 3]])  # linear sRGB
    image = np.repeat(np.repeat(colours[None, :, None, :], size, axis=0), size, axis=2)
    return colours, image.reshape(size, patches * size, 3).astype(np.float32)


def _write_patch_dng(path: Path, image: np.ndarray, white: tuple[float, float], forward: bool, cfa: str) -> None:
    profile = up.synthetic_profile(forward)
    sc = up.shot_colour(profile, white)
    level = up.noise_level("none")
    raw = synth._raw_frame(image, cfa, sc, level, torch.Generator().manual_seed(0))
    write_dng(path, raw, cfa=cfa, black_level=synth.BLACK_LEVEL, white_level=synth.WHITE_LEVEL, profile=profile,
              as_shot_neutral=sc.neutral.tolist(), make="Phase One", model="IQ3_S", baseline_exposure=0.0)


@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("white", [WHITE_D65, WHITE_A, (0.3805, 0.3768)])
@pytest.mark.parametrize("space", sorted(OUTPUT_SPACES))
def test_flat_patches_render_back_exactly(tmp_path: Path, forward: bool, white: tuple[float, float],
                                          space: str) -> None:
    """DNG written by the synthesiser -> decode -> DNG colour math: the photograph's colours within 1e-4."""
    colours, image = _patch_image(np.random.default_rng(1))
    path = tmp_path / "p.dng"
    _write_patch_dng(path, image, white, forward, "GBRG")
    mosaic_path = tmp_path / "m.npy"
    meta = RawMeta.from_dict(extract(path, mosaic_path))
    rc = render_colour(meta, space)
    assert rc.transfer == OUTPUT_SPACES[space].transfer
    x = (np.load(mosaic_path).astype(np.float64) - synth.BLACK_LEVEL) / (synth.WHITE_LEVEL - synth.BLACK_LEVEL)
    site = {(0, 0): 1, (0, 1): 2, (1, 0): 0, (1, 1): 1}  # GBRG
    expected = colours @ (xyz_d50_to_output_matrix(space) @ np.linalg.inv(xyz_d50_to_output_matrix("srgb"))).T
    for k, truth in enumerate(expected):
        wb = np.zeros(3)
        block = x[:, k * 32 : (k + 1) * 32]
        for (dy, dx), c in site.items():
            wb[c] = block[dy::2, dx::2].mean() * rc.gains[c]
        np.testing.assert_allclose(rc.out_from_wb_cam @ wb, truth, atol=1e-4)


def test_dng_pipeline_matches_libraw_rendering(tmp_path: Path) -> None:
    """LibRaw (camera WB, no auto-bright, sRGB, linear gamma) gives the same patch colours as our DNG math."""
    colours, image = _patch_image(np.random.default_rng(2), patches=10, size=24)
    path = tmp_path / "p.dng"
    _write_patch_dng(path, image, WHITE_D65, True, "RGGB")
    meta = RawMeta.from_dict(extract(path, tmp_path / "m.npy"))
    rc = render_colour(meta, "linear")
    with rawpy.imread(str(path)) as raw:
        out = raw.postprocess(use_camera_wb=True, no_auto_bright=True, output_color=rawpy.ColorSpace.sRGB,
                              gamma=(1, 1), output_bps=16, demosaic_algorithm=rawpy.DemosaicAlgorithm.LINEAR,
                              user_flip=0, adjust_maximum_thr=0.0)  # keep the white level from the file
    libraw = out.astype(np.float64) / 65535.0
    for k, truth in enumerate(colours):
        patch = libraw[4:-4, k * 24 + 4 : (k + 1) * 24 - 4].reshape(-1, 3).mean(axis=0)
        np.testing.assert_allclose(patch, truth, atol=2e-3)
    assert rc.cct == pytest.approx(6504, abs=2)


@pytest.mark.parametrize("cfa", ["RGGB", "BGGR", "GRBG", "GBRG"])
def test_grey_world_reads_every_cfa_site(cfa: str) -> None:
    """A file without an as-shot white gets the scene's mean colour as its neutral: a flat grey scene seen through
    a camera whose channels answer 0.5 / 1 / 0.8 gives that neutral in every CFA phase, odd sizes included (the
    sample once kept one CFA site only: a neutral of 1, 1, 1 and the camera's own green cast)."""
    from services.raw.colour import CameraProfile, grey_world_neutral

    rng = np.random.default_rng(0)
    height, width = 203, 150
    response = {"R": 0.5, "G": 1.0, "B": 0.8}
    black, white = 256.0, 16383.0
    mosaic = np.empty((height, width), np.float64)
    for (dy, dx), letter in zip([(0, 0), (0, 1), (1, 0), (1, 1)], cfa, strict=True):
        mosaic[dy::2, dx::2] = black + 0.3 * response[letter] * (white - black)
    mosaic = (mosaic + rng.normal(0, 20, mosaic.shape)).round().astype(np.uint16)
    meta = RawMeta(width=width, height=height, cfa=cfa, black_levels=(black,) * 4, white_level=white,
                   profile=CameraProfile(np.eye(3)), as_shot_neutral=None, make="", model="", noise_profile=None)
    neutral = grey_world_neutral(meta, mosaic)
    assert neutral[1] == 1.0 and abs(neutral[0] - 0.5) < 0.01 and abs(neutral[2] - 0.8) < 0.01, neutral
    tiny = mosaic[:6, :7]  # smaller than one sampling block: the whole mosaic
    assert abs(grey_world_neutral(meta, tiny)[0] - 0.5) < 0.05
