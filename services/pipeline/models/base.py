"""The enhancement stage's interface: a white-balanced Bayer mosaic and its noise model in, linear RGB out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from services.pipeline.models.manifest import Manifest
from services.pipeline.ops._checks import as_vector, check_image
from services.pipeline.ops.cfa import cfa_channels

PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                      "float16": torch.float16}
NoiseValues = Tensor | Sequence[float] | float


class Enhancer(ABC):
    """Joint demosaic + denoise of one model package, resident on one device.

    ``enhance(mosaic, cfa, shot, read)``: ``mosaic`` (B, 1, H, W) float, linear, levels-normalised and white
    balanced (values about [0, 1], may exceed 1 after WB), CFA phase ``cfa`` at (0, 0); ``shot`` and ``read``
    (3,) the noise model of each white-balanced channel (variance ``shot_c * x + read_c``). Returns
    (B, 3, H, W) float32 linear white-balanced camera RGB on the mosaic's device. Each output pixel depends
    only on input pixels within :attr:`receptive_field` (reflect padding at the image borders), so strips
    with that halo stitch to the whole-frame result.
    """

    def __init__(self, manifest: Manifest, device: torch.device, compute_dtype: torch.dtype) -> None:
        self.manifest = manifest
        self.device = device
        self.compute_dtype = compute_dtype

    @property
    def receptive_field(self) -> int:
        """Radius in full-resolution pixels (from the manifest, checked against the architecture)."""
        return self.manifest.receptive_field

    @property
    def name(self) -> str:
        return self.manifest.name

    def enhance(self, mosaic: Tensor, cfa: str, shot: NoiseValues, read: NoiseValues) -> Tensor:
        """(B, 1, H, W) white-balanced mosaic -> (B, 3, H, W) float32 linear camera RGB; see the class doc."""
        check_image(mosaic, 1, "mosaic")
        cfa_channels(cfa)
        x = mosaic.float()
        shot_c = as_vector(shot, x, 3, "shot")  # (3,)
        read_c = as_vector(read, x, 3, "read")  # (3,)
        if bool((shot_c < 0).any()) or bool((read_c < 0).any()):
            raise ValueError(f"noise must be >= 0, got shot={shot_c.tolist()} read={read_c.tolist()}")
        with torch.inference_mode():
            return self._enhance(x, cfa.upper(), shot_c, read_c)

    @abstractmethod
    def _enhance(self, mosaic: Tensor, cfa: str, shot: Tensor, read: Tensor) -> Tensor:
        """The computation on checked inputs: float32 mosaic, upper-case cfa, (3,) noise tensors."""

    def __repr__(self) -> str:
        m = self.manifest
        return (f"{type(self).__name__}({m.name} v{m.version}, {m.architecture}, rf={m.receptive_field}, "
                f"{self.device}, {str(self.compute_dtype).removeprefix('torch.')})")


__all__ = ["PRECISIONS", "Enhancer", "NoiseValues"]
