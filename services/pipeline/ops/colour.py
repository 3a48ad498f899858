"""Camera RGB -> linear sRGB -> sRGB-encoded 16-bit.

Colour contract (shared with ``services.raw.colour``): for linear sRGB ``L`` the camera records, before
white balance, ``c = neutral * (cam_rgb_n @ L)`` with ``cam_rgb_n = rownorm(color_matrix @ SRGB_TO_XYZ_D65)``.
After white balance (gains ``1 / neutral``), ``L = rgb_cam @ c_wb`` with ``rgb_cam = inv(cam_rgb_n)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from services.pipeline.ops._checks import check_image

# IEC 61966-2-1 linear sRGB (D65) -> CIE XYZ.
SRGB_TO_XYZ_D65 = np.array(
    [
        [0.4124564, 0.3575761, 0.1804375],
        [0.2126729, 0.7151522, 0.0721750],
        [0.0193339, 0.1191920, 0.9503041],
    ]
)


def _check_float(x: object, name: str) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = getattr(x, "dtype", type(x).__name__)
        raise TypeError(f"{name} must be a floating torch.Tensor, got {got}")


def camera_to_srgb_matrix(color_matrix: Tensor | np.ndarray) -> np.ndarray:
    """``rgb_cam = inv(rownorm(color_matrix @ SRGB_TO_XYZ_D65))``, (3, 3) float64.

    ``color_matrix`` is the DNG ColorMatrix (XYZ -> camera), torch or numpy.
    """
    if isinstance(color_matrix, Tensor):
        color_matrix = color_matrix.detach().cpu().numpy()
    cm = np.asarray(color_matrix, dtype=np.float64)
    if cm.shape != (3, 3):
        raise ValueError(f"color_matrix must be (3, 3), got {cm.shape}")
    cam_rgb = cm @ SRGB_TO_XYZ_D65  # [camera, srgb]
    cam_rgb_n = cam_rgb / cam_rgb.sum(axis=1, keepdims=True)
    return np.linalg.inv(cam_rgb_n)


def apply_matrix(rgb: Tensor, m: Tensor | np.ndarray | tuple) -> Tensor:
    """Per-pixel ``out = m @ rgb`` for (B, 3, H, W) with a (3, 3) matrix; same device and dtype.

    Written as explicit multiply-adds (fixed order per pixel) rather than a matmul, so results do not depend
    on the tensor size.
    """
    check_image(rgb, 3, "rgb")
    mat = torch.as_tensor(np.asarray(m, dtype=np.float64) if not isinstance(m, Tensor) else m,
                          dtype=rgb.dtype, device=rgb.device)
    if mat.shape != (3, 3):
        raise ValueError(f"matrix must be (3, 3), got {tuple(mat.shape)}")
    coef = mat.tolist()
    r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]  # (B, 1, H, W) each
    rows = [r * coef[i][0] + g * coef[i][1] + b * coef[i][2] for i in range(3)]
    return torch.cat(rows, dim=1)  # (B, 3, H, W)


def srgb_encode(linear: Tensor) -> Tensor:
    """Linear -> sRGB-encoded with the IEC 61966-2-1 piecewise curve; input clamped to [0, 1]; any shape."""
    _check_float(linear, "linear")
    x = linear.clamp(0.0, 1.0)
    return torch.where(x <= 0.0031308, x * 12.92, x.pow(1.0 / 2.4) * 1.055 - 0.055)


def srgb_decode(encoded: Tensor) -> Tensor:
    """sRGB-encoded -> linear (inverse of :func:`srgb_encode`); input clamped to [0, 1]; any shape."""
    _check_float(encoded, "encoded")
    v = encoded.clamp(0.0, 1.0)
    return torch.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055).pow(2.4))


def to_uint16(x: Tensor) -> Tensor:
    """[0, 1] floats -> uint16 codes ``floor(x * 65535 + 0.5)`` (round half up), clamped to [0, 65535]."""
    _check_float(x, "x")
    return torch.floor(x * 65535.0 + 0.5).clamp(0.0, 65535.0).to(torch.uint16)
