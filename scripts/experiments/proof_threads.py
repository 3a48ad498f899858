"""Proof resizes running at once in one process (a coordinator's finalize threads) against torch's CPU thread count:
`python scripts/experiments/proof_threads.py [CONCURRENT ...]` prints, for torch thread counts from 1 up to the
cores, the seconds until N proofs started at once are all done (N = 1, 2, 4 or the numbers given)."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from services.export.derive import box_factor, fit_long_edge, resize_linear
from services.pipeline.binning import binned


def main() -> None:
    concurrent = [int(a) for a in sys.argv[1:]] or [1, 2, 4]
    h, w = 10304, 7728
    out_h, out_w = fit_long_edge(h, w, 1600)
    k = box_factor(h, w, out_h, out_w)
    rows = np.random.default_rng(0).integers(0, 65535, (h // 4, w, 3), dtype=np.uint16)  # a quarter: bins only
    bins = binned(rows, 0, k, "srgb")
    full = np.broadcast_to(np.zeros((1, w, 3), np.uint16), (h, w, 3))  # the bands' shape; their rows are not read
    pre = {k: [(0, np.concatenate([bins] * 4)[: h // k])]}
    cores = os.cpu_count() or 1
    print(f"{cores} cores; proof {out_w}x{out_h} from bins {w // k}x{h // k}")
    print("torch threads  " + "  ".join(f"{n} at once" for n in concurrent))
    for threads in sorted({1, 2, max(1, cores // 4), max(1, cores // 2), cores}):
        torch.set_num_threads(threads)
        cells = []
        for n in concurrent:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda _: resize_linear([(0, full)], 1600, "srgb", 0.4, pre), range(n)))  # warm
                t = time.perf_counter()
                list(pool.map(lambda _: resize_linear([(0, full)], 1600, "srgb", 0.4, pre), range(3 * n)))
                cells.append((time.perf_counter() - t) / 3)
        print(f"{threads:13d}  " + "  ".join(f"{c:9.3f}" for c in cells))


if __name__ == "__main__":
    main()
