"""The learned package's output corrected by its residuals at the measured samples (session 24, issue 17): after
``Enhancer.enhance``, each channel's difference to the mosaic at that channel's sites is spread to every pixel by
normalised convolution (a 3 x 3 bilinear kernel, or a 5 x 5 Gaussian of sigma ``DC_SIGMA``) and added. Patched in
around the real pipeline, then `strata quality` runs as usual:

    DC_MODE=resid|resid5|replace|none python scripts/experiments/residual_consistency.py quality --scale 0.1 \\
        --levels none --device cpu --content skimage:astronaut,... --methods strata_jdd_v2.strata --json OUT

Noise-free only: with noise the residual holds the noise and would have to be shrunk (docs/QUALITY.md, "tried").
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.nn.functional as F

import services.pipeline.render as render

MODE = os.environ.get("DC_MODE", "resid")


def _masks(cfa: str, height: int, width: int, dev: torch.device) -> torch.Tensor:
    m = torch.zeros(1, 3, height, width, device=dev)
    for i, ch in enumerate(cfa):
        m[0, "RGB".index(ch), i // 2 :: 2, i % 2 :: 2] = 1.0
    return m


def correct(rgb: torch.Tensor, x: torch.Tensor, cfa: str) -> torch.Tensor:
    """``rgb`` (1, 3, H, W) corrected towards the white-balanced mosaic ``x`` (1, 1, H, W) of pattern ``cfa``."""
    m = _masks(cfa, x.shape[-2], x.shape[-1], x.device)
    measured = x.expand_as(rgb)
    if MODE == "replace":
        return rgb * (1 - m) + measured * m
    if MODE == "resid5":
        g = torch.exp(-0.5 * (torch.arange(-2, 3, dtype=torch.float32) / float(os.environ.get("DC_SIGMA", "0.8"))) ** 2)
        k = g[:, None] * g[None, :]
    else:
        k = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]])
    pad = k.shape[-1] // 2
    k = k.to(x.device).view(1, 1, *k.shape).repeat(3, 1, 1, 1)
    num = F.conv2d(F.pad((measured - rgb) * m, (pad,) * 4, mode="reflect"), k, groups=3)
    den = F.conv2d(F.pad(m, (pad,) * 4, mode="reflect"), k, groups=3)
    return rgb + num / den


class _Corrected:
    def __init__(self, enhancer: Any) -> None:
        self.enhancer = enhancer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.enhancer, name)

    def enhance(self, x: torch.Tensor, cfa: str, shot: Any, read: Any, orientations: int = 1) -> torch.Tensor:
        rgb = self.enhancer.enhance(x, cfa, shot, read, orientations)
        return rgb if MODE == "none" else correct(rgb, x, cfa)


def main() -> None:
    load = render.load_enhancer
    render.load_enhancer = lambda *a, **k: _Corrected(load(*a, **k))  # type: ignore[assignment]
    from cli.main import app

    app(sys.argv[1:])


if __name__ == "__main__":
    main()
