"""GPU host: where the GPU TIFF tiles' time goes for an 80 MP RGB16 strip (services.pipeline.tiles), step by step
with CUDA synchronisation between steps, summed over the frame's chunks. Prints a table.

    python scripts/gpu/profile_tiles.py [--level 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_probe import scene  # noqa: E402

from services.pipeline import tiles  # noqa: E402
from services.pipeline.transfer import download, upload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", type=int, default=1)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    h, w = 7728, 10304
    img = scene(h, w)
    codec = tiles._codec(0, args.level)
    totals: dict[str, float] = {}

    def step(name: str, t0: float) -> float:
        torch.cuda.synchronize(dev)
        now = time.perf_counter()
        totals[name] = totals.get(name, 0.0) + now - t0
        return now

    for rnd in range(2):  # the first warms
        totals.clear()
        rows_all = tiles.tile_rows_in(0, h, h)
        for first in range(rows_all.start, rows_all.stop, tiles._CHUNK):
            chunk = range(first, min(first + tiles._CHUNK, rows_all.stop))
            top, bottom = chunk.start * tiles.TILE_H, min(chunk.stop * tiles.TILE_H, h)
            t = time.perf_counter()
            gpu = upload(img[top:bottom], dev)
            t = step("upload (host -> device)", t)
            tiled = tiles._tiled(gpu.to(torch.int32), chunk, top)
            t = step("tile + predictor (int32)", t)
            data = tiles._to_bytes(tiled).contiguous()
            t = step("to bytes", t)
            checks = tiles._adler32(data)
            t = step("Adler-32", t)
            flat, sizes = tiles._encode_chunk(codec, data)
            t = step("nvCOMP deflate + sizes", t)
            packed = tiles.zlib_pack(flat, sizes, checks)
            t = step("zlib framing", t)
            download(packed)
            step("device -> host (pinned slots)", t)
        if rnd:
            print(f"{'step':<28} {'s':>7}   (80 MP RGB16, level {args.level}, {'; '.join(tiles.ENCODE_PATH)})")
            for k, v in totals.items():
                print(f"{k:<28} {v:7.3f}")
            print(f"{'total':<28} {sum(totals.values()):7.3f}")


if __name__ == "__main__":
    main()
