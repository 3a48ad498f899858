"""Tile-based coarse-to-fine alignment: sub-pixel accuracy on noisy frames, local motion, shapes, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from services.pipeline.ops import lanczos_gpu
from services.pipeline.ops.align import (
    AlignParams,
    align_frame,
    estimate_shift,
    grey_pyramid,
    mosaic_grey,
    refinement_terms,
    shift_estimator,
    tiles_to_pixels,
    warp,
)
from tests.unit.test_ops_synthetic import mosaic_of, textured_rgb

H, W = 160, 192
MID_NOISE = 0.002  # shot coefficient of the synthetic benchmark's "mid" noise


def _noisy(mosaic: torch.Tensor, seed: int, shot: float = MID_NOISE) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(mosaic.shape, generator=g, dtype=torch.float64) * (shot * mosaic + shot**2 / 2).sqrt()
    return (mosaic + noise).float()


@pytest.mark.parametrize("shift", [(0.3, -1.7), (2.45, 0.8), (-3.1, 4.25), (0.5, 0.5)])
def test_recovers_global_subpixel_shift_on_noisy_frames(shift: tuple[float, float]) -> None:
    reference = _noisy(mosaic_of(textured_rgb(H, W, seed=4), "RGGB"), seed=1)
    frame = _noisy(mosaic_of(textured_rgb(H, W, seed=4, shift=shift), "RGGB"), seed=2)
    flow = align_frame(mosaic_grey(reference, "RGGB"), mosaic_grey(frame, "RGGB"))  # (ny, nx, 2)
    error = (flow - torch.tensor(shift)).norm(dim=-1)  # (ny, nx)
    assert flow.shape == (5, 6, 2) and flow.dtype == torch.float32
    assert float(error.median()) <= 0.1
    assert float((error <= 0.1).float().mean()) >= 0.9
    assert float((flow.mean(dim=(0, 1)) - torch.tensor(shift)).norm()) <= 0.1


def test_local_motion_gets_its_own_vectors() -> None:
    rgb = textured_rgb(H, W, seed=7)
    moved = textured_rgb(H, W, seed=7, shift=(0.0, 3.0))
    combined = rgb.copy()
    combined[:, :, W // 2 :] = moved[:, :, W // 2 :]  # the right half moved 3 px to the right
    reference = mosaic_grey(mosaic_of(rgb, "RGGB").float(), "RGGB")
    frame = mosaic_grey(mosaic_of(combined, "RGGB").float(), "RGGB")
    flow = align_frame(reference, frame, AlignParams(tile_size=16))  # (10, 12, 2)
    assert float(flow[2:-2, :4, 1].abs().max()) < 0.2
    assert float((flow[2:-2, -4:, 1] - 3.0).abs().max()) < 0.2


def test_refinement_terms_kept_by_the_caller_give_the_same_flow() -> None:
    """A stack's frame group computes the reference's refinement terms once: bit for bit the flow computed alone,
    with the frame partly outside the reference (the masked border) and a prior."""
    rgb = textured_rgb(H, W, seed=4)
    reference = mosaic_grey(_noisy(mosaic_of(rgb, "RGGB"), seed=5), "RGGB")
    moved = torch.roll(reference, shifts=(2, -3), dims=(0, 1))
    frame = moved + 0.01 * torch.randn(moved.shape, generator=torch.Generator().manual_seed(6))
    pyramid = grey_pyramid(reference)
    terms = refinement_terms(pyramid[0])
    for prior in (None, (2.0, -3.0)):
        alone = align_frame(pyramid, frame, AlignParams(tile_size=16), prior=prior)
        kept = align_frame(pyramid, frame, AlignParams(tile_size=16), prior=prior, refinement=terms)
        assert torch.equal(alone, kept)
        assert float((alone[2:-2, 2:-2] - torch.tensor([2.0, -3.0])).abs().max()) < 0.2


def test_identical_frames_give_zero_flow_and_pyramid_shapes() -> None:
    grey = mosaic_grey(_noisy(mosaic_of(textured_rgb(128, 128, seed=2), "GRBG"), seed=3), "GRBG")
    pyramid = grey_pyramid(grey)
    assert [tuple(p.shape) for p in pyramid] == [(128, 128), (64, 64), (32, 32)]
    flow = align_frame(pyramid, grey)
    assert float(flow.abs().max()) < 1e-3


def test_dense_flow_and_warp() -> None:
    flow = torch.tensor([[[0.0, 0.0], [0.0, 2.0]]])  # (1, 2, 2): two tiles side by side
    dense = tiles_to_pixels(flow, 4, (4, 8))  # (2, 4, 8)
    assert dense.shape == (2, 4, 8) and float(dense[1, 0, 0]) == 0.0 and float(dense[1, 0, -1]) == 2.0
    image = torch.arange(32.0).view(1, 4, 8)
    out, valid = warp(image, torch.zeros(2, 4, 8) + torch.tensor([0.0, 1.0]).view(2, 1, 1))
    torch.testing.assert_close(out[0, :, :-1], image[0, :, 1:])
    assert valid[:, -1].eq(0).all() and valid[:, :-1].eq(1).all()


def _weave_chart(h: int, w: int, shift: tuple[int, int]) -> torch.Tensor:
    """(H, W) grey chart moved by ``shift``: a weave (threads of period 6 px over and under on a 12-px checker) in
    the top-left quarter, a smooth texture elsewhere (which pins the global shift); 2 x 2 box-integrated."""
    rng = np.random.default_rng(0)
    waves = [(rng.uniform(0.02, 0.25), rng.uniform(0, 2 * np.pi), rng.uniform(0, 2 * np.pi)) for _ in range(30)]
    out = np.zeros((h, w))
    for oy in (0.25, 0.75):
        for ox in (0.25, 0.75):
            y = np.arange(h)[:, None] + oy - shift[0] + np.zeros((1, w))  # (H, W) scene coordinates
            x = np.arange(w)[None, :] + ox - shift[1] + np.zeros((h, 1))
            threads = np.where((np.floor(x / 6) + np.floor(y / 6)) % 2 == 0, np.sin(np.pi * y / 6) ** 2,
                               np.sin(np.pi * x / 6) ** 2)
            texture = 0.4 + sum(0.02 * np.cos(2 * np.pi * f * (np.sin(a) * y + np.cos(a) * x) + p)
                                for f, a, p in waves)
            out += np.where((y < h / 2) & (x < w / 2), 0.1 + 0.6 * threads, texture) / 4
    return torch.from_numpy(out).float()


@pytest.mark.parametrize("shift", [(-1, -2), (-3, 2)])
def test_a_periodic_texture_keeps_the_global_shift(shift: tuple[int, int]) -> None:
    """A fine weave is flat on the coarse levels, and within the search radius another repeat of it (6 px
    diagonally) matched about as well: without the prior these shifts put tiles 6-17 px off (the chart's red
    weave at whole-pixel offsets, 22.0 dB against 29.2 for frame 0 alone, docs/QUALITY.md)."""
    reference, frame = _weave_chart(256, 384, (0, 0)), _weave_chart(256, 384, shift)
    flow = align_frame(reference, frame, prior=(float(shift[0]), float(shift[1])))  # (8, 12, 2)
    assert float((flow - torch.tensor(shift, dtype=torch.float32)).abs().max()) < 0.1


@pytest.mark.parametrize("prior", [(0.0, 0.0), (0.0, 3.0), (0.2, 1.4)])
def test_local_motion_overrides_the_prior(prior: tuple[float, float]) -> None:
    rgb = textured_rgb(H, W, seed=7)
    combined = rgb.copy()
    combined[:, :, W // 2 :] = textured_rgb(H, W, seed=7, shift=(0.0, 3.0))[:, :, W // 2 :]  # the right half moved
    reference = mosaic_grey(mosaic_of(rgb, "RGGB").float(), "RGGB")
    frame = mosaic_grey(mosaic_of(combined, "RGGB").float(), "RGGB")
    flow = align_frame(reference, frame, AlignParams(tile_size=16), prior=prior)  # (10, 12, 2)
    assert float(flow[2:-2, :4, 1].abs().max()) < 0.2
    assert float((flow[2:-2, -4:, 1] - 3.0).abs().max()) < 0.2


def test_lanczos_warp_shifts_exactly_and_keeps_fine_detail() -> None:
    """Whole-pixel flows move the image (borders replicated); half a pixel along a grating of 0.3 cycles/px
    keeps more of its amplitude than bicubic interpolation (which lost it in stacks at sub-pixel shifts)."""
    image = torch.rand(2, 24, 40, generator=torch.Generator().manual_seed(0))
    flow = torch.zeros(2, 24, 40) + torch.tensor([1.0, -2.0]).view(2, 1, 1)
    out, valid = warp(image, flow, mode="lanczos3")
    torch.testing.assert_close(out[:, :-1, 2:], image[:, 1:, :-2], atol=1e-5, rtol=0)
    assert valid[:-1, 2:].eq(1).all() and valid[-1].eq(0).all() and valid[:, :2].eq(0).all()
    x = torch.arange(64, dtype=torch.float32)
    grating = torch.cos(2 * np.pi * 0.3 * x).expand(1, 16, 64)
    half = torch.zeros(2, 16, 64) + torch.tensor([0.0, 0.5]).view(2, 1, 1)
    truth = torch.cos(2 * np.pi * 0.3 * (x + 0.5))[8:-8]
    errors = {mode: float((warp(grating, half, mode)[0][0, 8, 8:-8] - truth).abs().max())
              for mode in ("bicubic", "lanczos3", "lanczos4")}
    assert errors["lanczos3"] < 0.25 * errors["bicubic"]  # 0.02 against 0.12
    assert errors["lanczos4"] < errors["lanczos3"]


def _lanczos_product(image: torch.Tensor, flow: torch.Tensor, a: int = 3) -> torch.Tensor:
    """The 2a x 2a product-kernel Lanczos-``a`` warp, one output pixel at a time (borders replicated): the
    reference."""
    c, h, w = image.shape
    ys = torch.arange(h, dtype=torch.float64)[:, None] + flow[0].double()
    xs = torch.arange(w, dtype=torch.float64)[None, :] + flow[1].double()
    y0, x0 = torch.floor(ys), torch.floor(xs)
    taps = torch.arange(1 - a, a + 1, dtype=torch.float64).view(2 * a, 1, 1)

    def weights(frac: torch.Tensor) -> torch.Tensor:
        x = np.pi * (frac[None] - taps)
        k = a * torch.sin(x) * torch.sin(x / a) / x.square().clamp(min=1e-18)
        k = torch.where(x.abs() < 1e-9, torch.ones_like(x), k)
        return k / k.sum(dim=0, keepdim=True)

    wy, wx = weights(ys - y0), weights(xs - x0)
    out = torch.zeros(c, h, w, dtype=torch.float64)
    for i in range(2 * a):
        rows = (y0 + i + 1 - a).clamp(0, h - 1).long()
        for j in range(2 * a):
            cols = (x0 + j + 1 - a).clamp(0, w - 1).long()
            out += wy[i] * wx[j] * image.double()[:, rows, cols]
    return out.float()


@pytest.mark.parametrize("mode,a", [("lanczos3", 3), ("lanczos4", 4), ("lanczos5", 5)])
def test_separable_lanczos_warp_matches_the_product_kernel(mode: str, a: int) -> None:
    """The separable passes equal the product kernel under any constant flow, and stay within a small error of it
    under a smooth flow of several pixels (a rotation of half a degree about the centre plus a shift)."""
    image = torch.rand(3, 40, 56, generator=torch.Generator().manual_seed(1))
    constant = torch.zeros(2, 40, 56) + torch.tensor([2.37, -5.61]).view(2, 1, 1)
    torch.testing.assert_close(warp(image, constant, mode)[0], _lanczos_product(image, constant, a),
                               atol=2e-5, rtol=0)
    yy, xx = torch.meshgrid(torch.arange(40.0) - 20, torch.arange(56.0) - 28, indexing="ij")
    angle = np.deg2rad(0.5)
    smooth = torch.stack([xx * np.sin(angle) + yy * (np.cos(angle) - 1) + 3.3,
                          xx * (np.cos(angle) - 1) - yy * np.sin(angle) - 1.7])
    error = (warp(image, smooth, mode)[0] - _lanczos_product(image, smooth, a))[:, 8:-8, 8:-8].abs()
    assert float(error.max()) < 0.02 and float(error.mean()) < 0.002


_FUSED_CHECK = """
import torch
from services.pipeline.ops import align, lanczos_gpu
gen = torch.Generator().manual_seed(2)
worst = 0.0
for c, h, w in ((3, 14, 300), (1, 9, 17), (4, 12, 520)):
    image = torch.rand(c, h, w, generator=gen)
    yy, xx = torch.meshgrid(torch.arange(h) - h / 2.0, torch.arange(w) - w / 2.0, indexing="ij")
    flows = [torch.stack([0.01 * xx + 0.02 * yy + 0.6, -0.013 * yy - 1.37 + 0.5 * torch.sin(xx / 9)]),
             torch.stack([torch.full((h, w), 1.5), torch.full((h, w), -2.5)]) + 0.5 * (xx.abs() < 3),  # halves
             torch.stack([torch.full((h, w), 4.0), torch.full((h, w), -60.0)])]  # whole pixels, far off the edge
    for a in (3, 5):
        for flow in flows:
            got = lanczos_gpu.warp_lanczos(image, flow[0], flow[1], a)
            worst = max(worst, float((got - align._warp_lanczos(image, flow, a, fused=False)).abs().max()))
        assert torch.equal(got, align._warp_lanczos(image, flows[2], a, fused=False))  # whole pixels: copies
print(worst)
"""


def test_fused_lanczos_kernels_match_the_torch_passes() -> None:
    """The GPU's fused Triton passes (:mod:`lanczos_gpu`), run by Triton's interpreter on the CPU, compute what the
    torch passes compute: to float rounding under smooth, half-pixel and far flows, exactly at whole pixels."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernel is defined: a process of its own
    done = subprocess.run([sys.executable, "-c", _FUSED_CHECK], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) < 2e-6


def test_the_cpu_runs_the_torch_passes() -> None:
    assert not lanczos_gpu.available(torch.zeros(3, 4, 4))


def test_kernels_that_cannot_build_fall_back_to_the_torch_passes(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A GPU host whose Triton cannot build its launcher (no C compiler in the image) still warps: the torch passes,
    a warning said once, the kernels not tried again in the process."""
    calls = []

    def broken(*args: object) -> torch.Tensor:
        calls.append(1)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    monkeypatch.setattr(lanczos_gpu, "_broken", None)
    monkeypatch.setattr(lanczos_gpu, "available", lambda image: lanczos_gpu._broken is None)
    monkeypatch.setattr(lanczos_gpu, "warp_lanczos", broken)
    image = torch.rand(3, 12, 16, generator=torch.Generator().manual_seed(4))
    flow = torch.zeros(2, 12, 16) + torch.tensor([0.3, -1.2]).view(2, 1, 1)
    with caplog.at_level("WARNING"):
        first = warp(image, flow, "lanczos5")[0]
        second = warp(image, flow, "lanczos5")[0]
    monkeypatch.undo()
    torch.testing.assert_close(first, warp(image, flow, "lanczos5")[0], atol=0, rtol=0)
    assert torch.equal(first, second) and len(calls) == 1
    assert [r.message for r in caplog.records if "fused Lanczos" in r.message][0].count("C compiler") == 1


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"even H and W.*got \(15, 16\)"):
        mosaic_grey(torch.rand(15, 16), "RGGB")
    with pytest.raises(ValueError, match="differs"):
        align_frame(torch.rand(32, 32), torch.rand(32, 34))
    with pytest.raises(ValueError):
        AlignParams(tile_size=2)


def _shot_read_noisy(mosaic: torch.Tensor, seed: int, shot: float = 0.002, read: float = 1e-4) -> torch.Tensor:
    """Poisson-Gaussian noise with a separate read term (the global-shift tests' model)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(mosaic.shape, generator=g, dtype=torch.float64) * (shot * mosaic + read).sqrt()
    return (mosaic + noise).float()


@pytest.mark.parametrize("shift", [(0.3, -1.7), (2.45, 0.8), (-3.1, 4.25), (0.5, 0.5), (7.3, -6.6)])
def test_estimate_shift_recovers_subpixel_shift(shift: tuple[float, float]) -> None:
    reference = _shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4), "RGGB"), seed=1)
    frame = _shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4, shift=shift), "RGGB"), seed=2)
    dy, dx = estimate_shift(reference, frame, "RGGB")
    assert abs(dy - shift[0]) < 0.1 and abs(dx - shift[1]) < 0.1


def test_one_estimator_serves_many_frames_with_the_same_results() -> None:
    """shift_estimator takes the reference's spectrum once and the frames' spectra in one batched transform: the
    same shifts as estimate_shift frame by frame, and the pixel-shift check's benchmark finds its one-pixel pattern."""
    from lab.bench.shifts import main as bench_shifts

    reference = _shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4), "RGGB"), seed=1)
    frames = [_shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4, shift=s), "RGGB"), seed=2 + i)
              for i, s in enumerate([(0.3, -1.7), (1.0, 1.0), (-0.5, 0.25)])]
    estimate = shift_estimator(reference, "RGGB")
    assert estimate(frames) == [estimate_shift(reference, f, "RGGB") for f in frames]
    assert estimate(frames[1:]) == estimate(frames)[1:] and estimate([]) == []
    assert bench_shifts(["--scale", "0.05", "--repeats", "1"]) == 0


def test_estimate_shift_bad_input() -> None:
    with pytest.raises(ValueError, match=r"even H and W.*got \(15, 16\)"):
        estimate_shift(torch.rand(15, 16), torch.rand(15, 16), "RGGB")
    with pytest.raises(ValueError, match="differs"):
        estimate_shift(torch.rand(16, 16), torch.rand(16, 18), "RGGB")


def test_estimate_shift_on_a_window_without_texture_is_zero() -> None:
    """A frame with nothing to register in the window (a blown-out backdrop clipped flat, as the coordinator measures
    its central square) has no measurable shift: (0, 0) as for identical frames. The phase-slope fit's normal matrix
    was singular: the whole stack failed at ingest with "torch.linalg.solve: ... the input matrix is singular"."""
    textured = _shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4), "RGGB"), seed=1)
    flat = torch.ones(192, 256)
    moved = _shot_read_noisy(mosaic_of(textured_rgb(192, 256, seed=4, shift=(1.0, -2.0)), "RGGB"), seed=2)
    assert estimate_shift(flat, flat, "RGGB") == (0.0, 0.0)
    assert estimate_shift(textured, flat, "RGGB") == (0.0, 0.0) == estimate_shift(flat, textured, "RGGB")
    found = shift_estimator(textured, "RGGB")([flat, moved])  # the others in its batch still measured
    assert found[0] == (0.0, 0.0) and abs(found[1][0] - 1.0) < 0.1 and abs(found[1][1] + 2.0) < 0.1
