"""The architectures this build can run: name -> (builder, receptive-field function, needs weights)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from services.pipeline.models import classical, jdd
from services.pipeline.models.base import Enhancer
from services.pipeline.models.errors import ModelMismatch, ModelPackageError
from services.pipeline.models.manifest import Manifest

Builder = Callable[[Manifest, "dict[str, Tensor] | None", torch.device, torch.dtype], Enhancer]


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Builder
    receptive_field: Callable[[dict[str, Any]], int]
    needs_weights: bool
    # Unsharp-mask amount the renderer applies after this enhancer by default (a package's config may set
    # "post_sharpen"): the classical output is soft; a network trained against sharp scene-referred targets
    # already restores detail, and sharpening it again only moves it away from the scene (docs/QUALITY.md).
    post_sharpen: float


ARCHITECTURES: dict[str, Architecture] = {
    classical.ARCHITECTURE: Architecture(classical.ARCHITECTURE, classical.build_classical,
                                         classical.classical_receptive_field, needs_weights=False, post_sharpen=0.5),
    jdd.ARCHITECTURE: Architecture(jdd.ARCHITECTURE, jdd.build_jdd, jdd.jdd_receptive_field, needs_weights=True,
                                   post_sharpen=0.0),
}


def post_sharpen(manifest: Manifest) -> float:
    """The sharpen amount that follows this package by default."""
    arch = ARCHITECTURES.get(manifest.architecture)
    default = arch.post_sharpen if arch else 0.0
    return float(manifest.config.get("post_sharpen", default))


def architecture_of(manifest: Manifest, source: str) -> Architecture:
    """The registered architecture a manifest names, its declared receptive field checked against it."""
    arch = ARCHITECTURES.get(manifest.architecture)
    if arch is None:
        raise ModelMismatch(f"model architecture mismatch: package {source} is architecture "
                            f"{manifest.architecture}, which this build does not know (known: {sorted(ARCHITECTURES)})")
    try:
        computed = arch.receptive_field(manifest.config)
    except (TypeError, ValueError) as exc:
        raise ModelPackageError(f"model package {source}: bad {arch.name} config {manifest.config}: {exc}") from exc
    if computed != manifest.receptive_field:
        raise ModelPackageError(f"model package {source} declares receptive_field {manifest.receptive_field}, "
                                f"but {arch.name} with config {manifest.config} has {computed}")
    if arch.needs_weights and "weights" not in manifest.files:
        raise ModelPackageError(f"model package {source}: architecture {arch.name} needs files.weights")
    return arch


__all__ = ["ARCHITECTURES", "Architecture", "architecture_of"]
