"""Writing the shipped model packages: the classical one (no weights) and the learned ones from a trained net."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from services.pipeline.models import classical
from services.pipeline.models.jdd import JDD_VERSION, jdd_manifest
from services.pipeline.models.manifest import Manifest
from services.pipeline.models.package import write_package

# Learned packages written by a full training run: file name -> cameras served.
LEARNED_PACKAGES: dict[str, tuple[str, ...]] = {
    "strata_jdd_v1.strata": ("*",),
    "iq3s_denoise_v2.strata": ("IQ3_S",),
    "iq2xs_multishot_v3.strata": ("IQ2_XS",),
}
CAMERA_DEFAULTS = ("iq3s_denoise_v2.strata", "iq2xs_multishot_v3.strata")


def classical_manifest() -> Manifest:
    config = {"denoise_radius": classical.DENOISE_RADIUS, "noise_factors": list(classical.DEMOSAIC_NOISE_FACTORS)}
    return Manifest(name="classical_v1", version="1.0.0", architecture=classical.ARCHITECTURE, cameras=("*",),
                    receptive_field=classical.classical_receptive_field(config), noise_input=True,
                    dtype="float32", config=config,
                    training={"script": None, "note": "not trained: Malvar-He-Cutler demosaic + Lee denoise"})


def write_classical_package(out_dir: str | Path) -> Path:
    """``classical_v1.strata`` in ``out_dir``."""
    path = Path(out_dir) / "classical_v1.strata"
    write_package(path, classical_manifest())
    return path


def write_learned_packages(net: nn.Module, config: dict[str, Any], out_dir: str | Path, training: dict[str, Any],
                           files: list[str]) -> list[Path]:
    """Write the learned packages named in ``files`` (keys of :data:`LEARNED_PACKAGES`) with ``net``'s weights."""
    weights = {k: v.detach() for k, v in net.state_dict().items()}
    paths = []
    for file in files:
        path = Path(out_dir) / file
        write_package(path, jdd_manifest(path.stem.replace(".", "_"), LEARNED_PACKAGES[file], config, training),
                      weights)
        paths.append(path)
    return paths


__all__ = ["CAMERA_DEFAULTS", "JDD_VERSION", "LEARNED_PACKAGES", "classical_manifest", "jdd_manifest", "main",
           "write_classical_package", "write_learned_packages"]


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the classical model package.")
    parser.add_argument("--out", default="services/pipeline/models/packages", help="package directory")
    print(write_classical_package(parser.parse_args().out))


if __name__ == "__main__":
    main()
