"""Colour per-pixel ops (torch): white balance on the mosaic, the 3x3 colour matrix, output transfer functions,
uint16 codes.

The colour model these ops apply (the DNG camera profile, output spaces, the white) is torch-free and lives in
:mod:`services.raw.colour`; its :class:`~services.raw.colour.ColourTransform` gives the renderer gains for
:func:`white_balance`, one matrix for :func:`apply_matrix` and a transfer name for :func:`encode_transfer`.
Images are (B, 3, H, W) tensors, mosaics (B, 1, H, W).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from services.pipeline.ops._checks import as_vector, check_image
from services.pipeline.ops.cfa import cfa_channels, site_map
from services.raw.colour import ADOBE_RGB_GAMMA, HIGHLIGHT_KNEE, PROPHOTO_GAMMA, PROPHOTO_LINEAR_LIMIT, TRANSFERS


def white_balance(mosaic: Tensor, gains: Tensor | Sequence[float], cfa: str) -> Tensor:
    """Multiply each site of a (B, 1, H, W) mosaic by the gain of its channel; gains are (R, G, B)."""
    check_image(mosaic, 1, "mosaic")
    g = as_vector(gains, mosaic, 3, "gains")  # (3,)
    per_site = g[list(cfa_channels(cfa))].view(2, 2)  # (2, 2)
    return mosaic * site_map(per_site, *mosaic.shape[-2:])  # (B, 1, H, W)


def white_balance_rgb(rgb: Tensor, gains: Tensor | Sequence[float]) -> Tensor:
    """Multiply each channel of a (B, 3, H, W) linear camera-RGB image by its gain; gains are (R, G, B)."""
    check_image(rgb, 3, "rgb")
    return rgb * as_vector(gains, rgb, 3, "gains").view(1, 3, 1, 1)  # (B, 3, H, W)




def clip_highlights(rgb: Tensor, gains: Tensor | Sequence[float]) -> Tensor:
    """Blown highlights white, not magenta: (B, 3, H, W) white-balanced camera RGB whose raw values reached the
    white level in every channel sit at the gains, e.g. (1.5, 1, 1.4): a magenta cast once through the matrix.

    Channel ``c`` saturates at ``gains[c]``; a pixel's saturation is its largest ``rgb[c] / gains[c]``. From
    :data:`HIGHLIGHT_KNEE` to 1 each channel above ``min(gains)`` (the brightest neutral every channel can
    record) blends into that value, as LibRaw's default highlight mode clips; darker pixels, and bright colours
    short of the white level, are left alone. Per pixel, so strips and fused groups stay exact."""
    check_image(rgb, 3, "rgb")
    g = as_vector(gains, rgb, 3, "gains").view(1, 3, 1, 1)
    ceiling = float(min(float(v) for v in (gains.tolist() if isinstance(gains, Tensor) else gains)))
    level = (rgb / g).amax(dim=1, keepdim=True)  # (B, 1, H, W): 1 = some channel at its raw white level
    weight = ((level - HIGHLIGHT_KNEE) / (1.0 - HIGHLIGHT_KNEE)).clamp(0.0, 1.0)
    return rgb - weight * (rgb - rgb.clamp(max=ceiling))


def _check_float(x: object, name: str) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = getattr(x, "dtype", type(x).__name__)
        raise TypeError(f"{name} must be a floating torch.Tensor, got {got}")


def apply_matrix(rgb: Tensor, m: Tensor | np.ndarray | tuple) -> Tensor:
    """Per-pixel ``out = m @ rgb`` for (B, 3, H, W) with a (3, 3) matrix; same device and dtype.

    Written as explicit multiply-adds (fixed order per pixel) rather than a matmul, so results do not depend
    on the tensor size.
    """
    check_image(rgb, 3, "rgb")
    mat = torch.as_tensor(np.asarray(m, dtype=np.float64) if not isinstance(m, Tensor) else m,
                          dtype=rgb.dtype).cpu()  # on the host: a device matrix's tolist() waits for the device
    if mat.shape != (3, 3):
        raise ValueError(f"matrix must be (3, 3), got {tuple(mat.shape)}")
    coef = mat.tolist()
    r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]  # (B, 1, H, W) each
    rows = [r * coef[i][0] + g * coef[i][1] + b * coef[i][2] for i in range(3)]
    return torch.cat(rows, dim=1)  # (B, 3, H, W)


def _pow(x: Tensor, exponent: float) -> Tensor:
    """``x ** exponent`` computed in float64 and rounded to ``x``'s dtype. In float32 the vectorised and the scalar
    pow kernels differ in the last bit for some inputs, and which elements take which depends on how the tensor is
    split among threads, that is on its shape: a pixel of a strip then encoded one code off the same pixel of the
    whole frame (a pixel-shift stack on two CPU threads). Rounded from float64 they agree."""
    if x.dtype == torch.float64:
        return x.pow(exponent)
    return x.double().pow(exponent).to(x.dtype)


def srgb_encode(linear: Tensor) -> Tensor:
    """Linear -> sRGB-encoded with the IEC 61966-2-1 piecewise curve; input clamped to [0, 1]; any shape."""
    _check_float(linear, "linear")
    x = linear.clamp(0.0, 1.0)
    return torch.where(x <= 0.0031308, x * 12.92, _pow(x, 1.0 / 2.4) * 1.055 - 0.055)


def srgb_decode(encoded: Tensor) -> Tensor:
    """sRGB-encoded -> linear (inverse of :func:`srgb_encode`); input clamped to [0, 1]; any shape."""
    _check_float(encoded, "encoded")
    v = encoded.clamp(0.0, 1.0)
    return torch.where(v <= 0.04045, v / 12.92, _pow((v + 0.055) / 1.055, 2.4))


def _check_transfer(name: str) -> None:
    if name not in TRANSFERS:
        raise ValueError(f"unknown transfer function {name!r}; expected one of {TRANSFERS}")


def encode_transfer(linear: Tensor, name: str) -> Tensor:
    """Linear [0, 1] -> encoded with the output space's transfer function ``name`` (:data:`TRANSFERS`).

    Input clamped to [0, 1]; any shape; same device and dtype. ``srgb``: IEC 61966-2-1 piecewise;
    ``adobergb``: pure power 1/2.19921875; ``prophoto``: ROMM RGB (1/1.8 with a 16x linear toe below 1/512);
    ``linear``: identity.
    """
    _check_transfer(name)
    if name == "srgb":
        return srgb_encode(linear)
    _check_float(linear, "linear")
    x = linear.clamp(0.0, 1.0)
    if name == "adobergb":
        return _pow(x, 1.0 / ADOBE_RGB_GAMMA)
    if name == "prophoto":
        return torch.where(x < PROPHOTO_LINEAR_LIMIT, x * 16.0, _pow(x, 1.0 / PROPHOTO_GAMMA))
    return x


def decode_transfer(encoded: Tensor, name: str) -> Tensor:
    """Inverse of :func:`encode_transfer` (input clamped to [0, 1])."""
    _check_transfer(name)
    if name == "srgb":
        return srgb_decode(encoded)
    _check_float(encoded, "encoded")
    v = encoded.clamp(0.0, 1.0)
    if name == "adobergb":
        return _pow(v, ADOBE_RGB_GAMMA)
    if name == "prophoto":
        return torch.where(v < 16.0 * PROPHOTO_LINEAR_LIMIT, v / 16.0, _pow(v, PROPHOTO_GAMMA))
    return v


def to_uint16(x: Tensor) -> Tensor:
    """[0, 1] floats -> uint16 codes ``floor(x * 65535 + 0.5)`` (round half up), clamped to [0, 65535]."""
    _check_float(x, "x")
    return torch.floor(x * 65535.0 + 0.5).clamp(0.0, 65535.0).to(torch.uint16)
