"""Pixel shift at noise: how its render compares with the sub-pixel path on the same frames (issue 17, session 50).

A 4-shot pixel shift holds the photons of a 4-frame stack and samples every colour at every site, yet on the stack
benchmark it rendered below the 4-frame sub-pixel stack of the same content on 8 of 10 contents at mid noise. For
every content, one synthetic pixel-shift stack (``strata bench stack``'s synthesis) is merged and rendered
in-process as the service does, then with other renders of the same frames:

- ``shipped``: the pixel-shift combine and render (:data:`PIXEL_SHIFT_NOISE_SHARE`, the restore);
- ``share=S``: the same with the phases' package told S of the fused noise;
- ``subpixel``: the frames merged as a sub-pixel stack at their whole-pixel shifts (the frames' own renders
  averaged, the Bayer blend), the package the shifts pick;
- ``mean``: the mean of ``shipped`` and ``subpixel`` (their errors differ);
- ``phases turned ...+restore``: the phases each in an orientation of their own (:data:`TURNS`; 0, 2, 1, 3 is what
  ships since session 50, :data:`stack.PHASE_TURNS`), or every phase in two orientations;
- ``...+restore``: a second estimate (the sub-pixel render; the frames' companion package on the phases; a Lee
  filter; the phases told 0.25 then a Lee filter), alone or averaged with the shipped phases' estimate, then moved
  towards the measured samples by the shipped restore (``both+restore``: the sub-pixel render averaged in).

Numbers: docs/QUALITY.md, "Pixel shift at noise".

    python scripts/experiments/pixel_shift_probe.py --content photo:033 --content dead_leaves --noise 0.002 \\
        [--scale 0.0215] [--seed 3] [--cfa RGGB] [--shares 0.5,1.0] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np
import tifffile
import torch

from lab.quality.stack_bench import BORDER, _decoded, _merge, psnr
from lab.synth.stack_synth import synthesize_stack
from services.pipeline import stack
from services.pipeline.models import load_enhancer
from services.pipeline.models.registry import frames_package
from services.pipeline.ops import cfa_masks, denoise_lee, sharpen
from services.pipeline.ops.cfa import orient, oriented_cfa, unorient
from services.pipeline.render import SHARPEN_SIGMA, RenderParams, encode_spaces, noise_per_channel
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import frame_shifts, pixel_shift_offsets, render_rgb, stack_noise_factors, stack_params


def one_content(content: str, noise: float, scale: float, seed: int, shares: list[float], photos: Path,
                cfa: str = "RGGB", tolerances: tuple[float, ...] = (), extras: bool = True) -> dict[str, float | str]:
    """Every render of one content's pixel-shift stack, PSNR in dB against its ground truth."""
    work = Path(tempfile.mkdtemp(prefix="pixel-shift-probe-"))
    shot = synthesize_stack(work, frames=4, scale=scale, seed=seed, noise=noise, pixel_shift=True, content=content,
                            photos_dir=photos, cfa=cfa)
    frames = [_decoded(p, work / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
    truth = tifffile.imread(shot.ground_truth)
    inner = np.zeros(truth.shape[:2], bool)
    inner[BORDER:-BORDER, BORDER:-BORDER] = True
    shifts = frame_shifts(frames[0], frames)
    offsets = pixel_shift_offsets(shifts)
    if offsets is None:
        raise RuntimeError(f"{content}: pixel-shift pattern not detected")
    params = stack_params(shot_render_params(frames[0][1], frames[0][0]), 4, shifts)
    fused = _merge(frames[0], frames, params, 1, "cpu", offsets, {})
    row: dict[str, float | str] = {"content": content}
    renders = {"shipped": render_rgb(fused, params, "cpu", stack_noise_factors(True))}
    for share in shares:
        with mock.patch.object(stack, "PIXEL_SHIFT_NOISE_SHARE", share):
            renders[f"share={share}"] = render_rgb(fused, params, "cpu", stack_noise_factors(True))
    for tolerance in tolerances:
        with mock.patch.object(stack, "PIXEL_SHIFT_RESTORE_TOLERANCE", tolerance):
            renders[f"tolerance={tolerance}"] = render_rgb(fused, params, "cpu", stack_noise_factors(True))
    if not extras:
        return row | {name: psnr(image, truth, inner) for name, image in renders.items()}
    sub = _merge(frames[0], frames, params, 1, "cpu", None, {})
    renders["subpixel"] = render_rgb(sub, params, "cpu", stack_noise_factors(False))
    renders["mean"] = ((renders["shipped"].astype(np.float64) + renders["subpixel"]) / 2).round().astype(np.uint16)
    renders.update(_restored(fused, sub, params))
    for name, image in renders.items():
        row[name] = psnr(image, truth, inner)
    return row


TURNS = {"phases turned 0,2,1,3": (0, 2, 1, 3), "phases turned 0,4,5,6": (0, 4, 5, 6),
         "phases x2 orientations": (0, 0, 0, 0, 2, 2, 2, 2)}


def _oriented_phases(x: torch.Tensor, params: RenderParams, shot: torch.Tensor, read: torch.Tensor,
                     turns: tuple[int, ...]) -> torch.Tensor:
    """:func:`stack._remosaic_enhance` with each phase's mosaic turned to an orientation of its own (``turns``: one
    per phase, cycling over the phases; 8: each phase twice)."""
    enhancer = load_enhancer(params.camera, x.device, package=params.model)
    h, w = x.shape[-2:]
    out = torch.zeros_like(x)
    for i, k in enumerate(turns):
        cfa = stack._PHASES[i % 4]
        mosaic = (x * cfa_masks(cfa, h, w, x.device)).sum(dim=1, keepdim=True)
        out += unorient(enhancer.enhance(orient(mosaic, k).contiguous(), oriented_cfa(cfa, k, h, w), shot, read), k)
    return out / len(turns)


@torch.inference_mode()
def _restored(fused: np.ndarray, sub: np.ndarray, params: RenderParams) -> dict[str, np.ndarray]:
    """The sub-pixel render (alone, and averaged with the shipped phases' estimate) moved towards the measured
    pixel-shift samples by the shipped restore."""
    f = torch.from_numpy(np.ascontiguousarray(fused, dtype=np.float32))[None]
    gains = torch.tensor(params.gains, dtype=torch.float32).view(1, 3, 1, 1)
    measured, weight = f[:, :3] * gains, f[:, 3:6]
    est_sub = stack.render_fused_linear(torch.from_numpy(np.ascontiguousarray(sub, dtype=np.float32))[None],
                                        params, stack_noise_factors(False))
    shot, read = (torch.tensor(v, dtype=torch.float32) for v in noise_per_channel(params))
    factors = torch.tensor(stack_noise_factors(True))
    share = stack.PIXEL_SHIFT_NOISE_SHARE
    est_ps = sharpen(stack._remosaic_enhance(measured, params, shot * factors * share, read * factors * share),
                     params.sharpen_amount, SHARPEN_SIGMA)
    companion = replace(params, model=frames_package(params.model, companion=True))
    est_comp = sharpen(stack._remosaic_enhance(measured, companion, shot * factors * share, read * factors * share),
                       params.sharpen_amount, SHARPEN_SIGMA)
    low = 0.25
    est_low = stack._remosaic_enhance(measured, params, shot * factors * low, read * factors * low)
    est_low = sharpen(denoise_lee(est_low, shot * factors * 0.15, read * factors * 0.15), params.sharpen_amount,
                      SHARPEN_SIGMA)
    est_lee = sharpen(denoise_lee(measured, shot * factors, read * factors), params.sharpen_amount, SHARPEN_SIGMA)
    turned = {name: sharpen(_oriented_phases(measured, params, shot * factors * share, read * factors * share, ks),
                            params.sharpen_amount, SHARPEN_SIGMA) for name, ks in TURNS.items()}
    out = {f"{name}+restore": encode_spaces(stack._restore_measured(est, measured, weight, params), params)[0]
           for name, est in turned.items()}
    for name, est in (("subpixel+restore", est_sub), ("both+restore", (est_sub + est_ps) / 2),
                      ("companion+restore", est_comp), ("two packages+restore", (est_comp + est_ps) / 2),
                      ("low+lee+restore", est_low), ("with lee+restore", (est_ps + est_lee) / 2),
                      ("ps+low+restore", (est_ps + est_low) / 2)):
        out[name] = encode_spaces(stack._restore_measured(est, measured, weight, params), params)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--content", action="append", default=None)
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--scale", type=float, default=0.0215)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--cfa", default="RGGB")
    ap.add_argument("--shares", default="")
    ap.add_argument("--tolerances", default="", help="restore tolerances to try (PIXEL_SHIFT_RESTORE_TOLERANCE)")
    ap.add_argument("--no-extras", action="store_true", help="only the shipped render and the sweeps")
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",") if s]
    rows = []
    for content in args.content or ["dead_leaves"]:
        row = one_content(content, args.noise, args.scale, args.seed, shares, args.photos, args.cfa,
                          tuple(float(t) for t in args.tolerances.split(",") if t), not args.no_extras)
        rows.append(row)
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{v:18s}" for k, v in row.items()), flush=True)
    if args.json:
        meta = {"noise": args.noise, "scale": args.scale, "seed": args.seed, "cfa": args.cfa}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
