"""GPU host: the worker's tile path as it runs now, without the service: TIFF tiles compressed by nvCOMP from
uint16 rows already on the device (the rendered strip, before its download), then written as a ``.npy`` stream
through the pinned slots (Storage.array_stream + transfer.download_to). Checks every sampled tile inflates to
the rows' predicted samples and the stream equals a plain download; times the 8 strips of an 80 MP frame.

    python scripts/gpu/check_device_tiles.py [--strips 8]
Needs only torch, numpy, pydantic-settings and nvidia-nvcomp (no imagecodecs): a small carry.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from services.pipeline import tiles
from services.pipeline.transfer import download, download_to
from services.storage.local import LocalStorage


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strips", type=int, default=8)
    args = ap.parse_args()
    dev = "cuda:0"
    height, width, rows_per = 10304, 7728, 1288
    gen = torch.Generator(device=dev).manual_seed(0)
    base = torch.linspace(0, 40000, width, device=dev)[None, :, None] + torch.linspace(0, 9000, rows_per, device=dev)[
        :, None, None]
    with tempfile.TemporaryDirectory(prefix="strata-tiles-") as tmp:
        storage = LocalStorage(Path(tmp))
        times: dict[str, float] = {"compress": 0.0, "stream write": 0.0}
        for rnd in range(2):  # the first warms
            totals = dict.fromkeys(times, 0.0)
            for i in range(args.strips):
                y0 = i * rows_per
                noise = torch.randn((rows_per, width, 3), device=dev, generator=gen) * 300
                rows = (base + noise).clamp(0, 65535).to(torch.uint16)  # what to_uint16 hands over
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                blob, index = tiles.device_tile_streams(rows, y0, height, dev, 0)
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                key = f"p0/strip_{rnd}_{i:03d}_tiles.npy"
                with storage.array_stream(key, tuple(blob.shape), np.uint8) as f:
                    download_to(blob, f)
                t2 = time.perf_counter()
                totals["compress"] += t1 - t0
                totals["stream write"] += t2 - t1
                if rnd == 0 and i in (0, args.strips - 1):
                    host = rows.cpu().numpy()
                    stored = storage.load_array(key)
                    assert np.array_equal(stored, download(blob)), "the stream differs from a plain download"
                    tiles.check_streams(stored, index, host, y0, sample=64)
            times = totals
        print(f"{args.strips} strips of {rows_per} x {width} RGB16 (an 80 MP frame): nvCOMP tiles from device rows "
              f"{times['compress']:.3f} s, stream write through the pinned slots {times['stream write']:.3f} s; "
              "sampled tiles inflate exact, streams equal a plain download")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
