"""CI quality gate (issue 3): on small held-out crops the learned packages (the `best` and the `fast` tier) must
not fall below the classical one.

Renders held-out synthetic IQ3_S shots (photograph 033 when ``../shared/data/photos`` is present, and a
held-out dead-leaves seed) at noise levels none and mid through the real pipeline (``decode_raw`` ->
``shot_render_params`` -> ``render_mosaic``) on the CPU, and compares the mean PSNR per level against the
ground truth. ``STRATA_QUALITY_LEARNED_PACKAGE`` may point at a package to gate before it ships.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tifffile

from lab.quality import metrics as qmetrics
from lab.quality import shots as qshots
from lab.quality import strata
from lab.synth.unprocess import DEFAULT_PHOTOS_DIR
from services.pipeline.models.registry import PACKAGES_DIR, resolve_package

SCALE = 0.04  # 308 x 412 px frames
LEVELS = ("none", "mid")
CLASSICAL = "classical_v1.strata"


def _learned(name: str) -> Path:
    override = os.environ.get("STRATA_QUALITY_LEARNED_PACKAGE")
    return resolve_package(override) if override else PACKAGES_DIR / f"{name}.strata"


@pytest.mark.parametrize("name", [strata.BEST, strata.LEARNED])
def test_learned_package_is_not_worse_than_classical(tmp_path: Path, name: str) -> None:
    learned = _learned(name)
    if not learned.exists():
        pytest.skip(f"learned package {learned} is absent (it ships after GPU training)")
    photo = DEFAULT_PHOTOS_DIR / "033.png"
    content = ["photo:033" if photo.is_file() else "dead_leaves:900002", "dead_leaves:900001"]
    shots = qshots.parse_shots(content)
    means: dict[str, dict[str, float]] = {}
    for level in LEVELS:
        scores: dict[str, list[float]] = {"classical": [], "learned": []}
        for shot in shots:
            dng = qshots.synth_cached(tmp_path, shot, level, SCALE, None)
            truth = tifffile.imread(dng.parent / "ground_truth.tif")
            meta, mosaic, _ = strata.decode(dng, tmp_path)
            for key, package in (("classical", CLASSICAL), ("learned", str(learned))):
                image, _ = strata.render_strata(meta, mosaic, package, "cpu")
                scores[key].append(qmetrics.psnr(image, truth))
        means[level] = {k: sum(v) / len(v) for k, v in scores.items()}
    report = ", ".join(f"{lv}: learned {m['learned']:.2f} dB vs classical {m['classical']:.2f} dB"
                       for lv, m in means.items())
    for level, m in means.items():
        assert m["learned"] >= m["classical"], f"learned package below classical at noise {level!r} ({report})"
