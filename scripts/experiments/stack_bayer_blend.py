"""Experiment: how much each render of a sub-pixel stack gives, and the blend's tolerance, through the shipped path.

    python scripts/experiments/stack_bayer_blend.py SCALE CONTENT[,CONTENT...] [FRAMES] [DEVICE]

A (tolerance 0): the fused RGB (frames demosaiced one by one by the package, warped, averaged) through the Lee
filter. B: the merged Bayer mosaic (channel 4 of the fused stack) through the package once at 1/N of the noise.
Then the shipped blend at several values of ``stack.BLEND_TOLERANCE`` and a fixed 50/50 mix of A and B. Prints
each gain over the single-frame render (docs/QUALITY.md, "Multi-shot stacks").
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
import tifffile

from lab.quality.stack_bench import BORDER, psnr
from lab.synth.stack_synth import synthesize_stack
from services.pipeline import render, stack
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import fuse_groups, merge_frame_group, stack_noise_factors
from services.raw.decode import decode_raw

PHOTOS = Path(__file__).resolve().parents[3] / "shared" / "data" / "photos"
TOLERANCES = (0.0, 0.8, 1.6, 3.2, 12.8)


def main(scale: float, contents: list[str], n: int, device: str = "cpu") -> None:
    shipped = stack.BLEND_TOLERANCE
    for content in contents:
        d = Path(tempfile.mkdtemp())
        shot = synthesize_stack(d, frames=n, scale=scale, seed=3, noise=0.002, content=content, photos_dir=PHOTOS)
        frames = []
        for i, p in enumerate(shot.files):
            meta = decode_raw(p, d / f"r{i}.npy")
            frames.append((np.load(d / f"r{i}.npy"), meta))
        truth = tifffile.imread(shot.ground_truth)
        inner = np.zeros(truth.shape[:2], bool)
        inner[BORDER:-BORDER, BORDER:-BORDER] = True
        params = dataclasses.replace(shot_render_params(frames[0][1], frames[0][0]), frames=n)
        single = psnr(render.render_mosaic(frames[0][0], params, device), truth, inner)
        fused = fuse_groups([merge_frame_group(frames[0], frames, device, params=params, stack_size=n,
                                               positions=range(n))])
        quiet = dataclasses.replace(params, noise_shot=params.noise_shot / n, noise_read=params.noise_read / n)
        b_img = render.render_mosaic(fused[4], quiet, device, normalized=True).astype(np.float64)
        line = f"{content} scale {scale} {n} frames: single {single:.2f}  B {psnr(b_img, truth, inner) - single:+.2f}"
        a_img = None
        try:
            for tolerance in TOLERANCES:
                stack.BLEND_TOLERANCE = tolerance
                out = stack.render_rgb(fused, params, device, stack_noise_factors(False)).astype(np.float64)
                a_img = out if a_img is None else a_img
                line += f"  tol {tolerance:g} {psnr(out, truth, inner) - single:+.2f}"
        finally:
            stack.BLEND_TOLERANCE = shipped
        assert a_img is not None
        line += f"  fixed 50/50 {psnr(np.round(0.5 * (a_img + b_img)), truth, inner) - single:+.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 8,
         sys.argv[4] if len(sys.argv) > 4 else "cpu")
