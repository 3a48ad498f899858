"""How far are the stacks' global shifts from the truth? (session 49: pixel-shift patterns went undetected)

For each content, a synthetic stack (``strata bench stack``'s synthesis: a 4-shot one-pixel pixel-shift pattern, or
8 frames at random shifts up to 1.5 px) is decoded by LibRaw and its global shifts measured as the coordinator
measures them (:func:`services.pipeline.stack.frame_shifts`). Prints, per content, the largest error of any frame's
shift (px) and whether the pixel-shift pattern is found, and writes JSON.

    python scripts/experiments/shift_accuracy.py --scale 0.0215 --noise 0.002 --content photo:039 ... --json OUT
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from lab.quality.stack_bench import _decoded
from lab.synth.stack_synth import synthesize_stack
from services.pipeline.stack import frame_shifts, pixel_shift_offsets


def measure(content: str, pixel_shift: bool, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        shot = synthesize_stack(Path(tmp) / "s", frames=4 if pixel_shift else 8, scale=args.scale, seed=args.seed,
                                noise=args.noise, content=content, photos_dir=args.photos, pixel_shift=pixel_shift)
        frames = [_decoded(p, Path(tmp) / f"raw_{i:02d}.npy") for i, p in enumerate(shot.files)]
    shifts = frame_shifts(frames[0], frames)
    error = float(np.abs(np.asarray(shifts) - np.asarray(shot.shifts)).max())
    row: dict[str, object] = {"content": content, "case": "pixel shift" if pixel_shift else "8 frames",
                              "max_error_px": round(error, 3), "shifts": shifts}
    if pixel_shift:
        row["pattern_found"] = pixel_shift_offsets(shifts) is not None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.0215)
    ap.add_argument("--noise", type=float, default=0.002)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--content", action="append", default=None)
    ap.add_argument("--photos", type=Path, default=Path("../shared/data/photos"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [measure(c, ps, args) for c in args.content or ["dead_leaves"] for ps in (True, False)]
    for row in rows:
        found = f"  pattern found: {row['pattern_found']}" if "pattern_found" in row else ""
        print(f"{row['content']:<20} {row['case']:<12} max error {row['max_error_px']:.3f} px{found}")
    if args.json:
        args.json.write_text(json.dumps({"scale": args.scale, "noise": args.noise, "seed": args.seed, "rows": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
