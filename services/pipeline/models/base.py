"""The enhancement stage's interface: a white-balanced Bayer mosaic and its noise model in, linear RGB out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from services.pipeline.gate import yield_to_urgent
from services.pipeline.models.manifest import Manifest
from services.pipeline.ops._checks import as_vector, check_image, small
from services.pipeline.ops.cfa import cfa_channels, orient, oriented_cfa, unorient

PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                      "float16": torch.float16}
NoiseValues = Tensor | Sequence[float] | float
ENSEMBLE_SIZES = (1, 2, 4, 8)  # orientations a self-ensemble may average (Enhancer.enhance)
# The order a self-ensemble takes its orientations in (indices into ORIENTATIONS): identity, 90 degrees, 180, 270, then
# the reflections. A quarter turn second: as a pair with the identity it beat the half turn on 23 of 24 noise-free
# shots (six images in all four Bayer phases, +0.20 dB on average; the other quarter turn ties it; docs/QUALITY.md).
ENSEMBLE_ORDER = (0, 2, 1, 3, 4, 5, 6, 7)


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

    def enhance(self, mosaic: Tensor, cfa: str, shot: NoiseValues, read: NoiseValues, orientations: int = 1
                ) -> Tensor:
        """(B, 1, H, W) white-balanced mosaic -> (B, 3, H, W) float32 linear camera RGB; see the class doc.

        ``orientations`` (1, 2, 4 or 8): a self-ensemble, the mean of the renders of the mosaic turned to the first
        N orientations of :data:`ENSEMBLE_ORDER` (identity, 90 degrees, 180, 270, the reflections), each turned
        back. N times the compute for an estimate whose errors partly average out (the ``max`` tier,
        docs/QUALITY.md). Each render is a function of the same pixels' neighbourhood, so strips still stitch."""
        check_image(mosaic, 1, "mosaic")
        cfa_channels(cfa)
        if orientations not in ENSEMBLE_SIZES:
            raise ValueError(f"orientations must be one of {ENSEMBLE_SIZES}, got {orientations}")
        x = mosaic.float()
        host = torch.empty(0)  # checked on the host: reading a device value back would wait for the device
        shot_h, read_h = as_vector(shot, host, 3, "shot"), as_vector(read, host, 3, "read")  # (3,) each
        if bool((shot_h < 0).any()) or bool((read_h < 0).any()):
            raise ValueError(f"noise must be >= 0, got shot={shot_h.tolist()} read={read_h.tolist()}")
        shot_c, read_c = small(shot_h, x.device), small(read_h, x.device)
        with torch.inference_mode():
            if orientations == 1:
                return self._enhance(x, cfa.upper(), shot_c, read_c)
            h, w = x.shape[-2:]
            acc = self._enhance(x, cfa.upper(), shot_c, read_c)
            for k in ENSEMBLE_ORDER[1:orientations]:  # in a fixed order: the same sums for a strip as for the frame
                yield_to_urgent()  # a batch shard lets an interactive one have the device between passes
                turned = orient(x, k).contiguous()
                acc += unorient(self._enhance(turned, oriented_cfa(cfa, k, h, w), shot_c, read_c), k)
            return acc / orientations

    @abstractmethod
    def _enhance(self, mosaic: Tensor, cfa: str, shot: Tensor, read: Tensor) -> Tensor:
        """The computation on checked inputs: float32 mosaic, upper-case cfa, (3,) noise tensors."""

    def __repr__(self) -> str:
        m = self.manifest
        return (f"{type(self).__name__}({m.name} v{m.version}, {m.architecture}, rf={m.receptive_field}, "
                f"{self.device}, {str(self.compute_dtype).removeprefix('torch.')})")


__all__ = ["ENSEMBLE_ORDER", "ENSEMBLE_SIZES", "PRECISIONS", "Enhancer", "NoiseValues"]
