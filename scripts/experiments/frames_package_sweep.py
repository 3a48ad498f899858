"""Which package a stack's frames should render through, by how their shifts sample the scene (issue 17, session 45).

For every combination of content, seed, largest shift and frame count, a synthetic stack (``strata bench stack``'s
synthesis, native resolution by default) is merged and rendered in-process on the CPU as the service does, once with
the frames through the companion package (``strata_jdd_v2_frames``) and once through the shot's package
(``strata_jdd_v2``); prints both PSNRs with the frames' sampling concentration (CFA, grid: the measured shifts,
``stack.sampling_concentration``) and which one the service's rule picks (``stack.samples_in_one_place``), then the
loss against picking the better package every time: the rule's, always the companion's, always the shot package's.

    python scripts/experiments/frames_package_sweep.py --content photo:036 --content dead_leaves --seeds 3,4 \\
        --max-shifts 0.25,0.5,0.75,1.0,1.5 --frames 4,8 --noise 0.002 [--scale 0.043] [--json OUT.json]

Numbers: docs/QUALITY.md, "Stacks shifted by up to half a pixel".
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import tifffile

from lab.quality.stack_bench import BORDER, _decoded, _merge, psnr
from lab.synth.stack_synth import synthesize_stack
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import (
    frame_shifts,
    render_rgb,
    samples_in_one_place,
    sampling_concentration,
    stack_noise_factors,
    stack_params,
)

PACKAGES = {"companion": "strata_jdd_v2_frames.strata", "shot": "strata_jdd_v2.strata"}


def one_stack(content: str, seed: int, max_shift: float, frames: int, noise: float, scale: float,
              photos: Path) -> dict[str, object]:
    """Both renders of one synthetic stack, scored against its ground truth."""
    work = Path(tempfile.mkdtemp(prefix="frames-package-"))
    shot = synthesize_stack(work, frames=frames, scale=scale, seed=seed, noise=noise, content=content,
                            photos_dir=photos, max_shift=max_shift)
    decoded = [_decoded(p, work / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
    truth = tifffile.imread(shot.ground_truth)
    shifts = frame_shifts(decoded[0], decoded)
    params = stack_params(shot_render_params(decoded[0][1], decoded[0][0]), frames, shifts)
    inner = np.zeros(truth.shape[:2], bool)
    inner[BORDER:-BORDER, BORDER:-BORDER] = True
    row: dict[str, object] = {"content": content, "seed": seed, "max_shift": max_shift, "frames": frames,
                              "noise": noise, "concentration": sampling_concentration(shifts),
                              "rule": "shot" if samples_in_one_place(shifts) else "companion"}
    for name, package in PACKAGES.items():
        p = replace(params, frames_model=package)
        fused = _merge(decoded[0], decoded, p, 1, "cpu", None, {})
        row[name] = psnr(render_rgb(fused, p, "cpu", stack_noise_factors(False)), truth, inner)
    return row


def losses(rows: list[dict[str, object]]) -> dict[str, tuple[float, float]]:
    """(sum, worst) dB lost against the better package, per choice: the rule, always one package."""
    out = {}
    for name, pick in (("rule", lambda r: r["rule"]), ("always companion", lambda r: "companion"),
                       ("always shot", lambda r: "shot")):
        lost = [max(float(r["companion"]), float(r["shot"])) - float(r[pick(r)]) for r in rows]  # type: ignore[arg-type]
        out[name] = (sum(lost), max(lost))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--content", action="append", default=None)
    ap.add_argument("--seeds", default="3")
    ap.add_argument("--max-shifts", default="0.25,0.5,0.75,1.0,1.5")
    ap.add_argument("--frames", default="4,8")
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--scale", type=float, default=0.043)
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    grid = itertools.product(args.content or ["dead_leaves"], [int(s) for s in args.seeds.split(",")],
                             [float(s) for s in args.max_shifts.split(",")], [int(n) for n in args.frames.split(",")])
    for content, seed, max_shift, frames in grid:
        r = one_stack(content, seed, max_shift, frames, args.noise, args.scale, args.photos)
        rows.append(r)
        cfa, on_grid = r["concentration"]  # type: ignore[misc]
        print(f"{content:18s} seed {seed} shifts <= {max_shift:4.2f} px, {frames} frames: concentration CFA {cfa:.3f} "
              f"grid {on_grid:.3f}; companion {r['companion']:.2f}, shot's {r['shot']:.2f} dB; rule: {r['rule']}",
              flush=True)
    for name, (total, worst) in losses(rows).items():
        print(f"{name:18s} loses {total:6.2f} dB in all over {len(rows)} stacks, at most {worst:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
