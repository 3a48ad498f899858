"""The colour contract shared by the synthesiser (unprocessing) and the render pipeline (processing).

For a linear sRGB pixel ``L`` the camera records, before white balance, ``c = neutral * (cam_rgb_n @ L)``
where ``cam_rgb_n = camera_rgb_matrix(color_matrix)`` and ``neutral = as_shot_neutral(color_matrix)``.
The pipeline inverts it with ``gains = 1 / neutral`` and ``L = inv(cam_rgb_n) @ (gains * c)``.
"""

from __future__ import annotations

import numpy as np

# IEC 61966-2-1 linear sRGB (D65) -> CIE XYZ.
_SRGB_TO_XYZ = np.array(
    [
        [0.4124564, 0.3575761, 0.1804375],
        [0.2126729, 0.7151522, 0.0721750],
        [0.0193339, 0.1191920, 0.9503041],
    ]
)


def srgb_to_xyz_matrix() -> np.ndarray:
    """The standard D65 linear sRGB -> XYZ matrix, (3, 3) float64 (a fresh copy)."""
    return _SRGB_TO_XYZ.copy()


def _camera_from_srgb(color_matrix: np.ndarray) -> np.ndarray:
    cm = np.asarray(color_matrix, dtype=np.float64)
    if cm.shape != (3, 3):
        raise ValueError(f"color_matrix must be (3, 3), got {cm.shape}")
    return cm @ _SRGB_TO_XYZ  # [camera, srgb]


def camera_rgb_matrix(color_matrix: np.ndarray) -> np.ndarray:
    """linear sRGB -> white-balanced camera RGB, rows normalised to sum to 1; (3, 3) float64.

    ``color_matrix`` is the DNG ColorMatrix1 (XYZ -> camera, rows not normalised).
    """
    cam_rgb = _camera_from_srgb(color_matrix)
    return cam_rgb / cam_rgb.sum(axis=1, keepdims=True)


def as_shot_neutral(color_matrix: np.ndarray) -> np.ndarray:
    """Camera response to sRGB white (D65) normalised to green = 1: the DNG AsShotNeutral, (3,) float64."""
    neutral = _camera_from_srgb(color_matrix).sum(axis=1)
    return neutral / neutral[1]


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    """Linear [0, 1] -> sRGB-encoded [0, 1], IEC 61966-2-1 piecewise curve (input clipped to [0, 1])."""
    x = np.clip(np.asarray(linear), 0.0, 1.0)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1.0 / 2.4) - 0.055)


def srgb_decode(encoded: np.ndarray) -> np.ndarray:
    """sRGB-encoded [0, 1] -> linear [0, 1] (inverse of :func:`srgb_encode`; input clipped to [0, 1])."""
    v = np.clip(np.asarray(encoded), 0.0, 1.0)
    return np.where(v <= 0.04045, v / 12.92, np.power((v + 0.055) / 1.055, 2.4))
