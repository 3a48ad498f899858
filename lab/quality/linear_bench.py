"""Linear DNG quality (``python -m lab.quality.linear_bench``): synthetic linear DNGs (lab.synth's
``synthesize_linear_shot``: a scene unprocessed to camera RGB through the DNG colour model, Poisson-Gaussian
noise per sample) decoded and rendered the way a job's strips render them, PSNR against the ground truth, with
the Lee filter and without any denoise (the same render told there is no noise), per noise level."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import tifffile

from lab.args import torch_device
from lab.quality.stack_bench import psnr as psnr16
from lab.synth.synth import synthesize_linear_shot
from services.pipeline.render import render_mosaic
from services.pipeline.shot import shot_render_params
from services.raw.decode import decode_raw

LEVELS = ("none", "low", "mid", "high")


def measure(root: Path, level: str, seed: int, size: tuple[int, int], content: str, device: str) -> dict[str, float]:
    """One shot: PSNR (dB) of the render and of the undenoised render against the ground truth, render seconds."""
    shot = synthesize_linear_shot(root / f"{level}_{seed}", width=size[0], height=size[1], seed=seed, noise=level,
                                  content=content)
    meta = decode_raw(shot.files[0], root / "raw.npy")
    image = np.load(root / "raw.npy")
    params = shot_render_params(meta, image, "srgb")
    truth = tifffile.imread(shot.ground_truth)
    t0 = time.perf_counter()
    rendered = render_mosaic(image, params, device)
    seconds = time.perf_counter() - t0
    raw = render_mosaic(image, replace(params, noise_shot=0.0, noise_read=0.0), device)
    return {"psnr": psnr16(rendered, truth), "no_denoise": psnr16(raw, truth), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.quality.linear_bench", description=__doc__)
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--size", default="768x512", help="WxH")
    ap.add_argument("--content", default="dead_leaves")
    ap.add_argument("--device", type=torch_device, default="cpu")
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    report: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="strata-linear-") as tmp:
        for level in [v for v in args.levels.split(",") if v]:
            runs = [measure(Path(tmp), level, seed, (width, height), args.content, args.device)
                    for seed in range(args.seeds)]
            report[level] = {k: round(float(np.mean([r[k] for r in runs])), 3) for k in runs[0]}
            report[level]["psnr_min"] = round(min(r["psnr"] for r in runs), 2)
            print(level, json.dumps(report[level]), flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
