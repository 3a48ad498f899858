"""GPU host, after a service benchmark: the 16-bit TIFFs of one shot rendered many times (the bench uploads the
same IQ3_S file for every single and batch shot) must hold the same pixels whichever side compressed their tiles
(GPU tiles are 64 x 128, the CPU writer's 256 x 256). Decodes a few of each kind and compares their pixels.

    python scripts/gpu/verify_outputs.py DATA_DIR [--each 3]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import tifffile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--each", type=int, default=3)
    args = ap.parse_args()
    kinds: dict[tuple[int, int], list[Path]] = {}
    for path in sorted(args.data_dir.rglob("*.tif")):
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            full_iq3s = path.name.startswith("iq3s") and page.dtype.itemsize == 2 and page.shape[0] >= 7000
            if not full_iq3s:  # the full-size 16-bit IQ3_S renders only
                continue
            kinds.setdefault((page.tilelength, page.tilewidth), []).append(path)
    digests: dict[str, list[str]] = {}
    for tile, paths in kinds.items():
        print(f"tiles {tile[0]} x {tile[1]}: {len(paths)} file(s)")
        for path in paths[: args.each]:
            pixels = tifffile.imread(path)
            digests.setdefault(hashlib.sha256(pixels.tobytes()).hexdigest()[:16], []).append(f"{tile} {path.name}")
    for digest, names in digests.items():
        print(f"pixels {digest}: {len(names)} file(s): {', '.join(names)}")
    same = len(digests) == 1
    print("all the same pixels" if same else "PIXELS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
