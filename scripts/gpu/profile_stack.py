"""Stage-by-stage profile of an IQ2_XS stack on one device: decode, merge steps per frame, strips, TIFF.

python scripts/gpu/profile_stack.py --device cuda:0 [--scale 1.0 --frames 8]
Prints wall times (the device synchronised around every step): where the stack's time goes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from lab.bench.pipeline import _decode_all, _encode, write_stack_frames
from services.pipeline.ops.align import align_frame, tiles_to_pixels, warp
from services.pipeline.ops.merge import _fixed, demosaic_camera, motion_weights, prepare_reference
from services.pipeline.shot import shot_render_params
from services.pipeline.stack import _normalised, merge_frame_group, merge_params, render_stack_strip
from services.pipeline.transfer import download

T: dict[str, list[float]] = defaultdict(list)
DEVICE = torch.device("cpu")


@contextmanager
def timed(name: str) -> Iterator[None]:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    t0 = time.perf_counter()
    yield
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    T[name].append(time.perf_counter() - t0)


def tiff_steps(img: np.ndarray, tmp: Path) -> None:
    """The TIFF stage's parts, each alone."""
    import cProfile
    import hashlib
    import pstats

    import tifffile

    for workers in (8, 32):
        for _ in range(2):
            with timed(f"tifffile.imwrite to a file (no fsync), {workers} threads"):
                tifffile.imwrite(tmp / "x.tif", img, photometric="rgb", tile=(256, 256), compression="zstd",
                                 compressionargs={"level": 3}, maxworkers=workers)
    size = (tmp / "x.tif").stat().st_size
    data = img.tobytes()[:size]
    with timed("sha256"):
        hashlib.sha256(data).hexdigest()
    with timed("write + fsync"), open(tmp / "x.bin", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    print(f"TIFF {size / 1e6:.1f} MB")
    prof = cProfile.Profile()
    prof.enable()
    _encode(img, tmp, os.cpu_count() or 4)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)


def _profile_merge_steps(mosaics: list[np.ndarray], metas: list, params: object, dev: torch.device,
                         frames: int) -> None:
    """The frame-group merge step by step on the second half of the frames (run twice: the first is warm-up)."""
    half = frames // 2
    for rep in range(2):
        with torch.inference_mode():
            mp = merge_params(params, dev, frames)  # type: ignore[arg-type]
            with timed("prepare_reference (norm + package + pyramid)"):
                ref = prepare_reference(_normalised(mosaics[0], metas[0], dev), mp)
            hh, ww = ref.mosaic.shape
            acc = torch.zeros(4, hh, ww, dtype=torch.int64, device=dev)
            ones = torch.ones(3, hh, ww, dtype=torch.float32, device=dev)
            for i in range(half, frames):
                with timed("upload+normalise"):
                    f = _normalised(mosaics[i], metas[i], dev)
                with timed("demosaic (package, oriented by stack position)"):
                    rgb = demosaic_camera(f, mp, i % 8)
                with timed("align_frame"):
                    flow = align_frame(ref.pyramid, rgb.mean(dim=0), mp.align)
                with timed("tiles_to_pixels + warp bicubic"):
                    moved, valid = warp(rgb, tiles_to_pixels(flow, mp.align.tile_size, (hh, ww)), mode="bicubic")
                with timed("motion_weights"):
                    wt = motion_weights(ref.rgb, moved, ones * valid, mp, level=ref.level,
                                        spread=ref.spread) * valid
                with timed("fixed-point accumulate"):
                    acc[:3] += _fixed(moved * wt)
                    acc[3] += _fixed(wt)
            with timed("download int32 acc"):
                download(acc.to(torch.int32))
        if rep == 0:  # warm-up: keep only the decode lines
            for name in [n for n in T if not n.startswith("decode")]:
                del T[name]


def _profile_align_steps(mosaics: list[np.ndarray], metas: list, params: object, dev: torch.device) -> None:
    """align_frame's parts on one frame (``ALIGN_STEPS=1``), run twice, the second kept."""
    from services.pipeline.ops import align as al

    with torch.inference_mode():
        mp = merge_params(params, dev, len(mosaics))  # type: ignore[arg-type]
        ref = prepare_reference(_normalised(mosaics[0], metas[0], dev), mp)
        grey = demosaic_camera(_normalised(mosaics[1], metas[1], dev), mp, 1).mean(dim=0)
        p = mp.align
        for rep in range(2):
            tag = "" if rep else " (warm-up)"
            with timed(f"align: frame pyramid{tag}"):
                pyr = al.grey_pyramid(grey, len(ref.pyramid))
            top = len(pyr) - 1
            flow = torch.zeros(*al._tile_grid(pyr[top].shape, p.tile_size), 2, dtype=torch.long, device=dev)
            for level in range(top, -1, -1):
                with timed(f"align: search level {level}{tag}"):
                    if level < top:
                        flow = al._upsample_tiles(flow, al._tile_grid(ref.pyramid[level].shape, p.tile_size))
                    radius = p.search_radius if level > 0 else 1
                    flow = al._median3(al._search(ref.pyramid[level], pyr[level], flow, p.tile_size, radius))
            with timed(f"align: refine blurs + gradients{tag}"):
                al._gradients(al._blur(ref.pyramid[0]))
                al._blur(pyr[0])
            with timed(f"align: refine ({p.lk_iterations} iterations, all){tag}"):
                al._refine(ref.pyramid[0], pyr[0], flow.to(torch.float32), p.tile_size, p.lk_iterations)
        for name in [n for n in T if n.endswith("(warm-up)")]:
            del T[name]


def _profile_strips_and_tiff(mosaics: list[np.ndarray], metas: list, params: object, dev: torch.device,
                             frames: int, tmp: Path) -> None:
    half = frames // 2
    h, w = mosaics[0].shape
    group = [(mosaics[i], metas[i]) for i in range(half, frames)]
    for _ in range(2):
        with timed("merge_frame_group (whole, 2nd half)"):
            res = merge_frame_group((mosaics[0], metas[0]), group, dev, stack_size=frames,
                                    positions=range(half, frames), params=params)  # type: ignore[arg-type]
    img = np.empty((h, w, 3), dtype=np.uint16)
    for y0 in range(0, h, 1288):
        y1 = min(h, y0 + 1288)
        with timed("stack strip 1288 rows (2 groups)"):
            img[y0:y1] = render_stack_strip([res, res], y0, y1, params, dev, pixel_shift=False)  # type: ignore[arg-type]
    for _ in range(2):
        with timed("TIFF encode + hash + write + fsync"):
            _encode(img, tmp, os.cpu_count() or 4)
    tiff_steps(img, tmp)


def main() -> None:
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--frames", type=int, default=8)
    args = ap.parse_args()
    from services.pipeline.models.package import configure_cuda_numerics

    configure_cuda_numerics(True)
    dev = DEVICE = torch.device(args.device)
    h, w = int(7296 * args.scale) // 2 * 2, int(6912 * args.scale) // 2 * 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        paths = write_stack_frames(tmp, args.frames, h, w)
        with timed("decode 1 frame (cold)"):
            _decode_all(paths[:1], tmp)
        with timed(f"decode {args.frames} frames (1 spare)"):
            _decode_all(paths, tmp)
        time.sleep(2)  # the spares start
        with timed(f"decode {args.frames} frames (spares)"):
            mosaics, metas = _decode_all(paths, tmp)
        params = shot_render_params(metas[0], mosaics[0])
        _profile_merge_steps(mosaics, metas, params, dev, args.frames)
        if os.environ.get("ALIGN_STEPS") == "1":
            _profile_align_steps(mosaics, metas, params, dev)
            if os.environ.get("ALIGN_ONLY") == "1":
                for name, v in T.items():
                    print(f"  {name:<50} n={len(v):2d} total {sum(v):7.3f} s  mean {sum(v) / len(v):7.3f} s")
                return
        _profile_strips_and_tiff(mosaics, metas, params, dev, args.frames, tmp)
    print(f"{args.frames} frames {w}x{h} on {dev}")
    for name, v in T.items():
        print(f"  {name:<50} n={len(v):2d} total {sum(v):7.3f} s  mean {sum(v) / len(v):7.3f} s")


if __name__ == "__main__":
    main()
