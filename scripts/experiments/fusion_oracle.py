"""How much could a learned fusion after the merge gain? A linear probe, fitted per image (issue 17, session 30).

For each stack (synthesised like ``strata bench stack``'s, scale 0.1), the fused accumulator is rendered three
ways in the output's sRGB codes: today's result (A and B blended by the hand-set rule), A alone (the frames' fused
renders, Lee-filtered and sharpened) and B alone (the package's render of the fused Bayer mosaic). Linear filters
(5 x 5 neighbourhoods, every channel, a bias) are then fitted by least squares on the top half of the image and
scored on the bottom half: from today's result alone (what a residual denoiser could add) and from A and B together
(what a learned blend could add). Fitted on the same photograph, so an optimistic bound for a linear model and a
pessimistic one for a non-linear network; the point is the order of magnitude.

    python scripts/experiments/fusion_oracle.py --json docs/quality/fusion-oracle-cpu-scale0.1-mid.json
    python scripts/experiments/fusion_oracle.py --raw-merge --json docs/quality/fusion-oracle-cpu-scale0.1-mid-raw.json

``--fit-content`` (repeatable, session 48) asks the question a shipped filter faces: one probe per stack size,
fitted on the stacks of those contents (training photographs) and scored on every ``--content`` stack it never saw,
over the whole image. The stacks are merged as ``strata bench stack`` merges them (the frames' measured shifts).

    python scripts/experiments/fusion_oracle.py --scale 0.0215 --fit-content photo:001 ... --content photo:033 ...
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import tifffile
import torch

from lab.quality.stack_bench import BORDER, _decoded, _merge, psnr
from lab.synth.stack_synth import synthesize_stack
from services.pipeline.models import load_enhancer
from services.pipeline.ops import denoise_lee, sharpen, white_balance
from services.pipeline.ops._checks import small
from services.pipeline.render import SHARPEN_SIGMA, encode_spaces, noise_per_channel
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import (
    RAW_MERGE_NOISE_SHARE,
    RGB_DENOISE_RADIUS,
    _remosaic_enhance,
    frame_shifts,
    render_rgb,
    stack_noise_factors,
    stack_params,
)

RADIUS = 2  # 5 x 5 neighbourhoods


def _renders(fused: np.ndarray, params, device: str) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Today's result, A alone and B alone (and, with the raw-sample merge, D: the raw-merged image through the
    package as the service renders it before its blend), each (H, W, 3) uint16 sRGB codes."""
    today = render_rgb(fused, params, device, stack_noise_factors(False))
    x = torch.from_numpy(np.ascontiguousarray(fused, dtype=np.float32))[None]
    gains = small(params.gains, "cpu", torch.float32).view(1, 3, 1, 1)
    factors = small(stack_noise_factors(False), "cpu", torch.float32)
    shot, read = (small(v, "cpu", torch.float32) * factors for v in noise_per_channel(params))
    with torch.inference_mode():
        a = denoise_lee(x[:, :3] * gains, shot, read, radius=RGB_DENOISE_RADIUS,
                        noise_scale=1.0 / x[:, 3:4].clamp(min=1.0))
        a = sharpen(a, params.sharpen_amount, SHARPEN_SIGMA)
        shot_b, read_b = (small(v, "cpu", torch.float32) / params.frames for v in noise_per_channel(params))
        enhancer = load_enhancer(params.camera, torch.device("cpu"), package=params.model)
        b = enhancer.enhance(white_balance(x[:, 4:5], params.gains, params.cfa), params.cfa, shot_b, read_b)
        b = sharpen(b, params.sharpen_amount, SHARPEN_SIGMA)
        out = {"today": today, "A": encode_spaces(a, params)[0], "B": encode_spaces(b, params)[0]}
        if fused.shape[0] == 11:
            d = _remosaic_enhance(x[:, 5:8] * gains, params, shot_b * RAW_MERGE_NOISE_SHARE,
                                  read_b * RAW_MERGE_NOISE_SHARE)
            out["D"] = encode_spaces(sharpen(d, params.sharpen_amount, SHARPEN_SIGMA), params)[0]
        return out


def _features(images: list[np.ndarray], rows: slice) -> np.ndarray:
    """(N, F) 5 x 5 neighbourhoods of every channel of every image at the pixels of ``rows`` (inside BORDER)."""
    cols: list[np.ndarray] = []
    for img in images:
        f = img.astype(np.float32) / 65535.0
        h, w = f.shape[:2]
        for dy in range(-RADIUS, RADIUS + 1):
            for dx in range(-RADIUS, RADIUS + 1):
                part = f[rows.start + dy: rows.stop + dy, BORDER + dx: w - BORDER + dx]
                cols.extend(part[..., c].reshape(-1) for c in range(3))
    cols.append(np.ones_like(cols[0]))
    return np.stack(cols, axis=1)


def _probe(inputs: list[np.ndarray], truth: np.ndarray) -> np.ndarray:
    """Fit on the top half, predict the bottom half: (rows, W - 2 BORDER, 3) uint16."""
    h, w = truth.shape[:2]
    top, bottom = slice(BORDER, h // 2), slice(h // 2, h - BORDER)
    x_fit = _features(inputs, top)[::3]
    y_fit = (truth[top, BORDER: w - BORDER].reshape(-1, 3).astype(np.float32) / 65535.0)[::3]
    gram = x_fit.T.astype(np.float64) @ x_fit + 1e-6 * np.eye(x_fit.shape[1])
    coef = np.linalg.solve(gram, x_fit.T.astype(np.float64) @ y_fit)
    pred = _features(inputs, bottom) @ coef.astype(np.float32)
    return np.clip(pred * 65535.0 + 0.5, 0, 65535).astype(np.uint16).reshape(bottom.stop - bottom.start, -1, 3)


def _stack(content: str, frames: int, args: argparse.Namespace, seed: int, scale: float
           ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One stack merged as ``strata bench stack`` merges it (the frames' measured shifts): its renders and truth."""
    with tempfile.TemporaryDirectory() as tmp:
        shot = synthesize_stack(Path(tmp) / "s", frames=frames, scale=scale, seed=seed, noise=args.noise,
                                content=content, photos_dir=args.photos)
        decoded = [_decoded(p, Path(tmp) / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
        truth = tifffile.imread(shot.ground_truth)
        own = shot_render_params(decoded[0][1], decoded[0][0])
        params = replace(stack_params(own, frames, frame_shifts(decoded[0], decoded)), raw_merge=args.raw_merge)
        fused = _merge(decoded[0], decoded, params, 1, "cpu", None, {})
        return _renders(fused, params, "cpu"), truth


PROBES = {"today": ["today"], "A + B": ["A", "B"], "today + A + B": ["today", "A", "B"]}


def _cross(args: argparse.Namespace) -> list[dict[str, object]]:
    """Probes fitted on the ``--fit-content`` stacks (seed 11), scored on the ``--content`` stacks (seed 3)."""
    coefs: dict[tuple[int, str], np.ndarray] = {}
    for frames in args.frames or [4, 8]:
        sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for content, scale in ((c, f) for c in args.fit_content for f in args.fit_scale or [args.scale]):
            r, truth = _stack(content, frames, args, seed=11, scale=scale)
            h, w = truth.shape[:2]
            y = truth[BORDER: h - BORDER, BORDER: w - BORDER].reshape(-1, 3).astype(np.float64) / 65535.0
            for name, keys in PROBES.items():
                x = _features([r[k] for k in keys], slice(BORDER, h - BORDER)).astype(np.float64)
                gram, xty = sums.get(name, (0.0, 0.0))
                sums[name] = (gram + x.T @ x, xty + x.T @ y)
            print(f"fitted on {content} at scale {scale}, {frames} frames", flush=True)
        for name, (gram, xty) in sums.items():
            coefs[(frames, name)] = np.linalg.solve(gram + 1e-6 * np.eye(gram.shape[0]), xty).astype(np.float32)
    rows = []
    for content in args.content or ["photo:033", "photo:036", "skimage:astronaut"]:
        for frames in args.frames or [4, 8]:
            r, truth = _stack(content, frames, args, seed=3, scale=args.scale)
            h, w = truth.shape[:2]
            inner = truth[BORDER: h - BORDER, BORDER: w - BORDER]
            score = {k: psnr(v[BORDER: h - BORDER, BORDER: w - BORDER], inner) for k, v in r.items()}
            for name, keys in PROBES.items():
                pred = _features([r[k] for k in keys], slice(BORDER, h - BORDER)) @ coefs[(frames, name)]
                codes = np.clip(pred * 65535.0 + 0.5, 0, 65535).astype(np.uint16).reshape(inner.shape)
                score[f"probe: {name}"] = psnr(codes, inner)
            row = {"content": content, "frames": frames, "noise": args.noise, **{k: round(v, 3) for k, v in
                                                                                  score.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--content", action="append", help="photo:NNN or skimage:NAME (default: 033, 036, astronaut)")
    ap.add_argument("--frames", type=int, action="append", help="stack sizes (default 4 and 8)")
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--raw-merge", action="store_true", help="merge the raw samples too (11 channels): today's "
                    "result then includes their blend, and D joins the probes")
    ap.add_argument("--fit-content", action="append", default=[],
                    help="fit the probes on these contents' stacks instead, and score the --content stacks whole")
    ap.add_argument("--fit-scale", type=float, action="append", help="the fitted stacks' scales (default --scale)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.fit_content:
        rows = _cross(args)
        if args.json:
            summary = {"scale": args.scale, "fit_scale": args.fit_scale or [args.scale], "raw_merge": args.raw_merge,
                       "fit": args.fit_content, "rows": rows}
            args.json.write_text(json.dumps(summary, indent=1) + "\n")
        return
    rows = []
    for content in args.content or ["photo:033", "photo:036", "skimage:astronaut"]:
        for frames in args.frames or [4, 8]:
            with tempfile.TemporaryDirectory() as tmp:
                shot = synthesize_stack(Path(tmp) / "s", frames=frames, scale=args.scale, seed=3, noise=args.noise,
                                        content=content, photos_dir=args.photos)
                decoded = [_decoded(p, Path(tmp) / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
                truth = tifffile.imread(shot.ground_truth)
                params = stack_params(shot_render_params(decoded[0][1], decoded[0][0]), frames)
                params = replace(params, raw_merge=args.raw_merge)
                fused = _merge(decoded[0], decoded, params, 1, "cpu", None, {})
                r = _renders(fused, params, "cpu")
            h, w = truth.shape[:2]
            bottom = (slice(h // 2, h - BORDER), slice(BORDER, w - BORDER))
            score = {k: psnr(v[bottom], truth[bottom]) for k, v in r.items()}
            score["probe: today"] = psnr(_probe([r["today"]], truth), truth[bottom])
            score["probe: A + B"] = psnr(_probe([r["A"], r["B"]], truth), truth[bottom])
            score["probe: today + A + B"] = psnr(_probe([r["today"], r["A"], r["B"]], truth), truth[bottom])
            if "D" in r:
                score["probe: A + B + D"] = psnr(_probe([r["A"], r["B"], r["D"]], truth), truth[bottom])
            row = {"content": content, "frames": frames, "noise": args.noise,
                   **{k: round(v, 3) for k, v in score.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        summary = {"scale": args.scale, "raw_merge": args.raw_merge, "rows": rows}
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
