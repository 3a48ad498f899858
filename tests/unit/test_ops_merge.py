"""Multi-frame merge: mosaic shifts, robust accumulation with motion rejection, pixel-shift combine."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.pipeline.ops import accumulate_frames, shift_mosaic
from services.pipeline.ops.cfa import ORIENTATIONS, cfa_masks, orient, oriented_cfa, unorient
from services.pipeline.ops.merge import (
    FIXED_POINT_BITS,
    MergeParams,
    demosaic_camera,
    integer_shift,
    merged_rgb,
    motion_weights,
    pixel_shift_accumulate,
    prepare_reference,
    split_detail,
    warp_reliability,
)
from tests.unit.test_ops_synthetic import mosaic_of, textured_rgb

ONE = 2.0**FIXED_POINT_BITS
PARAMS = MergeParams(cfa="RGGB", gains=(1.8, 1.0, 1.4), shot=0.002, read=2e-6)

H, W = 192, 256


def _noisy(mosaic: torch.Tensor, seed: int, shot: float = 0.002, read: float = 1e-4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(mosaic.shape, generator=g, dtype=torch.float64) * (shot * mosaic + read).sqrt()
    return (mosaic + noise).float()


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


def _merged(acc: torch.Tensor) -> torch.Tensor:
    """(5 | 6 | 9, H, W) fixed-point accumulator -> (3, H, W) merged camera RGB."""
    return merged_rgb(acc)


def test_identical_frames_average_exactly() -> None:
    reference = _noisy(mosaic_of(textured_rgb(64, 96, seed=6), "RGGB"), seed=3)
    acc = accumulate_frames(reference, [reference] * 4, PARAMS)  # (5, H, W)
    assert acc.dtype == torch.int64 and acc.shape == (5, 64, 96)
    assert bool((acc[3] == 4 * ONE).all())
    torch.testing.assert_close(acc[4].double() / acc[3].double(), reference.double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(_merged(acc).float(), demosaic_camera(reference, PARAMS), atol=1e-6, rtol=0)


def test_identical_frames_are_demosaiced_in_their_own_orientation() -> None:
    """A noise-free static stack (every frame equal to the reference) is the orientations' ensemble of its one
    mosaic, not the reference's demosaic counted N times (which rendered below the single frame's two orientations)."""
    reference = _noisy(mosaic_of(textured_rgb(64, 96, seed=6), "RGGB"), seed=3)
    seen: list[str] = []

    def spy(balanced: torch.Tensor, cfa: str) -> torch.Tensor:  # orientation-dependent: each site its own colour
        seen.append(cfa)
        return cfa_masks(cfa, *balanced.shape[-2:])[None] * balanced

    params = replace(PARAMS, demosaic=spy)
    ref = prepare_reference(reference, params)
    seen.clear()
    acc = accumulate_frames(ref, [reference] * 3, params, positions=[0, 1, 2])
    assert seen == [oriented_cfa("RGGB", 1), oriented_cfa("RGGB", 2)]  # frame 0 reuses the reference's demosaic
    assert bool((acc[3] == 3 * ONE).all())  # weight 1 each, nothing resampled
    torch.testing.assert_close(acc[4].double() / acc[3].double(), reference.double(), atol=1e-6, rtol=0)
    expected = sum(acc_k for acc_k in (demosaic_camera(reference, params, k) for k in range(3))) / 3
    torch.testing.assert_close(_merged(acc).float(), expected, atol=1e-6, rtol=0)
    # the same sums whichever group a frame is merged in (frame 0 counted once)
    split = accumulate_frames(ref, [reference], params, positions=[0]) + accumulate_frames(
        ref, [reference] * 2, params, positions=[1, 2])
    assert torch.equal(split, acc)


def test_unshifted_noisy_frames_merge_to_their_average() -> None:
    clean = mosaic_of(textured_rgb(96, 96, seed=8), "RGGB")
    frames = [_noisy(clean, seed=s) for s in range(4)]
    acc = accumulate_frames(frames[0], frames, PARAMS)
    assert float((acc[3] / ONE).mean()) > 3.9  # nothing (or almost nothing) rejected
    average = torch.stack([demosaic_camera(f, PARAMS) for f in frames]).mean(0)  # (3, H, W)
    inner = (slice(None), slice(8, -8), slice(8, -8))
    err = (_merged(acc).float() - average)[inner].abs().mean()
    noise = (demosaic_camera(frames[0], PARAMS) - average)[inner].abs().mean()
    assert float(err) < 0.1 * float(noise)


def test_moving_square_is_rejected_not_blended() -> None:
    clean = mosaic_of(textured_rgb(96, 96, seed=9), "RGGB")
    reference = _noisy(clean, seed=0)
    frames = [reference, _noisy(clean, seed=1), _noisy(clean, seed=2)]
    planted = clean.clone()
    planted[32:64, 32:64] = 0.9  # a bright square that is only in this frame
    frames.append(_noisy(planted, seed=3))
    acc = accumulate_frames(reference, frames, PARAMS)
    square = (slice(None), slice(32, 64), slice(32, 64))
    weight = acc[3] / ONE  # (H, W)
    assert float(weight[square[1:]].max()) <= 3.0 + 1e-6  # the planted frame got weight 0 in the square
    assert float(weight[8:24, 8:24].min()) > 3.5  # elsewhere all four count
    truth = demosaic_camera(clean, PARAMS)
    err = (_merged(acc).float() - truth)[square].abs().mean()
    blend = (0.25 * (demosaic_camera(planted, PARAMS) - truth))[square].abs().mean()
    assert float(err) < 0.2 * float(blend)  # what is left is the noise of the three other frames


def test_noise_free_shifted_frames_count_but_a_moving_square_does_not() -> None:
    """With no sensor noise the motion test still tolerates the merge's own error (demosaic, warp, alignment:
    ``model_error``), so a static scene is averaged; what moved is rejected all the same."""
    shifts = [(0.0, 0.0), (0.5, -0.3), (-0.7, 0.4), (0.25, 0.9)]
    frames = [mosaic_of(textured_rgb(96, 96, seed=13, shift=s), "RGGB").float() for s in shifts]
    clean = MergeParams(cfa="RGGB", gains=(1.8, 1.0, 1.4), shot=0.0, read=0.0)
    inner = (slice(12, -12), slice(12, -12))
    weight = accumulate_frames(frames[0], frames, clean)[3] / ONE  # (H, W)
    strict = accumulate_frames(frames[0], frames, replace(clean, model_error=0.0))[3] / ONE
    assert float(weight[inner].mean()) > 3.8  # nearly every frame counts nearly everywhere
    assert float(strict[inner].mean()) < float(weight[inner].mean()) - 0.5  # the noise alone rejected detail
    frames[3][40:64, 40:64] = 0.9  # a bright square only in the last frame
    moved = accumulate_frames(frames[0], frames, clean)[3] / ONE
    assert float(moved[44:60, 44:60].max()) <= 3.0 + 1e-6


def test_merged_bayer_mosaic_of_shifted_frames_lands_on_the_reference() -> None:
    """Channel 4 sums each frame's mosaic with its CFA planes warped onto the reference: every site keeps its
    colour, so the merged mosaic is the reference's (the renderer's second path enhances it once)."""
    shifts = [(0.0, 0.0), (1.0, -0.6), (-0.8, 1.4), (2.2, 0.3)]
    frames = [mosaic_of(textured_rgb(96, 96, seed=14, shift=s, cutoff=0.08), "GRBG").float() for s in shifts]
    params = MergeParams(cfa="GRBG", gains=(1.8, 1.0, 1.4), shot=0.0, read=0.0)
    acc = accumulate_frames(frames[0], frames, params)
    inner = (slice(12, -12), slice(12, -12))
    merged = (acc[4].double() / acc[3].double())[inner]
    assert float((merged - frames[0].double()[inner]).abs().mean()) < 0.01 * float(frames[0].mean())
    other_phase = torch.roll(frames[0], 1, dims=1).double()[inner]  # a colour mix-up would land nearer this
    assert float((merged - frames[0].double()[inner]).abs().mean()) < 0.2 * float((merged - other_phase).abs().mean())


def test_dark_frames_average_unclipped_in_the_merged_bayer_mosaic() -> None:
    """Frames normalised without the black clip (values below black kept): the merged Bayer mosaic is their plain
    mean, so dark noise averages out around the scene's level; the clip would lift it by a share of the per-frame
    noise whatever the number of frames. Each frame's demosaic still sees its samples clipped at 0."""
    dark = torch.full((64, 96), 0.002, dtype=torch.float64)
    frames = [_noisy(dark, seed=s, shot=0.01, read=1.5e-4) for s in range(4)]  # std 0.012: half below black
    assert float((frames[0] < 0).double().mean()) > 0.3
    acc = accumulate_frames(frames[0], frames, replace(PARAMS, shot=0.01, read=1.5e-4))
    assert float((acc[3] / ONE).mean()) > 3.0  # most frames count
    merged = acc[4].double() / acc[3].double()
    assert abs(float(merged.mean()) - 0.002) < 3e-4
    assert float(torch.stack(frames).clamp(min=0).double().mean()) > 0.005  # what a clipped mean comes to
    torch.testing.assert_close(prepare_reference(frames[0], PARAMS).rgb,
                               demosaic_camera(frames[0].clamp(min=0), PARAMS), atol=0, rtol=0)


def test_pixel_shift_noise_free_returns_truth_at_every_site() -> None:
    rgb = torch.as_tensor(textured_rgb(64, 64, seed=11)).float()  # (3, H, W), periodic
    offsets = [(0, 0), (0, 1), (1, 1), (1, 0)]
    # frame(y, x) = scene(y - dy, x - dx): a frame shifted by (dy, dx) records the scene rolled by it.
    frames = [mosaic_of(torch.roll(rgb, (dy, dx), dims=(1, 2)), "RGGB") for dy, dx in offsets]
    exact = MergeParams(cfa="RGGB", gains=(1.0, 1.0, 1.0), shot=0.0, read=0.0, reject_low=1e30, reject_high=2e30)
    acc = pixel_shift_accumulate(frames[0], frames, offsets, exact)  # (6, H, W)
    merged = _merged(acc).float()
    inner = (slice(None), slice(1, -1), slice(1, -1))
    torch.testing.assert_close(merged[inner], rgb[inner], atol=2e-4, rtol=0)  # fallback weight 1e-4, 2^-20
    counts = (acc[3:] / ONE).round()[inner]
    assert bool((counts[1] == 2).all()) and bool((counts[0] == 1).all()) and bool((counts[2] == 1).all())


def test_pixel_shift_motion_falls_back_to_reference() -> None:
    clean = torch.as_tensor(textured_rgb(64, 64, seed=12)).float()
    offsets = [(0, 0), (0, 1), (1, 1), (1, 0)]
    frames = [mosaic_of(torch.roll(clean, o, dims=(1, 2)), "RGGB") for o in offsets]
    frames[2][16:40, 16:40] = 0.95  # something bright passed through frame 2
    acc = pixel_shift_accumulate(frames[0], frames, offsets, PARAMS)
    square = (slice(None), slice(18, 38), slice(18, 38))
    err = (_merged(acc).float() - clean)[square].abs().mean()
    blend = (0.95 - clean)[square].abs().mean() / 4  # a quarter of the samples from the bright frame
    assert float(err) < 0.2 * float(blend)  # what is left is the reference's demosaicing error
    assert float(((acc[3:] / ONE)[square]).sum(0).max()) <= 3.0 + 1e-3  # frame 2 dropped in the square


def test_integer_shift() -> None:
    frame = torch.arange(16.0).view(4, 4)
    out, valid = integer_shift(frame, 1, -1)
    assert float(out[0, 1]) == float(frame[1, 0]) and valid[-1].eq(0).all() and valid[:, 0].eq(0).all()


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="cfa"):
        shift_mosaic(torch.rand(16, 16), 0.0, 0.0, "XXXX")


@pytest.mark.parametrize("cfa", ["RGGB", "BGGR", "GRBG", "GBRG"])
def test_orientations_keep_bayer_cells_and_invert(cfa: str) -> None:
    x = torch.rand(2, 1, 6, 10)
    masks = cfa_masks(cfa, 6, 10)  # (3, 6, 10)
    for k in range(len(ORIENTATIONS)):
        assert torch.equal(unorient(orient(x, k), k), x)
        # The oriented mosaic is the Bayer mosaic of the oriented pattern: its colour masks turn with it.
        assert torch.equal(orient(masks, k), cfa_masks(oriented_cfa(cfa, k), *orient(masks, k).shape[-2:]))
    with pytest.raises(ValueError, match="orientation"):
        orient(x, 8)


def test_oriented_demosaic_is_turned_back() -> None:
    mosaic = _noisy(mosaic_of(textured_rgb(32, 48, seed=2), "GRBG"), seed=1)
    # A demosaic that puts each site's value in its own colour: any wrong pattern or geometry shows.
    def by_site(balanced: torch.Tensor, cfa: str) -> torch.Tensor:
        return cfa_masks(cfa, *balanced.shape[-2:])[None] * balanced

    params = MergeParams(cfa="GRBG", gains=(1.8, 1.0, 1.4), shot=0.002, read=2e-6, demosaic=by_site)
    upright = demosaic_camera(mosaic, params)
    malvar = MergeParams(cfa="GRBG", gains=(1.8, 1.0, 1.4), shot=0.002, read=2e-6)
    for k in range(len(ORIENTATIONS)):
        assert torch.equal(demosaic_camera(mosaic, params, k), upright)
        # Malvar's filters are symmetric: turning the mosaic changes only the rounding.
        torch.testing.assert_close(demosaic_camera(mosaic, malvar, k), demosaic_camera(mosaic, malvar),
                                   atol=1e-5, rtol=0)


def test_positions_pick_each_frames_orientation() -> None:
    clean = mosaic_of(textured_rgb(64, 64, seed=4), "RGGB")
    frames = [_noisy(clean, seed=s) for s in range(3)]
    seen: list[str] = []

    def spy(balanced: torch.Tensor, cfa: str) -> torch.Tensor:
        seen.append(cfa)
        return cfa_masks(cfa, *balanced.shape[-2:])[None] * balanced

    params = MergeParams(cfa="RGGB", gains=(1.0, 1.0, 1.0), shot=0.002, read=2e-6, demosaic=spy)
    reference = prepare_reference(frames[0], params)
    seen.clear()
    accumulate_frames(reference, frames[1:], params, positions=[9, 2])  # positions 9 and 2: orientations 1 and 2
    assert seen == [oriented_cfa("RGGB", 1), oriented_cfa("RGGB", 2)] == ["BGGR", "GRBG"]
    with pytest.raises(ValueError, match="stack position"):
        accumulate_frames(reference, frames[1:], params, positions=[1])


@pytest.mark.parametrize("local_range", [False, True])
def test_motion_weights_pool_one_shared_mask_once(local_range: bool) -> None:
    """A frame's warp gives one mask for all three channels (expanded): its window mean is taken once, and the
    weights are bit for bit those of the same mask given as three planes of their own."""
    g = torch.Generator().manual_seed(9)
    h, w = 96, 128
    ref = torch.rand(3, h, w, generator=g)
    cand = ref + 0.03 * torch.randn(3, h, w, generator=g)
    cand[:, 30:60, 40:90] += 2.0  # something moved, far outside the local range too
    valid = (torch.rand(h, w, generator=g) > 0.1).float()
    params = MergeParams(cfa="RGGB", gains=(2.0, 1.0, 1.5), shot=1e-3, read=1e-5)
    shared = motion_weights(ref, cand, valid.expand(3, h, w), params, local_range=local_range)
    planes = motion_weights(ref, cand, valid.expand(3, h, w).clone(), params, local_range=local_range)
    assert torch.equal(shared, planes)
    assert 0.0 < float(shared.mean()) < 1.0


def test_warp_reliability_is_one_on_whole_pixels_and_zero_at_half_a_pixel() -> None:
    pixels = torch.tensor([[0.0, 2.0, -1.0, 0.5, 0.25, 0.25], [0.0, -3.0, 0.5, 0.0, 0.0, 0.25]])[:, None, :]
    expected = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.25])[None]  # (1 - 2|fy|)(1 - 2|fx|)
    torch.testing.assert_close(warp_reliability(pixels), expected)


def test_detail_band_of_the_reference_alone_is_its_render() -> None:
    reference = _noisy(mosaic_of(textured_rgb(64, 96, seed=6), "RGGB"), seed=3)
    acc = accumulate_frames(reference, [reference], PARAMS, detail=True)  # (9, H, W)
    assert acc.shape == (9, 64, 96) and bool((acc[3] == ONE).all()) and bool((acc[8] == ONE).all())
    torch.testing.assert_close(merged_rgb(acc).float(), demosaic_camera(reference, PARAMS), atol=2 / ONE, rtol=0)
    torch.testing.assert_close(acc[3:5], accumulate_frames(reference, [reference], PARAMS)[3:5], atol=0, rtol=0)


def test_detail_band_keeps_the_reference_grid_where_frames_sit_half_a_pixel_off() -> None:
    """Frames half a pixel off in both axes cannot be resampled near the finest scale (no interpolator recovers
    detail near Nyquist there): averaged whole, they blurred the stack. With the detail band they add their base
    (everything coarse, where their noise averages out) and, noise-free on rich detail, a seventh of their detail
    at most: the merged detail is nearly the reference's. (Whether that beats the plain average depends on how well
    each frame is demosaiced: with the shot's package it did on photo stacks, docs/QUALITY.md; with Malvar's errors
    on fine detail, not.)"""
    shifts = [(0.0, 0.0), (0.5, 0.5), (-0.5, 0.5), (0.5, -0.5), (-0.5, -0.5)]
    frames = [mosaic_of(textured_rgb(96, 96, seed=16, shift=s, cutoff=0.4), "RGGB").float() for s in shifts]
    clean = MergeParams(cfa="RGGB", gains=(1.0, 1.0, 1.0), shot=0.0, read=0.0)
    inner = (slice(None), slice(12, -12), slice(12, -12))
    acc = accumulate_frames(frames[0], frames, clean, detail=True)
    # the reference's 1, and at most 1 / (1 + DETAIL_STRENGTH / DETAIL_MODEL_ERROR) = 1/7 for each frame
    assert float((acc[8] / ONE)[inner[1:]].mean()) < 1 + 4 / 7 + 0.01
    assert float((acc[3] / ONE)[inner[1:]].mean()) > 4.0  # (nearly) every frame counts in the base
    own = split_detail(demosaic_camera(frames[0], clean))[1]  # (3, H, W) the reference's detail band
    merged = acc[5:8].double() / acc[8:9].double()
    off = float((merged - own)[inner].square().mean() / own[inner].square().mean())
    assert off < 0.05, off
    plain = accumulate_frames(frames[0], frames, clean)
    averaged = _merged(plain) - split_detail(_merged(plain).float())[0]  # what the plain average keeps of it
    assert float((averaged - own)[inner].square().mean() / own[inner].square().mean()) > 4 * off
