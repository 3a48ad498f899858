"""training.average: a package whose weights are the average of two packages of one network."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.pipeline.models import load_package
from services.pipeline.models.package import read_package, write_package
from training.average import average_packages, main

PACKAGES = Path(__file__).resolve().parents[2] / "services" / "pipeline" / "models" / "packages"


def _shifted(tmp_path: Path) -> Path:
    """The shipped best package with every weight plus one, as a stand-in for a fine-tune of it."""
    shipped = read_package(PACKAGES / "strata_jdd_v2.strata")
    assert shipped.weights is not None
    path = tmp_path / "tuned.strata"
    write_package(path, shipped.manifest, {k: v + 1.0 for k, v in shipped.weights.items()})
    return path


def test_the_average_lies_between_the_two_and_names_both(tmp_path: Path) -> None:
    a, b = PACKAGES / "strata_jdd_v2.strata", _shifted(tmp_path)
    out = tmp_path / "avg.strata"
    assert main([str(a), str(b), "--alpha", "0.25", "--version", "9.9.9", "--out", str(out)]) == 0
    avg, base = read_package(out), read_package(a)
    assert avg.weights is not None and base.weights is not None
    for k, v in base.weights.items():
        torch.testing.assert_close(avg.weights[k], v.float() + 0.25)
    assert avg.manifest.version == "9.9.9" and avg.manifest.name == base.manifest.name
    made = avg.manifest.training["averaged"]
    assert made["alpha"] == 0.25 and [o["file"] for o in made["from"]] == ["strata_jdd_v2.strata", "tuned.strata"]
    assert "fine_tune" in avg.manifest.training
    load_package(out, "cpu")  # the service loads it


def test_different_networks_or_a_bad_alpha_are_refused(tmp_path: Path) -> None:
    v1, v2 = PACKAGES / "strata_jdd_v1.strata", PACKAGES / "strata_jdd_v2.strata"
    with pytest.raises(ValueError, match="different networks"):
        average_packages(v1, v2, 0.5, tmp_path / "x.strata", "1.0.0")
    with pytest.raises(ValueError, match="alpha"):
        average_packages(v2, v2, 1.5, tmp_path / "x.strata", "1.0.0")
