"""Multi-frame merge: sub-pixel shift estimation on noisy frames, shifting, accumulation."""

from __future__ import annotations

import pytest
import torch

from services.pipeline.ops import accumulate_frames, estimate_shift, shift_mosaic
from tests.unit.test_ops_synthetic import mosaic_of, textured_rgb

H, W = 192, 256


def _noisy(mosaic: torch.Tensor, seed: int, shot: float = 0.002, read: float = 1e-4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(mosaic.shape, generator=g, dtype=torch.float64) * (shot * mosaic + read).sqrt()
    return (mosaic + noise).float()


@pytest.mark.parametrize("shift", [(0.3, -1.7), (2.45, 0.8), (-3.1, 4.25), (0.5, 0.5), (7.3, -6.6)])
def test_estimate_shift_recovers_subpixel_shift(shift: tuple[float, float]) -> None:
    reference = _noisy(mosaic_of(textured_rgb(H, W, seed=4), "RGGB"), seed=1)
    frame = _noisy(mosaic_of(textured_rgb(H, W, seed=4, shift=shift), "RGGB"), seed=2)
    dy, dx = estimate_shift(reference, frame, "RGGB")
    assert abs(dy - shift[0]) < 0.1 and abs(dx - shift[1]) < 0.1


def test_shift_mosaic_lands_frame_on_reference() -> None:
    reference = mosaic_of(textured_rgb(64, 64, seed=5), "GBRG").float()
    frame = mosaic_of(textured_rgb(64, 64, seed=5, shift=(4.0, -2.0)), "GBRG").float()
    moved, weight = shift_mosaic(frame, 4.0, -2.0, "GBRG")
    inside = weight > 0
    assert weight.dtype == torch.float32 and set(weight.unique().tolist()) == {0.0, 1.0}
    assert bool((moved[~inside] == 0).all())
    assert inside[:60, 2:].all() and not inside[60:].any() and not inside[:, :2].any()
    torch.testing.assert_close(moved[inside], reference[inside], atol=1e-6, rtol=0)


def test_shift_mosaic_fractional_weight_edges() -> None:
    frame = torch.rand(16, 16)
    _, weight = shift_mosaic(frame, 1.0, 0.0, "RGGB")  # half a sub-plane pixel: last sub-row has no partner
    assert weight[:14].eq(1).all() and weight[14:].eq(0).all()


def test_identical_frames_average_exactly() -> None:
    reference = _noisy(mosaic_of(textured_rgb(64, 96, seed=6), "RGGB"), seed=3)
    total, weight, shifts = accumulate_frames(reference, [reference] * 4, "RGGB")
    assert shifts == [(0.0, 0.0)] * 4
    assert bool((weight == 4).all())
    assert torch.equal(total / weight, reference)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"even H and W.*got \(15, 16\)"):
        estimate_shift(torch.rand(15, 16), torch.rand(15, 16), "RGGB")
    with pytest.raises(ValueError, match="differs"):
        estimate_shift(torch.rand(16, 16), torch.rand(16, 18), "RGGB")
    with pytest.raises(ValueError, match="cfa"):
        shift_mosaic(torch.rand(16, 16), 0.0, 0.0, "XXXX")
