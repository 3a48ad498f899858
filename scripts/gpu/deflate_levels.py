"""GPU host: nvCOMP's deflate algorithm types (``STRATA_GPU_DEFLATE_LEVEL`` 0-5) on an 80 MP RGB16 frame's TIFF tiles:
device time and compressed size, beside libdeflate 1 on the CPU (the writer's fallback). Two scenes: the encode
probe's synthetic one at a low and a mid noise, and (``--tiff``) any 16-bit RGB TIFF, e.g. a rendered bench frame.
Prints a table and writes JSON.

    python scripts/gpu/deflate_levels.py [--tiff out.tif] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.pipeline import tiles  # noqa: E402
from services.pipeline.transfer import upload  # noqa: E402


def scene(h: int, w: int, noise: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 0.35 + 0.25 * np.sin(x / 211.0) * np.cos(y / 157.0) + 0.15 * ((x // 640 + y // 480) % 2)
    img = np.stack([base, base * 0.9 + 0.05, base * 0.8 + 0.1], axis=-1)
    img += rng.normal(0, noise, size=img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 65535 + 0.5).astype(np.uint16)


def time_level(gpu: torch.Tensor, level: int) -> tuple[float, int]:
    h = gpu.shape[0]
    tiles.device_tile_streams(gpu, 0, h, "cuda:0", level)  # warm (codec, kernels)
    best = float("inf")
    size = 0
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        blob, _ = tiles.device_tile_streams(gpu, 0, h, "cuda:0", level)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        size = int(blob.numel())
    return best, size


def cpu_size(img: np.ndarray, rows: int = 1024) -> float:
    """libdeflate 1's ratio on the first ``rows`` rows (the CPU writer's path), as compressed / raw."""
    blob, _ = tiles.cpu_tile_streams(img[:rows], 0, rows, level=1)
    return blob.size / img[:rows].nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiff", action="append", default=[])
    ap.add_argument("--json")
    args = ap.parse_args()
    h, w = 7728, 10304
    images = {"synthetic, noise 0.001": scene(h, w, 0.001), "synthetic, noise 0.004": scene(h, w, 0.004)}
    for path in args.tiff:
        import tifffile

        images[Path(path).name] = tifffile.imread(path)
    rows = []
    for name, img in images.items():
        gpu = upload(np.ascontiguousarray(img), torch.device("cuda:0"))
        cpu_ratio = cpu_size(img)
        for level in range(6):
            try:
                seconds, size = time_level(gpu, level)
            except Exception as exc:  # noqa: BLE001 - a type this nvCOMP lacks
                rows.append({"image": name, "level": level, "error": str(exc)[:200]})
                continue
            rows.append({"image": name, "level": level, "seconds": round(seconds, 4), "bytes": size,
                         "ratio": round(size / img.nbytes, 4), "cpu_libdeflate1_ratio_1024_rows": round(cpu_ratio, 4)})
        del gpu
        torch.cuda.empty_cache()
    print(f"{'image':<28} {'level':>5} {'seconds':>8} {'MB':>8} {'of raw':>7} {'CPU libdeflate 1':>17}")
    for r in rows:
        if "error" in r:
            print(f"{r['image']:<28} {r['level']:>5} error: {r['error']}")
        else:
            print(f"{r['image']:<28} {r['level']:>5} {r['seconds']:8.3f} {r['bytes'] / 1e6:8.1f} {r['ratio']:7.3f} "
                  f"{r['cpu_libdeflate1_ratio_1024_rows']:17.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
