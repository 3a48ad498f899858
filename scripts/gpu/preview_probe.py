"""GPU host (or any host): where the fast preview's binning spends its time on an 80 MP mosaic.

    python scripts/gpu/preview_probe.py

Times services.pipeline.preview.bin_mosaic on a memory-mapped .npy (as the coordinator reads it) and on an
in-memory copy, for 1, 4 and all threads; and the final preview (strips_preview) of an 80 MP render. Prints a
table; medians of 5."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from services.pipeline.preview import bin_mosaic, strips_preview


def _time(fn, n: int = 5) -> float:  # type: ignore[no-untyped-def]
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    rng = np.random.default_rng(0)
    mosaic = rng.integers(512, 16000, (10304, 7728), dtype=np.uint16)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw.npy"
        np.save(path, mosaic)
        print(f"cores {os.cpu_count()}")
        for threads in (1, 4, 8, os.cpu_count() or 1):
            mapped = _time(lambda t=threads: bin_mosaic(np.load(path, mmap_mode="r"), 3, threads=t))
            memory = _time(lambda t=threads: bin_mosaic(mosaic, 3, threads=t))
            print(f"bin_mosaic threads {threads:2d}: mapped {mapped * 1000:7.1f} ms  in memory {memory * 1000:7.1f} ms")
        load = _time(lambda: np.load(path))
        print(f"np.load into memory {load * 1000:.1f} ms")
    render = rng.integers(0, 65535, (10304, 7728, 3), dtype=np.uint16)
    bands = [(i * 1288, render[i * 1288 : (i + 1) * 1288]) for i in range(8)]
    for threads in (1, os.cpu_count() or 1):
        seconds = _time(lambda t=threads: strips_preview(bands, threads=t), 3)
        print(f"strips_preview threads {threads:2d}: {seconds * 1000:.1f} ms")


if __name__ == "__main__":
    main()
