"""Unsharp mask: no overshoot, more high frequency on a blurred edge, shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.pipeline.ops import sharpen, sharpen_radius
from services.pipeline.ops.filters import local_min_max


def _blurred_edge() -> torch.Tensor:
    x = torch.zeros(1, 3, 24, 24, dtype=torch.float64)
    x[..., 12:] = 1.0
    k = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64).view(1, 1, 1, 3).expand(3, 1, 1, 3)
    return F.conv2d(F.pad(x, (1, 1, 0, 0), mode="replicate"), k, groups=3)


def test_no_overshoot_beyond_local_range() -> None:
    x = torch.rand(1, 3, 20, 20, dtype=torch.float64)
    out = sharpen(x, amount=2.0)
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    hi = F.max_pool2d(padded, 3, stride=1)
    lo = -F.max_pool2d(-padded, 3, stride=1)
    assert bool((out <= hi).all()) and bool((out >= lo).all())


def test_steepens_blurred_edge() -> None:
    x = _blurred_edge()
    out = sharpen(x, amount=1.0)
    grad_in = (x[..., 1:] - x[..., :-1]).abs().max()
    grad_out = (out[..., 1:] - out[..., :-1]).abs().max()
    assert grad_out > grad_in * 1.1
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_amount_zero_is_identity_and_dtype() -> None:
    x = torch.rand(2, 3, 9, 9)
    assert torch.equal(sharpen(x, amount=0.0), x)
    assert sharpen(x).dtype == torch.float32 and sharpen(x).shape == x.shape
    assert sharpen_radius(1.0) == 2


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"got \(3, 9, 9\)"):
        sharpen(torch.rand(3, 9, 9))
    with pytest.raises(ValueError, match="sigma"):
        sharpen(torch.rand(1, 3, 9, 9), sigma=0.0)


@pytest.mark.parametrize("radius", [0, 1, 2])
def test_local_min_max_on_the_cpu_equals_the_max_pool(radius: int) -> None:
    """The CPU's rows-then-columns window gives the max-pool's values exactly (odd sizes, reflect padding)."""
    x = torch.randn(2, 3, 11, 17, generator=torch.Generator().manual_seed(radius))
    padded = F.pad(x, (radius,) * 4, mode="reflect") if radius else x
    size = 2 * radius + 1
    lo, hi = local_min_max(x, radius)
    assert torch.equal(hi, F.max_pool2d(padded, size, stride=1))
    assert torch.equal(lo, -F.max_pool2d(-padded, size, stride=1))
