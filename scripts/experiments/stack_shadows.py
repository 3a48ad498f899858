"""High-noise stacks' shadows (found from outside, 2026-12-05): flat grey patches through a stack and through its
frame 0 alone, mean 8-bit sRGB per patch and PSNR against the ground truth.

    python scripts/experiments/stack_shadows.py OUT [--noise high] [--frames 2 4 8] [--scale 0.05]

Writes OUT/greys.png (12 patches, sRGB 4..200), synthesises each stack with `strata synth` (seed 21, shifts up to
2 px) and renders it in-process on the CPU as the service does (merge, fuse, render). Before the fix the 8-frame
stack's darkest patches came out about 16 / 18 / 23 for 4 / 8 / 16, tinted magenta, 34.4 dB against 37.1 for the
single frame (docs/QUALITY.md, "Stacks' shadows at high noise").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image

LEVELS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 200)
PATCH_H, PATCH_W, MARGIN = 91, 115, 12  # 4 rows x 3 columns of patches; the margin left out of each mean


def write_greys(path: Path) -> None:
    image = np.zeros((4 * PATCH_H, 3 * PATCH_W + 1, 3), np.uint8)
    for k, level in enumerate(LEVELS):
        r, c = divmod(k, 3)
        image[r * PATCH_H:(r + 1) * PATCH_H, c * PATCH_W:(c + 1) * PATCH_W] = level
    Image.fromarray(image).save(path)


def patch_means(rgb16: np.ndarray) -> np.ndarray:
    a = rgb16.astype(np.float64) / 65535 * 255
    return np.array([a[r * PATCH_H + MARGIN:(r + 1) * PATCH_H - MARGIN, c * PATCH_W + MARGIN:(c + 1) * PATCH_W - MARGIN]
                     .reshape(-1, 3).mean(0) for r, c in (divmod(k, 3) for k in range(len(LEVELS)))])


def render(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stack, frame 0 alone, truth) as 16-bit sRGB."""
    from services.pipeline import stack as s
    from services.pipeline.render import render_mosaic
    from services.pipeline.shot import shot_render_params
    from services.raw.decode import decode_raw

    frames = []
    for i, f in enumerate(sorted(folder.glob("frame_*.dng"))):
        meta = decode_raw(f, folder / f"raw_{i:02d}.npy")
        frames.append((np.load(folder / f"raw_{i:02d}.npy"), meta))
    own = shot_render_params(frames[0][1], frames[0][0], camera="IQ2_XS")
    params = s.stack_params(replace(own, frames=len(frames)), len(frames))
    single = render_mosaic(frames[0][0], own, "cpu")
    group = s.merge_frame_group(frames[0], frames, "cpu", stack_size=len(frames), positions=list(range(len(frames))),
                                params=params)
    stacked = s.render_rgb(s.fuse_groups([group]), params, "cpu", s.stack_noise_factors(False))
    return stacked, single, tifffile.imread(folder / "ground_truth.tif")


def main() -> None:
    from lab.quality.stack_bench import BORDER, psnr

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--noise", default="high")
    parser.add_argument("--frames", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--scale", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    greys = args.out / "greys.png"
    write_greys(greys)
    for n in args.frames:
        folder = args.out / f"greys{n}_{args.noise}"
        subprocess.run([sys.executable, "-m", "cli.main", "synth", "--camera", "IQ2_XS", "--scale", str(args.scale),
                        "--frames", str(n), "--noise", args.noise, "--max-shift", "2", "--seed", "21", "--content",
                        str(greys), "--out", str(folder)], check=True, capture_output=True)
        stacked, single, truth = render(folder)
        inner = np.zeros(truth.shape[:2], bool)
        inner[BORDER:-BORDER, BORDER:-BORDER] = True
        print(f"{n} frames, {args.noise} noise: PSNR stack {psnr(stacked, truth, inner):.2f} dB, frame 0 alone "
              f"{psnr(single, truth, inner):.2f} dB")
        means, alone, true = patch_means(stacked), patch_means(single), patch_means(truth)
        print("   level: stack R G B | frame 0 alone R G B | truth")
        for k in (0, 1, 2, 3, 5, 7):
            print(f"   {LEVELS[k]:5d}: {' '.join(f'{v:5.1f}' for v in means[k])} | "
                  f"{' '.join(f'{v:5.1f}' for v in alone[k])} | {true[k].mean():5.1f}")


if __name__ == "__main__":
    main()
