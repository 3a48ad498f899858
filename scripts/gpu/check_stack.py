"""GPU correctness check for stacks (run on the GPU host): 1 vs 2 vs 4 frame groups fuse to the same bits, and
stack strips (each fusing its own rows on the GPU) stitch to the whole-image render (CPU fuse) exactly; with
``--other-device``, groups merged there (as a second worker would) give the same bits as on ``--device``.

    python3 scripts/gpu/check_stack.py --device cuda:0 --other-device cuda:1 --scale 0.2
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from lab.synth.stack_synth import synthesize_stack
from services.jobs.planner import plan_frame_groups, plan_strips
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import fuse_groups, merge_frame_group, render_rgb, render_stack_strip, stack_noise_factors
from services.raw.decode import decode_raw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--other-device", default=None, help="a second device that merges the same groups")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shot = synthesize_stack(Path(tmp), frames=args.frames, scale=args.scale, seed=11, moving_object=True)
        frames = []
        for i, path in enumerate(shot.files):
            meta = decode_raw(path, Path(tmp) / f"raw_{i}.npy")
            frames.append((np.load(Path(tmp) / f"raw_{i}.npy"), meta))
    params = replace(shot_render_params(frames[0][1], frames[0][0]), frames=len(frames))
    by_groups = {}
    for n in (1, 2, 4):
        groups = [merge_frame_group(frames[0], [frames[i] for i in g], args.device, params=params,
                                    stack_size=len(frames), positions=g) for g in plan_frame_groups(len(frames), n)]
        by_groups[n] = groups
        same = all(np.array_equal(a, b) for a, b in zip(fuse_groups(groups), fuse_groups(by_groups[1]), strict=True))
        print(f"{n} group(s): fused stack identical to 1 group: {same}")
    if args.other_device:
        other = [merge_frame_group(frames[0], [frames[i] for i in g], args.other_device, params=params,
                                   stack_size=len(frames), positions=g) for g in plan_frame_groups(len(frames), 2)]
        same = all(np.array_equal(a, b) for a, b in zip(other, by_groups[2], strict=True))
        print(f"2 groups merged on {args.other_device}: accumulators identical to {args.device}: {same}")
    whole = render_rgb(fuse_groups(by_groups[2]), params, args.device, stack_noise_factors(False))
    h = whole.shape[0]
    strips = [render_stack_strip(by_groups[2], y0, y1, params, args.device, pixel_shift=False)
              for y0, y1 in plan_strips(h, 5)]
    diff = np.abs(np.concatenate(strips).astype(np.int64) - whole.astype(np.int64)).max()
    print(f"stack strips vs whole render on {args.device}: max diff {diff} LSB")


if __name__ == "__main__":
    main()
