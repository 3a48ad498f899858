"""Where a 4-shot pixel-shift stack's worker time goes (the service's stack4 scenario), step by step.

python scripts/gpu/profile_pixel_shift.py --device cuda:0 [--scale 1.0] [--json F]

Writes four 50 MP one-pixel-shifted IQ2_XS frames, decodes them, then runs what the GPU worker runs (the frame
group into a fresh memory-mapped ``.npy`` with its prefault, then the strip from the accumulator on the device, as
with resident accumulators) three times, the last two kept. Each step of interest is wrapped with a
device-synchronised timer, so the table says where the wall time goes (the sync adds a little).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.bench.pipeline import _decode_all, procedural_mosaic, write_frame

T: dict[str, list[float]] = defaultdict(list)
DEVICE = torch.device("cpu")
_DEPTH = [0]


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def wrap(module: Any, name: str, label: str | None = None) -> None:
    """Replace ``module.name`` by a timed version (outermost calls only, nested ones counted apart)."""
    fn: Callable[..., Any] = getattr(module, name)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _sync()
        t0 = time.perf_counter()
        _DEPTH[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            _sync()
            T[("  " * _DEPTH[0]) + (label or name)].append(time.perf_counter() - t0)

    setattr(module, name, timed)


def _instrument() -> None:
    from services.pipeline import stack
    from services.pipeline.ops import merge

    for mod, name in ((merge, "prepare_reference"), (merge, "motion_weights"), (merge, "integer_shift"),
                      (merge, "_fixed"), (stack, "_normalised"), (stack, "prepare_reference"),
                      (stack, "pixel_shift_accumulate"), (stack, "download"), (stack, "fuse_rows"),
                      (stack, "_remosaic_enhance"), (stack, "_restore_measured"), (stack, "sharpen"),
                      (stack, "encode_spaces")):
        wrap(mod, name)


def _frames(tmp: Path, h: int, w: int) -> list[Path]:
    paths = []
    for k, shift in enumerate(((0, 0), (0, 1), (1, 1), (1, 0))):
        p = tmp / f"f{k}.dng"
        write_frame(p, procedural_mosaic(h, w, 7, (float(shift[0]), float(shift[1]))), "IQ2_XS")  # type: ignore[arg-type]
        paths.append(p)
    return paths


def _run(tmp: Path, mosaics: list[np.ndarray], metas: list[Any], rep: int) -> None:
    from services.pipeline.shot import shot_render_params
    from services.pipeline.stack import (
        frame_shifts,
        merge_frame_group,
        pixel_shift_offsets,
        render_stack_strip_spaces,
    )
    from services.pipeline.transfer import prefault

    t0 = time.perf_counter()
    files = []
    for i, m in enumerate(mosaics):  # what the worker loads: the decoded frames as .npy in storage
        np.save(tmp / f"m{rep}_{i}.npy", m)
        files.append(tmp / f"m{rep}_{i}.npy")
    loaded = [np.load(f, mmap_mode="r") for f in files]
    T["(load 4 frames, page cache)"].append(time.perf_counter() - t0)
    params = shot_render_params(metas[0], loaded[0])
    t0 = time.perf_counter()
    pairs = list(zip(loaded, metas, strict=True))
    offsets = pixel_shift_offsets(frame_shifts(pairs[0], pairs))
    T["(coordinator: pixel-shift check)"].append(time.perf_counter() - t0)
    assert offsets is not None, "not detected as pixel shift"
    h, w = loaded[0].shape
    held: list[torch.Tensor] = []
    _sync()
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(tmp / f"acc{rep}.npy", mode="w+", dtype=np.int32, shape=(6, h, w))
    merge_frame_group(pairs[0], pairs, DEVICE, stack_size=4,
                      positions=range(4), params=params, pixel_shift=offsets, out=out, out_ready=prefault(out),
                      keep=held.append)
    out.flush()
    _sync()
    T["FRAME GROUP (merge_frame_group into a fresh map)"].append(time.perf_counter() - t0)
    del out
    t0 = time.perf_counter()
    rows = render_stack_strip_spaces(held, 0, h, params, DEVICE, pixel_shift=True)
    _sync()
    T["STRIP (render_stack_strip_spaces, whole frame, host rows)"].append(time.perf_counter() - t0)
    assert rows[0].shape == (h, w, 3)


def main() -> None:
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    DEVICE = torch.device(args.device)
    h, w = int(7296 * args.scale) // 2 * 2, int(6912 * args.scale) // 2 * 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        mosaics, metas = _decode_all(_frames(tmp, h, w), tmp)
        _instrument()
        for rep in range(3):
            if rep == 1:
                T.clear()
            _run(tmp, mosaics, metas, rep)
    print(f"pixel-shift stack, 4 x {w}x{h} on {DEVICE} (mean of the 2 warm runs)")
    for name, v in T.items():
        print(f"  {name:<62} n={len(v):2d} total/run {sum(v) / 2:7.3f} s  each {sum(v) / len(v):7.4f} s")
    if args.json:
        args.json.write_text(json.dumps({"device": str(DEVICE), "size": [h, w],
                                         "steps": {k.strip(): {"n": len(v), "per_run_s": sum(v) / 2}
                                                   for k, v in T.items()}}, indent=1))


if __name__ == "__main__":
    main()
