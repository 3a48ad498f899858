"""Linear DNGs (LinearRaw, 3 samples): decode through LibRaw, RawMeta/RenderParams layouts (old dicts load as
Bayer), the render without demosaicing (exact strips), the fast preview."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lab.synth.synth import synthesize_linear_shot
from services.errors import FramesMismatch, UnsupportedSensor
from services.pipeline.prepare import check_frames_match
from services.pipeline.preview import linear_preview
from services.pipeline.render import RenderParams, halo_rows, render_mosaic, render_strip
from services.pipeline.shot import estimate_noise, shot_render_params
from services.raw.colour import render_colour
from services.raw.decode import decode_raw
from services.raw.meta import RawMeta


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> tuple[RawMeta, np.ndarray, Path]:
    root = tmp_path_factory.mktemp("linear")
    shot = synthesize_linear_shot(root, width=96, height=70, seed=3, noise="mid")
    meta = decode_raw(shot.files[0], root / "raw.npy")
    return meta, np.load(root / "raw.npy"), shot.files[0]


def test_libraw_decodes_a_linear_dng_to_its_samples(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    import tifffile

    meta, image, path = linear
    assert meta.layout == "linear" and meta.is_linear and meta.cfa == ""
    assert image.shape == (70, 96, 3) and image.dtype == np.uint16
    np.testing.assert_array_equal(image, tifffile.imread(path))  # LibRaw's samples are the file's
    assert meta.black_levels == (1024.0,) * 4 and meta.white_level == 65535.0
    assert meta.make == "Acme" and meta.noise_profile is not None and meta.as_shot_neutral is not None
    assert RawMeta.from_dict(meta.to_dict()) == meta


def test_old_dicts_load_as_bayer(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    meta = replace(linear[0], layout="bayer", cfa="RGGB")
    old = {k: v for k, v in meta.to_dict().items() if k != "layout"}
    assert RawMeta.from_dict(old).layout == "bayer"
    params = shot_render_params(meta, np.zeros((8, 8), np.uint16) + 2000)
    old_params = {k: v for k, v in params.to_dict().items() if k != "layout"}
    assert RenderParams.from_dict(old_params) == params and params.layout == "bayer"
    with pytest.raises(ValueError, match="no CFA"):
        replace(linear[0], cfa="RGGB")
    with pytest.raises(ValueError, match="cfa must be"):
        replace(meta, cfa="")


def test_linear_params_and_noise(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    meta, image, _ = linear
    params = shot_render_params(meta, image)
    assert params.layout == "linear" and params.cfa == "" and params.sharpen_amount == 0.0
    assert RenderParams.from_dict(params.to_dict()) == params
    assert halo_rows(params) == 4  # Lee radius 2 + no sharpen (radius 2 either way), even
    estimated = estimate_noise(replace(meta, noise_profile=None), image)
    assert estimated[0] == 0.0 and estimated[1] > 0


def test_linear_strips_stitch_to_the_whole_frame(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    meta, image, _ = linear
    params = replace(shot_render_params(meta, image), sharpen_amount=0.5)  # a sharpen too: its halo holds
    whole = render_mosaic(image, params)
    assert whole.shape == (70, 96, 3) and whole.dtype == np.uint16
    cuts = [0, 2, 18, 40, 70]
    stitched = np.concatenate([render_strip(image, a, b, params) for a, b in zip(cuts, cuts[1:], strict=False)])
    np.testing.assert_array_equal(stitched, whole)


def test_linear_frames_render_alone() -> None:
    from services.raw.colour import CameraProfile

    lin = RawMeta(width=8, height=8, cfa="", black_levels=(0, 0, 0, 0), white_level=100.0,
                  profile=CameraProfile(np.eye(3)), as_shot_neutral=None, make="", model="", noise_profile=None,
                  layout="linear")
    with pytest.raises(UnsupportedSensor, match="stack of linear DNGs"):
        check_frames_match([lin, lin])
    check_frames_match([lin])
    with pytest.raises(FramesMismatch):
        check_frames_match([replace(lin, layout="bayer", cfa="RGGB"), replace(lin, width=10, layout="bayer",
                                                                             cfa="RGGB")])


def test_linear_fast_preview(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    meta, image, _ = linear
    colour = render_colour(meta, "srgb")
    rgb = linear_preview(image, black=meta.black_levels, white=meta.white_level, gains=colour.gains,
                         srgb_from_wb_cam=colour.out_from_wb_cam)
    assert rgb.shape == (35, 48, 3) and rgb.dtype == np.uint8 and rgb.std() > 0


def test_the_source_camera_is_completed_from_the_decode(linear: tuple[RawMeta, np.ndarray, Path]) -> None:
    from services.jobs.plan import with_decoded_source

    meta = linear[0]
    probed = {"naming": "x", "source_camera": {"make": "Canon", "model": "", "layout": ""}}  # a CR3 at upload
    assert with_decoded_source(probed, meta) == {
        "naming": "x", "source_camera": {"make": "Canon", "model": "Linear Converter", "layout": "linear"}}
    assert with_decoded_source({"naming": "x"}, meta) == {"naming": "x"}  # jobs from before the field
