"""GPU host, after two services ran the same benchmark shots (one with the worker-written TIFFs, one with
``STRATA_WORKER_TIFFS=false``): every full-size 16-bit IQ3_S TIFF each service recorded decodes whole, its recorded
SHA-256 and size are the file's, and the first of each service holds the same pixels as the other's.

    python scripts/gpu/check_worker_tiffs.py DATA_ON DATA_OFF [--each 3]
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import sys
from pathlib import Path

import numpy as np
import tifffile


def recorded(data: Path, each: int) -> list[tuple[Path, str, int]]:
    """Up to ``each`` full-size IQ3_S TIFFs the service recorded: (path, sha256, bytes)."""
    db = sqlite3.connect(data / "strata.db")
    rows = db.execute("SELECT storage_key, sha256, bytes FROM outputs WHERE media_type = 'image/tiff' "
                      "ORDER BY id").fetchall()
    out = []
    for key, sha, size in rows:
        path = data / "storage" / key
        if not path.is_file():
            continue
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            if page.dtype.itemsize != 2 or page.shape[0] < 7000:
                continue
        out.append((path, sha, int(size)))
        if len(out) == each:
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_on", type=Path)
    ap.add_argument("data_off", type=Path)
    ap.add_argument("--each", type=int, default=3)
    args = ap.parse_args()
    firsts = []
    ok = True
    for data in (args.data_on, args.data_off):
        files = recorded(data, args.each)
        if not files:
            print(f"{data}: no full-size IQ3_S TIFF recorded")
            return 1
        for path, sha, size in files:
            body = path.read_bytes()
            good = hashlib.sha256(body).hexdigest() == sha and len(body) == size
            pixels = tifffile.imread(path)
            print(f"{data.name}/{path.name}: {size / 1e6:.1f} MB, recorded hash {'matches' if good else 'DIFFERS'}, "
                  f"decodes to {pixels.shape} {pixels.dtype}")
            ok &= good
        firsts.append(tifffile.imread(files[0][0]))
    diff = np.abs(firsts[0].astype(np.int32) - firsts[1].astype(np.int32))
    print(f"first IQ3_S of each: max |difference| {int(diff.max())}, mean {float(diff.mean()):.4f} codes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
