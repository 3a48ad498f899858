"""Writing the shipped model packages: the classical one (no weights) and the learned ones from a trained net."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from services.pipeline.models import classical, jdd
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


# 1.0.0: 24000 steps; 1.1.0: 30000 steps with scale augmentation (training/data.py UPSCALE_SHARE).
JDD_VERSION = "1.1.0"


def jdd_manifest(name: str, cameras: tuple[str, ...], config: dict[str, Any], training: dict[str, Any],
                 version: str = JDD_VERSION) -> Manifest:
    return Manifest(name=name, version=version, architecture=jdd.ARCHITECTURE, cameras=cameras,
                    receptive_field=jdd.jdd_receptive_field(config), noise_input=True, dtype="bfloat16",
                    config=dict(config), training=training)


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


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the classical model package.")
    parser.add_argument("--out", default="services/pipeline/models/packages", help="package directory")
    print(write_classical_package(parser.parse_args().out))


if __name__ == "__main__":
    main()
