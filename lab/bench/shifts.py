"""The pixel-shift check's speed: the global shift of each frame of a 4-frame stack against its reference (phase
correlation on the central window, :func:`services.pipeline.stack.frame_shifts`), on the coordinator's CPU with the
coordinator's torch threads. Every 4-frame stack pays it during its ingest ("planned in" in the coordinator's log).

The frames are synthetic 50 MP IQ2_XS mosaics in a one-pixel pattern (textured, 4 x 4 blocks of a smoothed random
field), so the check must also find the pattern. Prints a table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from lab.args import positive_float
from lab.quality.report import machine_info
from services.pipeline.stack import frame_shifts, pixel_shift_offsets

IQ2XS_H, IQ2XS_W = 6208, 8280
PATTERN = ((0, 0), (0, 1), (1, 1), (1, 0))


def _frames(scale: float, seed: int) -> list[Any]:
    from scipy.ndimage import gaussian_filter

    h, w = int(IQ2XS_H * scale) // 4 * 4, int(IQ2XS_W * scale) // 4 * 4
    field = gaussian_filter(np.random.default_rng(seed).random((h // 4, w // 4)), 1.0)
    base = np.kron((field * 40000 + 2000).astype(np.uint16), np.ones((4, 4), np.uint16))
    meta = SimpleNamespace(black_levels=(0.0, 0.0, 0.0, 0.0), white_level=65535.0, cfa="RGGB")
    return [(np.ascontiguousarray(np.roll(base, o, (0, 1))), meta) for o in PATTERN]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="strata bench shifts", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=positive_float, default=1.0, help="linear scale of the 50 MP frames")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (a coordinator's: cores / slots)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    frames = _frames(args.scale, args.seed)
    found = pixel_shift_offsets(frame_shifts(frames[0], frames))  # warm-up, and the pattern must be found
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        shifts = frame_shifts(frames[0], frames)
        times.append(time.perf_counter() - t0)
    result = {"frames": len(frames), "shape": list(frames[0][0].shape), "threads": args.threads,
              "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
              "shifts": shifts, "pattern_found": found == [tuple(o) for o in PATTERN], "machine": machine_info("cpu")}
    print(f"{'frames':>6} {'shape':>12} {'threads':>7} {'median s':>9} {'min-max s':>13}  pattern found")
    print(f"{len(frames):>6} {'x'.join(map(str, result['shape'])):>12} {args.threads:>7} {result['median_s']:9.3f} "
          f"{result['min_s']:6.3f}-{result['max_s']:.3f}  {result['pattern_found']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["pattern_found"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
