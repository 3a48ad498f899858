"""Time write_tiff of an 80 MP frame from pre-made deflate tile streams (the GPU path's finalize) on this CPU:
`python scripts/experiments/tiff_write_pretiled.py [SCALE] [--profile]` (three writes; the third profiled)."""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from services.export.tiff import write_tiff
from services.pipeline import tiles
from services.storage.local import LocalStorage


def main() -> None:
    scale = float(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 1.0
    h, w = int(10304 * scale) // 2 * 2, int(7728 * scale) // 2 * 2
    rng = np.random.default_rng(0)
    rows = (rng.integers(0, 4000, (h, w, 3)) + np.linspace(0, 30000, w)[None, :, None]).astype(np.uint16)
    t = time.perf_counter()
    blob, index = tiles.cpu_tile_streams(rows, 0, h, level=1)
    print(f"tiles made in {time.perf_counter() - t:.1f}s, {blob.nbytes / 1e6:.0f} MB, {len(index) - 5} tiles")
    storage = LocalStorage(Path(tempfile.mkdtemp(dir="/tmp")))
    for i in range(3):
        profile = cProfile.Profile() if i == 2 and "--profile" in sys.argv else None
        t = time.perf_counter()
        if profile:
            profile.enable()
        _, n = write_tiff(storage, f"out{i}.tif", [(0, rows)], pretiled=[(blob, index)], threads=2)
        if profile:
            profile.disable()
        print(f"write_tiff {time.perf_counter() - t:.3f}s {n / 1e6:.0f} MB")
        if profile:
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
