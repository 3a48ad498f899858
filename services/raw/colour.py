"""The colour contract shared by the synthesiser (unprocessing) and the render pipeline (processing).

The render pipeline follows the DNG colour model (:func:`render_colour`): gains ``1 / neutral`` (G = 1) on the
mosaic, then ``out = out_from_wb_cam @ wb_camera``, then the output transfer function. The synthesiser inverts
exactly that: ``camera = neutral_g * (inv(out_from_wb_cam) @ L)`` for a linear output-space pixel ``L``.

The older dcraw-style helpers (:func:`camera_rgb_matrix`, :func:`as_shot_neutral`) remain: for a single
D65-calibrated ColorMatrix and a D65 white they agree with the DNG model (up to 1e-6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from services.raw.meta import RawMeta

if TYPE_CHECKING:  # imported lazily below: the decoder child process must not pay for importing torch
    from services.pipeline.ops.colour import CameraProfile, ColourTransform

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


def _array(m: tuple[tuple[float, ...], ...] | tuple[float, ...] | None) -> np.ndarray | None:
    return None if m is None else np.asarray(m, dtype=np.float64)


def camera_profile(meta: RawMeta) -> CameraProfile:
    """The DNG camera profile (ColorMatrix1/2, illuminants, ForwardMatrix, calibration) carried by ``meta``."""
    from services.pipeline.ops.colour import CameraProfile
    cm1 = np.asarray(meta.color_matrix, dtype=np.float64)
    i1, i2 = meta.calibration_illuminants
    return CameraProfile(
        color_matrix_1=cm1,
        color_matrix_2=_array(meta.color_matrix_2),
        illuminant_1=i1,
        illuminant_2=i2,
        forward_matrix_1=_array(meta.forward_matrix_1),
        forward_matrix_2=_array(meta.forward_matrix_2),
        camera_calibration_1=_array(meta.camera_calibration_1),
        camera_calibration_2=_array(meta.camera_calibration_2),
        analog_balance=_array(meta.analog_balance),
    )


def render_colour(
    meta: RawMeta,
    space: str = "srgb",
    *,
    neutral: tuple[float, float, float] | np.ndarray | None = None,
    apply_baseline_exposure: bool = True,
) -> ColourTransform:
    """White-balance gains + ``out_from_wb_cam`` + transfer name for a frame, per the DNG specification.

    The white is ``neutral`` when given (e.g. a grey-world estimate), else the file's AsShotNeutral, else its
    AsShotWhiteXY, else D65. BaselineExposure is applied as a linear ``2 ** EV`` unless told otherwise.
    """
    from services.pipeline.ops.colour import dng_colour_transform

    n = neutral if neutral is not None else meta.as_shot_neutral
    return dng_colour_transform(
        camera_profile(meta),
        neutral=None if n is None else np.asarray(n, dtype=np.float64),
        white_xy=meta.as_shot_white_xy,
        space=space,
        baseline_exposure=meta.baseline_exposure if apply_baseline_exposure else 0.0,
    )
