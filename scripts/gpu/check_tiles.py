"""GPU host: check and time the TIFF tiles nvCOMP compresses (services.pipeline.tiles) on an 80 MP RGB16 render.

    python scripts/gpu/check_tiles.py --json out.json

Per nvCOMP deflate level: time for the whole frame (host rows in, streams on the host out), compression ratio,
a sample of tiles inflated by zlib and compared; then a whole TIFF written from the stored tiles (the finalize
step) and read back by tifffile, compared pixel for pixel. Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_probe import scene  # noqa: E402

from services.export.tiff import write_tiff  # noqa: E402
from services.pipeline import tiles  # noqa: E402
from services.storage.local import LocalStorage  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    from nvidia import nvcomp  # type: ignore[import-not-found]

    print("nvcomp", nvcomp.__version__, "cuda", nvcomp.__cuda_version__, torch.cuda.get_device_name(0))
    h, w = int(7728 * args.scale) // 2 * 2, int(10304 * args.scale) // 2 * 2
    img = scene(h, w)
    rows: list[dict] = []
    containers = {}
    for level in (0, 1, 2, 4):
        tiles.gpu_tile_streams(img[:1024], 0, h, "cuda:0", level)  # warm the codec
        print(f"level {level}: streams came back through {'; '.join(tiles.ENCODE_PATH)}", flush=True)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            blob, index = tiles.gpu_tile_streams(img, 0, h, "cuda:0", level)
            ts.append(time.perf_counter() - t0)
        tiles.check_streams(blob, index, img, 0, sample=64)
        containers[level] = (blob, index)
        rows.append({"level": level, "s": float(np.median(ts)), "ratio": img.nbytes / blob.size,
                     "tiles": len(index) - tiles.HEADER - 1})
    with tempfile.TemporaryDirectory() as tmp:
        storage = LocalStorage(Path(tmp))
        for level in (2,):
            t0 = time.perf_counter()
            write_tiff(storage, "gpu.tif", [(0, img)], compression="deflate", pretiled=[containers[level]])
            wt = time.perf_counter() - t0
            back = tifffile.imread(Path(tmp) / "gpu.tif")
            assert np.array_equal(back, img), "the TIFF from GPU tiles does not read back exact"
            cut = h // 3 // 2 * 2  # two strips, the boundary off the tile grid: the straddling row on the CPU
            parts = [tiles.gpu_tile_streams(img[:cut], 0, h, "cuda:0", level),
                     tiles.gpu_tile_streams(img[cut:], cut, h, "cuda:0", level)]
            t0 = time.perf_counter()
            write_tiff(storage, "two.tif", [(0, img[:cut]), (cut, img[cut:])], compression="deflate", pretiled=parts)
            wt2 = time.perf_counter() - t0
            assert np.array_equal(tifffile.imread(Path(tmp) / "two.tif"), img), "two-strip TIFF differs"
            t0 = time.perf_counter()
            write_tiff(storage, "cpu.tif", [(0, img)], compression="deflate")
            wc = time.perf_counter() - t0
    print(f"{'nvCOMP level':>12s} {'s':>7s} {'ratio':>7s}   ({h} x {w} RGB16, {img.nbytes / 1e6:.0f} MB, "
          f"{rows[0]['tiles']} tiles)")
    for r in rows:
        print(f"{r['level']:>12d} {r['s']:7.3f} {r['ratio']:7.3f}")
    print(f"TIFF from GPU tiles written (hash, fsync) {wt:.3f} s; two strips {wt2:.3f} s; CPU libdeflate {wc:.3f} s; "
          "all read back exact")
    if args.json:
        Path(args.json).write_text(json.dumps({"height": h, "width": w, "levels": rows, "write_from_tiles_s": wt,
                                               "write_two_strips_s": wt2, "write_cpu_s": wc}, indent=1))


if __name__ == "__main__":
    main()
