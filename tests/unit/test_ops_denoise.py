"""Lee denoise: noise reduction on flat patches, noise-free edges kept, shapes."""

from __future__ import annotations

import pytest
import torch

from services.pipeline.ops import denoise_lee


def test_reduces_noise_on_flat_patch() -> None:
    g = torch.Generator().manual_seed(0)
    level, shot, read = 0.3, 0.002, 1e-4
    sigma = (shot * level + read) ** 0.5
    x = level + sigma * torch.randn(1, 3, 128, 128, generator=g)
    out = denoise_lee(x, shot, read, radius=2)
    ratio = (out.std() / x.std()).item()
    # Ideal Lee on white noise leaves a bit more than the 5x5 mean's 1/5 of the std.
    assert 0.15 < ratio < 0.5
    assert abs(out.mean().item() - level) < 1e-3


def test_keeps_noise_free_edge() -> None:
    x = torch.full((1, 3, 32, 32), 0.2, dtype=torch.float64)
    x[..., 16:] = 0.7
    out = denoise_lee(x, 1e-4, 1e-6)
    assert (out - x).abs().max().item() < 2e-3


def test_per_channel_noise_and_strength_zero() -> None:
    x = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    out = denoise_lee(x, torch.tensor([1e-3, 2e-3, 3e-3]), (1e-5, 1e-5, 1e-5), strength=0.0)
    torch.testing.assert_close(out, x)
    assert out.dtype == torch.float64 and out.shape == x.shape


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\), got \(1, 1, 8, 8\)"):
        denoise_lee(torch.rand(1, 1, 8, 8), 0.1, 0.1)
    with pytest.raises(ValueError, match="shot"):
        denoise_lee(torch.rand(1, 3, 8, 8), (0.1, 0.2), 0.1)
