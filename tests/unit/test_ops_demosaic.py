"""Demosaic: constant and ramp images, Malvar vs bilinear, shapes, bad input, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.pipeline.ops import CFA_PATTERNS, cfa_masks, demosaic_bilinear, demosaic_malvar, white_balance
from tests.unit.test_ops_synthetic import mosaic_of, psnr, textured_rgb


@pytest.mark.parametrize("cfa", CFA_PATTERNS)
def test_constant_colour_is_exact(cfa: str) -> None:
    colour = torch.tensor([0.25, 0.5, 0.125], dtype=torch.float64).view(3, 1, 1)  # dyadic: exact sums
    rgb = colour.expand(3, 10, 12)
    out = demosaic_malvar(mosaic_of(rgb, cfa)[None, None], cfa)
    assert out.shape == (1, 3, 10, 12)
    assert torch.equal(out[0], rgb)


@pytest.mark.parametrize("cfa", CFA_PATTERNS)
def test_smooth_ramp_reconstructs(cfa: str) -> None:
    f64 = torch.float64
    yy, xx = torch.meshgrid(torch.arange(24.0, dtype=f64), torch.arange(32.0, dtype=f64), indexing="ij")
    rgb = torch.stack([0.1 + 0.01 * xx, 0.2 + 0.005 * yy + 0.004 * xx, 0.6 - 0.008 * yy])
    out = demosaic_malvar(mosaic_of(rgb, cfa)[None, None], cfa)[0]
    inner = (slice(None), slice(2, -2), slice(2, -2))  # reflection bends a ramp at the border
    torch.testing.assert_close(out[inner], rgb[inner], atol=1e-12, rtol=0)


@pytest.mark.parametrize("cfa", ["RGGB", "GBRG"])
def test_malvar_beats_bilinear(cfa: str) -> None:
    rgb = torch.from_numpy(textured_rgb(64, 64, seed=1, cutoff=0.12))
    m = mosaic_of(rgb, cfa)[None, None]
    crop = (slice(None), slice(4, -4), slice(4, -4))
    p_malvar = psnr(demosaic_malvar(m, cfa)[0][crop].numpy(), rgb[crop].numpy(), 1.0)
    p_bilinear = psnr(demosaic_bilinear(m, cfa)[0][crop].numpy(), rgb[crop].numpy(), 1.0)
    assert p_malvar > p_bilinear + 2.0


def test_known_sites_pass_through() -> None:
    rgb = torch.from_numpy(textured_rgb(16, 16, seed=2))
    out = demosaic_malvar(mosaic_of(rgb, "BGGR")[None, None], "BGGR")[0]
    masks = cfa_masks("BGGR", 16, 16, dtype=torch.float64).bool()
    assert torch.equal(out[masks], rgb[masks])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved(dtype: torch.dtype) -> None:
    m = torch.rand(2, 1, 8, 10, dtype=dtype)
    assert demosaic_malvar(m, "RGGB").dtype == dtype
    assert demosaic_bilinear(m, "RGGB").dtype == dtype
    assert demosaic_malvar(m, "RGGB").shape == (2, 3, 8, 10)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\), got \(8, 8\)"):
        demosaic_malvar(torch.rand(8, 8), "RGGB")
    with pytest.raises(ValueError, match="cfa"):
        demosaic_malvar(torch.rand(1, 1, 8, 8), "RGBX")
    with pytest.raises(TypeError, match="floating"):
        demosaic_malvar(torch.ones(1, 1, 8, 8, dtype=torch.int32), "RGGB")
    with pytest.raises(ValueError, match="larger than 2"):
        demosaic_malvar(torch.rand(1, 1, 2, 8), "RGGB")


def test_white_balance_scales_each_site() -> None:
    m = torch.ones(1, 1, 4, 4)
    out = white_balance(m, (2.0, 1.0, 1.5), "GRBG")
    np.testing.assert_array_equal(out[0, 0, :2, :2].numpy(), [[1.0, 2.0], [1.5, 1.0]])
