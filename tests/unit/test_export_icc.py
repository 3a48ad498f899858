"""Output recipes and their ICC profiles: lcms loads them and transforms colours as our matrices do."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageCms

from services.errors import BadInput
from services.export.icc import ICC_D50, build_icc_profile, d50_primaries
from services.export.recipes import RECIPES, get_recipe
from services.export.tiff import icc_profile
from services.pipeline.ops.colour import encode_transfer, srgb_encode
from services.raw.colour import OUTPUT_SPACES, xyz_d50_to_output_matrix


def test_recipes_name_known_spaces() -> None:
    assert get_recipe(None).colour_space == "srgb"
    assert {get_recipe(n).colour_space for n in ("tiff16-adobergb", "tiff16-prophoto", "tiff16-linear")} == {
        "adobergb", "prophoto", "linear"}
    assert all(r.colour_space in OUTPUT_SPACES for r in RECIPES.values())
    with pytest.raises(BadInput):
        get_recipe("tiff16-cmyk")


@pytest.mark.parametrize("space", ["srgb", "adobergb", "prophoto", "linear"])
def test_built_profile_loads_and_transforms_like_our_matrices(space: str) -> None:
    data = icc_profile(space)
    assert data == build_icc_profile(space) and int.from_bytes(data[:4], "big") == len(data)
    profile = ImageCms.ImageCmsProfile(io.BytesIO(data))
    assert OUTPUT_SPACES[space].description in ImageCms.getProfileDescription(profile)
    to_srgb = ImageCms.buildTransform(profile, ImageCms.createProfile("sRGB"), "RGB", "RGB",
                                      renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC)
    lin_srgb = np.random.default_rng(0).uniform(0.05, 0.95, (16, 1, 3))
    m = xyz_d50_to_output_matrix(space) @ np.linalg.inv(xyz_d50_to_output_matrix("srgb"))
    encoded = encode_transfer(torch.from_numpy(lin_srgb @ m.T), OUTPUT_SPACES[space].transfer).numpy()
    image = Image.fromarray(np.rint(encoded * 255).astype(np.uint8))
    got = np.asarray(ImageCms.applyTransform(image, to_srgb)).astype(np.float64)
    expected = np.rint(srgb_encode(torch.from_numpy(lin_srgb)).numpy() * 255)
    assert np.abs(got - expected).max() <= 2  # 8-bit quantisation of lcms' path


def test_primaries_sum_to_pcs_white_and_srgb_is_built_too() -> None:
    for space in OUTPUT_SPACES:
        np.testing.assert_allclose(d50_primaries(space).sum(axis=1), ICC_D50, atol=1e-12)
    srgb = ImageCms.ImageCmsProfile(io.BytesIO(icc_profile("srgb")))
    assert "sRGB" in ImageCms.getProfileDescription(srgb) and icc_profile("srgb") == build_icc_profile("srgb")
    with pytest.raises(ValueError):
        icc_profile("cmyk")
