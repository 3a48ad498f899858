"""Experiment (not the service's path): blend the demosaic-first stack merge with a Bayer-domain merge.

    python scripts/experiments/stack_bayer_blend.py SCALE CONTENT[,CONTENT...] [FRAMES] [DEVICE]

A: the shipped merge (each frame demosaiced + denoised by the package, warped, averaged; Lee after fusion).
B: each frame's CFA planes resampled (bicubic) onto the reference with the merge's own estimated flow, averaged,
then rendered once by the package at 1/N of the noise (HDR+-like, no motion test: static scenes only).
Prints the gain of A, B and of blends a * A + (1 - a) * B over the single-frame render (docs/QUALITY.md).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
import tifffile
import torch

from services.pipeline.ops.align import align_frame, tiles_to_pixels, warp
from services.pipeline.ops.merge import _planes, _unplanes, demosaic_camera, prepare_reference
from services.pipeline.render import render_mosaic, render_rgb
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import _normalised, fuse_groups, merge_frame_group, merge_params, stack_noise_factors
from services.quality.stack_bench import BORDER, psnr
from services.raw.decode import decode_raw
from services.raw.stack_synth import synthesize_stack

PHOTOS = Path(__file__).resolve().parents[3] / "shared" / "data" / "photos"


def main(scale: float, contents: list[str], n: int, device: str = "cpu") -> None:
    cpu = torch.device(device)
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
        params = shot_render_params(frames[0][1], frames[0][0])
        single = psnr(render_mosaic(frames[0][0], params, cpu), truth, inner)
        fused = fuse_groups([merge_frame_group(frames[0], frames, cpu, params=params, stack_size=n,
                                               positions=range(n))])
        a_img = render_rgb(fused, params, cpu, stack_noise_factors(False)).astype(np.float64)
        mp = merge_params(params, cpu, n)
        total = None
        with torch.inference_mode():
            ref = prepare_reference(_normalised(*frames[0], cpu), mp)
            for k, (raw, meta) in enumerate(frames):
                mosaic = _normalised(raw, meta, cpu).float()
                planes = _planes(mosaic)  # (4, H/2, W/2)
                flow = torch.zeros(2, *planes.shape[1:], device=cpu)
                if k:
                    rgb = demosaic_camera(mosaic, mp, k % 8)
                    full = tiles_to_pixels(align_frame(ref.pyramid, rgb.mean(dim=0), mp.align), mp.align.tile_size,
                                           tuple(mosaic.shape))
                    flow = full[:, ::2, ::2] / 2  # full-resolution pixels -> CFA-plane pixels
                moved = _unplanes(warp(planes, flow, mode="bicubic")[0])
                total = moved if total is None else total + moved
        assert total is not None
        quiet = dataclasses.replace(params, noise_shot=params.noise_shot / n, noise_read=params.noise_read / n)
        b_img = render_mosaic((total / n).cpu().numpy(), quiet, cpu, normalized=True).astype(np.float64)
        line = (f"{content} scale {scale} {n} frames: single {single:.2f}  A {psnr(a_img, truth, inner) - single:+.2f}"
                f"  B {psnr(b_img, truth, inner) - single:+.2f}")
        for a in (0.5, 0.7):
            line += f"  a={a} {psnr(np.round(a * a_img + (1 - a) * b_img), truth, inner) - single:+.2f}"
        # Adaptive: B's share falls from 1/2 where the two agree to 0 where their local squared difference is c times
        # its 20th percentile over the frame (a floor that flat regions set).
        diff = torch.from_numpy(((b_img - a_img) ** 2).sum(axis=2))[None, None]
        ms = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(diff, (2, 2, 2, 2), mode="reflect"), 5, 1)[0, 0]
        floor = float(torch.quantile(ms.flatten()[:: max(1, ms.numel() // 100000)], 0.2))
        for c in (8.0, 16.0, 32.0, 64.0):
            share = (0.5 * (1 - ms / (c * floor)).clamp(0, 1)).numpy()[..., None]
            line += f"  adaptive c={c:g} {psnr(np.round(a_img + share * (b_img - a_img)), truth, inner) - single:+.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 8,
         sys.argv[4] if len(sys.argv) > 4 else "cpu")
