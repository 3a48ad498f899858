"""GPU host: what writing an 80 MP frame's 387 MB TIFF costs on this host's disk, by part: SHA-256 alone, the write
through the storage writer with and without its early syncs (STRATA_EARLY_SYNC_S), and with the hash beside the
write in 16 MB chunks (as a worker writes its TIFF from the pinned slots). Prints a table.

    python scripts/gpu/write_probe.py [--dir /tmp] [--mb 387]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from services.storage.local import LocalStorage

CHUNK = 16 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--mb", type=int, default=387)
    args = ap.parse_args()
    data = np.random.default_rng(0).integers(0, 255, args.mb << 20, dtype=np.uint8)
    view = memoryview(data)
    t0 = time.perf_counter()
    hashlib.sha256(view).hexdigest()
    print(f"sha256 alone, one call        {time.perf_counter() - t0:6.3f} s")
    t0 = time.perf_counter()
    h = hashlib.sha256()
    for at in range(0, len(view), CHUNK):
        h.update(view[at : at + CHUNK])
    print(f"sha256 alone, 16 MB chunks    {time.perf_counter() - t0:6.3f} s")
    for early in (0.1, 0.0):
        for hashed in (False, True):
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                storage = LocalStorage(Path(d), early_sync_s=early)
                h = hashlib.sha256()
                t0 = time.perf_counter()
                with ThreadPoolExecutor(1) as pool, storage.writer("f.tif") as f:
                    for at in range(0, len(view), CHUNK):
                        part = view[at : at + CHUNK]
                        done = pool.submit(h.update, part) if hashed else None
                        f.write(part)
                        if done is not None:
                            done.result()
                    t1 = time.perf_counter()
                t2 = time.perf_counter()
            how = f"write, early sync {early:.1f} s, hash {'beside' if hashed else 'none  '}"
            print(f"{how}: written {t1 - t0:6.3f} s, durable {t2 - t1:6.3f} s later, total {t2 - t0:6.3f} s")


if __name__ == "__main__":
    main()
