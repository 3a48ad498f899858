"""Stacks on a test chart rendered exactly at every shift (issue 17, found from outside): a red weave at whole-pixel
offsets, detail near the finest scale at random sub-pixel shifts. PSNR against the ground truth of frame 0, whole
and per quarter (weave, zone plate, siren star, a smooth random texture), of frame 0 alone and of the stack.

    python scripts/experiments/stack_chart.py {int,sub,none} [--frames 8] [--noise 2e-4] [--seed 3] [--oracle]
        [--warp bicubic]

The chart (384 x 512, linear sRGB, each pixel the mean of 4 x 4 point samples) is evaluated at each frame's shift
(``frame_k(y, x) = frame_0(y - dy, x - dx)``): ``int`` draws whole-pixel offsets in [-3, 3], ``sub`` uniform ones in
[-1.5, 1.5], ``none`` none. Frames are written as DNGs (``lab.synth``), decoded, their shifts measured and merged and
rendered in-process on the CPU as the service does. ``--oracle``: the true shifts as the flow; ``--warp``: the
resampling of each frame's render (merge._RGB_WARP). Numbers: docs/QUALITY.md, "Stacks on periodic texture".
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import tifffile
import torch

from lab.quality.stack_bench import psnr
from lab.synth.synth import COLOR_MATRIX, READ_NOISE_FACTOR, _to_raw, unprocess, write_frame, write_ground_truth
from services.pipeline.ops import merge
from services.pipeline.render import render_mosaic
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import (
    frame_shifts,
    fuse_groups,
    merge_frame_group,
    render_rgb,
    sampling_concentration,
    stack_noise_factors,
    stack_params,
)
from services.raw.colour import CameraProfile, as_shot_neutral
from services.raw.decode import decode_raw
from services.raw.meta import NoiseProfile

H, W = 384, 512
SAMPLES = 4  # point samples per pixel and axis
REGIONS = {"weave": (0, H // 2, 0, W // 2), "zone": (0, H // 2, W // 2, W), "siren": (H // 2, H, 0, W // 2),
           "texture": (H // 2, H, W // 2, W)}
Wave = tuple[float, float, float, np.ndarray]


def _weave(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Red threads of period 6 px, over and under on a 12-px checker."""
    t = np.where((np.floor(x / 6) + np.floor(y / 6)) % 2 == 0, np.sin(math.pi * y / 6) ** 2,
                 np.sin(math.pi * x / 6) ** 2)[..., None]
    return t * np.array([0.70, 0.06, 0.05]) + (1 - t) * np.array([0.10, 0.02, 0.03])


def chart(y: np.ndarray, x: np.ndarray, waves: list[Wave]) -> np.ndarray:
    """Linear sRGB (..., 3) of the chart at continuous coordinates ``y``, ``x`` (...)."""
    r2 = (y - H / 4) ** 2 + (x - 3 * W / 4) ** 2
    zone = np.where(r2 < 125.0**2, 0.5 + 0.4 * np.cos(math.pi * 0.45 / 120 * r2), 0.5)  # 0.45 cycles/px at r 120
    rs = np.hypot(y - 3 * H / 4, x - W / 4)
    siren = np.where((rs < 95) & (rs >= 8), 0.5 + 0.4 * np.cos(96 * np.arctan2(y - 3 * H / 4, x - W / 4)), 0.5)
    texture = np.full(y.shape + (3,), 0.35)
    for fy, fx, phase, colour in waves:
        texture += np.cos(2 * math.pi * (fy * y + fx * x) + phase)[..., None] * colour
    out = np.clip(texture, 0.02, 0.9)
    top, left = (y < H / 2)[..., None], (x < W / 2)[..., None]
    out = np.where(top & left, _weave(y, x), out)
    out = np.where(top & ~left, 0.9 * zone[..., None] + np.zeros(3), out)
    return np.where(~top & left, 0.8 * siren[..., None] + np.zeros(3), out)


def render_frame(dy: float, dx: float, waves: list[Wave]) -> np.ndarray:
    """(H, W, 3) float32: the chart moved by (dy, dx), box-integrated over each pixel."""
    yy = np.arange(H, dtype=np.float64)[:, None] - dy + np.zeros((1, W))
    xx = np.arange(W, dtype=np.float64)[None, :] - dx + np.zeros((H, 1))
    offsets = (np.arange(SAMPLES) + 0.5) / SAMPLES - 0.5
    total = sum(chart(yy + oy, xx + ox, waves) for oy in offsets for ox in offsets)
    return (total / SAMPLES**2).astype(np.float32)


def draw(mode: str, frames: int, seed: int) -> tuple[list[Wave], list[tuple[float, float]]]:
    """The texture's waves and the frames' shifts (frame 0 at (0, 0))."""
    rng = np.random.default_rng(seed)
    waves = []
    for _ in range(40):
        f, a = rng.uniform(0.01, 0.3), rng.uniform(0, 2 * math.pi)
        waves.append((f * math.sin(a), f * math.cos(a), rng.uniform(0, 2 * math.pi), rng.uniform(0.0, 0.04, 3)))
    rng = np.random.default_rng(seed + 1000)
    if mode == "int":
        rest = [(float(a), float(b)) for a, b in rng.integers(-3, 4, (frames - 1, 2))]
    elif mode == "sub":
        rest = [(float(a), float(b)) for a, b in rng.uniform(-1.5, 1.5, (frames - 1, 2))]
    else:
        rest = [(0.0, 0.0)] * (frames - 1)
    return waves, [(0.0, 0.0), *rest]


def write_stack(work: Path, shifts: list[tuple[float, float]], waves: list[Wave], noise: float, seed: int
                ) -> tuple[list[tuple[np.ndarray, object]], np.ndarray]:
    """DNG frames decoded as the coordinator holds them, and the 16-bit sRGB ground truth of frame 0."""
    rng = np.random.default_rng(seed)
    profile = NoiseProfile(shot=noise, read=READ_NOISE_FACTOR * noise**2)
    frames = []
    for k, (dy, dx) in enumerate(shifts):
        linear = render_frame(dy, dx, waves)
        if k == 0:
            truth = tifffile.imread(write_ground_truth(linear, work))
        path = work / f"frame_{k:02d}.dng"
        write_frame(path, _to_raw(unprocess(linear, "RGGB"), noise, rng), cfa="RGGB", camera="IQ2_XS",
                    profile=CameraProfile(COLOR_MATRIX), neutral=as_shot_neutral(COLOR_MATRIX).tolist(),
                    noise_profile=profile)
        meta = decode_raw(path, work / f"raw_{k:02d}.npy")
        frames.append((np.load(work / f"raw_{k:02d}.npy"), meta))
    return frames, truth


def use_true_flow(shifts: list[tuple[float, float]]) -> None:
    """Every frame's flow is its true shift (frames are aligned in order, frame 0 is the reference)."""
    align, order = merge.align_frame, iter(shifts[1:])

    def aligned(reference: object, grey: torch.Tensor, *args: object) -> torch.Tensor:
        flow = align(reference, grey, *args)  # type: ignore[arg-type]
        return torch.zeros_like(flow) + torch.tensor(next(order), dtype=flow.dtype)

    merge.align_frame = aligned  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("int", "sub", "none"))
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--noise", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--oracle", action="store_true", help="the true shifts as the flow")
    parser.add_argument("--warp", default=None, help="resampling of each frame's render (default: the merge's)")
    args = parser.parse_args()
    waves, shifts = draw(args.mode, args.frames, args.seed)
    frames, truth = write_stack(Path(tempfile.mkdtemp(prefix="stack_chart")), shifts, waves, args.noise, args.seed)
    own = shot_render_params(frames[0][1], frames[0][0])  # type: ignore[arg-type]
    measured = frame_shifts(frames[0], frames)  # type: ignore[arg-type]
    params = stack_params(own, len(frames), measured)
    if args.oracle:
        use_true_flow(shifts)
    if args.warp:
        merge._RGB_WARP = args.warp
    single = render_mosaic(frames[0][0], own, "cpu")
    group = merge_frame_group(frames[0], frames, "cpu", params=params, stack_size=len(frames),  # type: ignore[arg-type]
                              positions=list(range(len(frames))))
    stacked = render_rgb(fuse_groups([group]), params, "cpu", stack_noise_factors(False))
    print(f"{args.mode} shifts, {args.frames} frames, noise {args.noise}, seed {args.seed}, oracle {args.oracle}, "
          "concentration (CFA, grid) {:.2f} / {:.2f}, frames' package {}".format(*sampling_concentration(measured),
                                                                                  params.frames_model))
    inner = np.zeros(truth.shape[:2], bool)
    inner[8:-8, 8:-8] = True  # the benchmark's border
    print(f"{'':8s} {'whole':>8s}" + "".join(f" {name:>8s}" for name in REGIONS))
    for name, image in (("single", single), ("stack", stacked)):
        values = [psnr(image, truth, inner)]
        for y0, y1, x0, x1 in REGIONS.values():
            region = np.zeros_like(inner)
            region[y0:y1, x0:x1] = True
            values.append(psnr(image, truth, region & inner))
        print(f"{name:8s} " + " ".join(f"{v:8.2f}" for v in values))


if __name__ == "__main__":
    main()
