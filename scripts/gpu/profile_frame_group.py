"""Where an IQ2_XS stack's frame group spends its GPU time: torch.profiler's table of the real merge.

python3 scripts/gpu/profile_frame_group.py --device cuda:0 [--frames 8 --scale 1.0 --json OUT.json]

Runs :func:`services.pipeline.stack.merge_group_tensor` (what a GPU worker runs for a frame group) on synthetic
50 MP frames shifted at random by up to 1.5 px, with the shot's parameters as the coordinator derives them
(``shot_render_params`` + ``stack_params`` from the measured shifts): a warm-up, three timed runs (wall, device
synchronised), then one run under torch.profiler. Prints the operators by device time (with input shapes) and the
device's busy share of the profiled run's wall time (kernel time / wall: how much the host's launches and syncs
leave the GPU idle). Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.bench.pipeline import _decode_all, write_stack_frames
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import frame_shifts, merge_group_tensor, stack_params


def _frames(tmp: Path, frames: int, h: int, w: int) -> tuple[list[np.ndarray], list[Any]]:
    return _decode_all(write_stack_frames(tmp, frames, h, w), tmp)


def profiled(run: Callable[[], object], sync: Callable[[], None], dev: torch.device, walls: list[float], top: int,
             out: Path | None, frames: int, shape: tuple[int, int]) -> None:
    """One run of ``run`` under torch.profiler: the operators by device time, with and without their shapes."""
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities, record_shapes=True) as prof:
        run()
        sync()
    wall = time.perf_counter() - t0
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages(group_by_input_shape=True) if getattr(e, key) > 0]
    events.sort(key=lambda e: -getattr(e, key))
    busy = sum(getattr(e, key) for e in events) / 1e6
    print(f"profiled run: wall {wall:.3f} s, {'device' if cuda else 'cpu'} time {busy:.3f} s (operators and their "
          f"kernels both count: read the kernels' lines)")
    rows = []
    print(f"{'op':<44} {'shapes':<58} {'ms':>8} {'calls':>6}")
    for e in events[:top]:
        ms = getattr(e, key) / 1e3
        print(f"{e.key[:44]:<44} {str(e.input_shapes)[:58]:<58} {ms:8.2f} {e.count:6d}")
        rows.append({"op": e.key, "shapes": str(e.input_shapes), "ms": ms, "calls": e.count})
    kernels = sorted((e for e in prof.key_averages() if getattr(e, key) > 0), key=lambda e: -getattr(e, key))
    print(f"\n{'op or kernel (all shapes)':<100} {'ms':>8} {'calls':>6}")
    for e in kernels[:top]:
        print(f"{e.key[:100]:<100} {getattr(e, key) / 1e3:8.2f} {e.count:6d}")
    if out:
        out.write_text(json.dumps({"device": str(dev), "frames": frames, "shape": list(shape), "walls_s": walls,
                                   "profiled_wall_s": wall, "ops": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    h, w = int(7296 * args.scale) // 2 * 2, int(6912 * args.scale) // 2 * 2

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    with tempfile.TemporaryDirectory() as d:
        mosaics, metas = _frames(Path(d), args.frames, h, w)
    frames = list(zip(mosaics, metas, strict=True))
    params = shot_render_params(metas[0], mosaics[0])
    params = stack_params(params, args.frames, frame_shifts(frames[0], frames))
    print(f"{args.frames} frames {w}x{h} on {dev}; frames' package {params.frames_model}, warp "
          f"{'raw merge' if params.raw_merge else 'no raw merge'}")

    def run() -> torch.Tensor:
        return merge_group_tensor(frames[0], frames, dev, stack_size=args.frames, positions=list(range(args.frames)),
                                  params=params)

    run()
    sync()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        sync()
        walls.append(time.perf_counter() - t0)
    print("merge_group_tensor wall (s): " + " ".join(f"{t:.3f}" for t in walls))
    if torch.cuda.is_available() and cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB")

    profiled(run, sync, dev, walls, args.top, args.json, args.frames, (h, w))


if __name__ == "__main__":
    main()
