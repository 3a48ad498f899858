"""Colour: sRGB curve reference values, uint16 rounding, rgb_cam inverting the unprocess contract, levels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.pipeline.ops import apply_matrix, normalize_levels, srgb_decode, srgb_encode, to_uint16
from services.raw.colour import SRGB_TO_XYZ_D65, camera_to_srgb_matrix
from tests.unit.test_ops_synthetic import COLOR_MATRIX


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_srgb_reference_values(dtype: torch.dtype) -> None:
    x = torch.tensor([0.0, 0.0031308, 0.5, 1.0, -0.2, 1.5], dtype=dtype)
    expected = torch.tensor([0.0, 0.04045, 0.735357, 1.0, 0.0, 1.0], dtype=dtype)
    out = srgb_encode(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=0)
    torch.testing.assert_close(srgb_decode(srgb_encode(x[:4])), x[:4], atol=1e-6, rtol=0)


def test_to_uint16_rounds_half_up() -> None:
    x = torch.tensor([0.0, 0.5 / 65535, 1.0, 1.2, -1.0, 0.25], dtype=torch.float64)
    out = to_uint16(x)
    assert out.dtype == torch.uint16
    assert out.to(torch.int32).tolist() == [0, 1, 65535, 65535, 0, 16384]


def test_rgb_cam_inverts_unprocess_contract() -> None:
    cam_rgb = COLOR_MATRIX @ SRGB_TO_XYZ_D65
    cam_rgb_n = cam_rgb / cam_rgb.sum(axis=1, keepdims=True)
    neutral = cam_rgb.sum(axis=1) / cam_rgb.sum(axis=1)[1]
    linear = torch.rand(1, 3, 4, 5, dtype=torch.float64)
    camera = torch.einsum("ij,bjhw->bihw", torch.from_numpy(neutral[:, None] * cam_rgb_n), linear)
    balanced = camera / torch.from_numpy(neutral).view(1, 3, 1, 1)  # gains = 1 / neutral
    rgb_cam = camera_to_srgb_matrix(torch.from_numpy(COLOR_MATRIX))
    assert rgb_cam.dtype == np.float64
    np.testing.assert_allclose(rgb_cam.sum(axis=1), 1.0, atol=1e-12)  # white stays white
    torch.testing.assert_close(apply_matrix(balanced, rgb_cam), linear, atol=1e-12, rtol=0)


def test_apply_matrix_float32_and_shape_errors() -> None:
    x = torch.rand(2, 3, 4, 4)
    out = apply_matrix(x, np.eye(3))
    assert out.dtype == torch.float32 and torch.equal(out, x)
    with pytest.raises(ValueError, match=r"got \(2, 4, 4, 4\)"):
        apply_matrix(torch.rand(2, 4, 4, 4), np.eye(3))
    with pytest.raises(ValueError, match=r"\(3, 3\)"):
        camera_to_srgb_matrix(np.eye(2))
    with pytest.raises(TypeError):
        srgb_encode(torch.ones(3, dtype=torch.int32))


def test_normalize_levels_per_site() -> None:
    raw = torch.tensor([[100, 300, 1000], [250, 5000, 9999]], dtype=torch.int32)
    out = normalize_levels(raw, (100, 200, 300, 400), 1100)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), [[0.0, 100 / 900, 0.9], [0.0, 1.0, 1.0]], atol=1e-7)
    with pytest.raises(ValueError, match=r"got \(2, 3, 1\)"):
        normalize_levels(raw[..., None], (0, 0, 0, 0), 10)
    below = normalize_levels(raw, (100, 200, 300, 400), 1100, clip_black=False)  # a stack's Bayer sums
    np.testing.assert_allclose(below.numpy(), [[0.0, 100 / 900, 0.9], [-50 / 800, 1.0, 1.0]], atol=1e-7)


def test_clip_highlights_whitens_blown_pixels_and_leaves_the_rest() -> None:
    """A pixel at the raw white level in every channel sits at the gains after white balance (a magenta cast
    through the matrix): it becomes the smallest gain in every channel. Pixels short of the knee are untouched,
    bright colours below the white level too; the raw-domain form the previews use agrees."""
    from services.pipeline.ops import clip_highlights
    from services.raw.colour import HIGHLIGHT_KNEE, clip_highlights_raw

    gains = (1.9, 1.0, 1.4)
    raw = torch.tensor([[1.0, 1.0, 1.0],  # blown
                        [0.5, 0.8, 0.6],  # below the knee: untouched
                        [0.6, 1.0, 0.5],  # green blown alone: red 1.14 and blue 0.7 after the gains
                        [0.95, 0.5, 0.3],  # a bright red short of the white level, past the knee
                        [0.7, 0.3, 0.2]]).T.reshape(1, 3, 5, 1)
    wb = raw * torch.tensor(gains).view(1, 3, 1, 1)
    out = clip_highlights(wb, gains)
    assert torch.allclose(out[0, :, 0, 0], torch.ones(3))
    assert torch.equal(out[..., 1:2, :], wb[..., 1:2, :]) and torch.equal(out[..., 4:5, :], wb[..., 4:5, :])
    assert torch.allclose(out[0, :, 2, 0], torch.tensor([1.0, 1.0, 0.7]))  # red pulled to the green's white
    weight = (0.95 - HIGHLIGHT_KNEE) / (1 - HIGHLIGHT_KNEE)
    assert torch.allclose(out[0, 0, 3, 0], torch.tensor(1.805 - weight * 0.805)) and out[0, 1, 3, 0] == wb[0, 1, 3, 0]
    in_raw = clip_highlights_raw(raw[0].numpy().copy(), gains, axis=0) * np.asarray(gains)[:, None, None]
    np.testing.assert_allclose(in_raw, out[0].numpy(), rtol=1e-6, atol=1e-6)
    last = clip_highlights_raw(raw[0].numpy().transpose(1, 2, 0).copy(), gains, axis=-1) * np.asarray(gains)
    np.testing.assert_allclose(last.transpose(2, 0, 1), out[0].numpy(), rtol=1e-6, atol=1e-6)
    low = (0.8, 1.0, 1.5)  # a gain below 1: the brightest neutral every channel records is 0.8
    assert torch.allclose(clip_highlights(torch.tensor(low).view(1, 3, 1, 1), low), torch.full((1, 3, 1, 1), 0.8))
