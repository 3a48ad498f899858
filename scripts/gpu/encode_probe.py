"""Probe the CPU encode costs on a host: deflate levels for an 80 MP RGB16 tiled TIFF and the proof resize.

    python scripts/gpu/encode_probe.py --scale 1.0 --threads 16 --json out.json

The image is a smooth scene with edges and mid-level noise (16-bit codes), so compression ratios are those of a
real render, not of a flat or a random image. Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import io
import json
import os
import time

import numpy as np
import torch

from services.export import tiff
from services.export.derive import resize_linear


def scene(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 0.35 + 0.25 * np.sin(x / 211.0) * np.cos(y / 157.0) + 0.15 * ((x // 640 + y // 480) % 2)
    img = np.stack([base, base * 0.9 + 0.05, base * 0.8 + 0.1], axis=-1)
    img += rng.normal(0, 0.004, size=img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 65535 + 0.5).astype(np.uint16)


def time_deflate(img: np.ndarray, level: int, threads: int) -> tuple[float, int]:
    tiff.DEFLATE_LEVEL = level
    t0 = time.perf_counter()
    size = sum(len(b) for b in tiff._deflated_tiles(tiff._tiles([(0, img)], *img.shape[:2]), threads))
    return time.perf_counter() - t0, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json")
    args = ap.parse_args()
    h, w = int(7728 * args.scale) // 2 * 2, int(10304 * args.scale) // 2 * 2
    img = scene(h, w)
    raw = img.nbytes
    rows: list[dict] = []
    for level in (1, 2, 4, 6):
        time_deflate(img, level, args.threads) if level == 1 else None  # warm the pool / page cache once
        ts = [time_deflate(img, level, args.threads) for _ in range(3)]
        rows.append({"what": f"libdeflate {level} + predictor, {args.threads} threads",
                     "s": float(np.median([t for t, _ in ts])), "ratio": raw / ts[0][1]})
    for name, comp in (("zstd 3 (tifffile)", "zstd"),):
        buf = io.BytesIO()
        t0 = time.perf_counter()
        codec, pred, cargs = tiff.tiff_compression(comp)
        import tifffile
        tifffile.imwrite(buf, img, tile=(256, 256), compression=codec, compressionargs=cargs, predictor=pred,
                         maxworkers=args.threads, photometric="rgb")
        rows.append({"what": name, "s": time.perf_counter() - t0, "ratio": raw / buf.tell()})
    for nt in (1, args.threads):
        torch.set_num_threads(nt)
        ts = []
        for _ in range(2):
            t0 = time.perf_counter()
            resize_linear(img, 1600, "srgb")
            ts.append(time.perf_counter() - t0)
        rows.append({"what": f"proof resize 1600 px, CPU, torch threads {nt}", "s": min(ts), "ratio": None})
    if torch.cuda.is_available():
        from services.pipeline.binning import decode_lut as _decode_lut
        lut = _decode_lut("srgb").cuda()
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g = torch.from_numpy(img).cuda(non_blocking=False)
            lin = lut[g.to(torch.int32)].permute(2, 0, 1)[None]
            lin = torch.nn.functional.avg_pool2d(lin, 3)
            out = torch.nn.functional.interpolate(lin, size=(1200, 1600), mode="bicubic", antialias=True)
            out.cpu()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        rows.append({"what": "proof resize 1600 px, GPU incl. upload", "s": min(ts), "ratio": None})
    print(f"{'what':55s} {'s':>8s} {'ratio':>7s}   ({h} x {w} RGB16, {raw / 1e6:.0f} MB)")
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"{r['what']:55s} {r['s']:8.3f} {ratio:>7s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"height": h, "width": w, "threads": args.threads, "cpus": os.cpu_count(), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
