"""Which second orientation makes the best two-render self-ensemble: `python scripts/experiments/ensemble_pair.py
[--photos DIR] [--json OUT]` renders noise-free synthetic IQ3_S shots (scale 0.1, six images in all four Bayer phases)
with `strata_jdd_v2` once, then as pairs (identity + orientation k of ORIENTATIONS, k = 1 half turn, 2 and 3 quarter
turns, 7 the anti-diagonal reflection) and prints each pair's gain in dB over the single render."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import tifffile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.quality import metrics, strata  # noqa: E402
from lab.quality import shots as qshots  # noqa: E402
from services.pipeline.models import base  # noqa: E402

SPECS = ("photo:033", "photo:036", "photo:040", "skimage:camera", "skimage:brick", "skimage:gravel")
CANDIDATES = (1, 2, 3, 7)
PHASES = ("RGGB", "BGGR", "GRBG", "GBRG")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--photos", default=None, help="photographs (default ../shared/data/photos)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    order = base.ENSEMBLE_ORDER
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for cfa in PHASES:
            for shot in qshots.parse_shots(SPECS, cfa=cfa):
                dng = qshots.synth_cached(work, shot, "none", 0.1, args.photos)
                truth = tifffile.imread(dng.parent / "ground_truth.tif")
                meta, mosaic, _ = strata.decode(dng, work)
                image, _ = strata.render_strata(meta, mosaic, "strata_jdd_v2.strata", "cpu")
                row: dict = {"shot": shot.name, "cfa": cfa, "base": metrics.psnr(image, truth)}
                try:
                    for k in CANDIDATES:
                        base.ENSEMBLE_ORDER = (0, k)
                        image, _ = strata.render_strata(meta, mosaic, "strata_jdd_v2.strata@2", "cpu")
                        row[str(k)] = metrics.psnr(image, truth) - row["base"]
                finally:
                    base.ENSEMBLE_ORDER = order
                rows.append(row)
                print(shot.name, cfa, " ".join(f"{k}:{row[str(k)]:+.3f}" for k in CANDIDATES), flush=True)
    print("mean", " ".join(f"{k}:{np.mean([r[str(k)] for r in rows]):+.3f}" for k in CANDIDATES))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
