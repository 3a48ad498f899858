"""The DNG colour model, torch-free (numpy float64): camera RGB -> CIE XYZ (D50) -> output RGB, and the white.

Shared by the render pipeline (processing: :func:`render_colour`), the decoder child (which must not import
torch) and the synthesiser (unprocessing). The 3x3 math follows the DNG specification 1.6, chapter 6 "Mapping
Camera Color Space to CIE XYZ Space", with the Adobe DNG SDK's conventions where the spec leaves a choice (see
docs/COLOUR.md):

* ``XYZtoCamera = AnalogBalance @ CameraCalibration @ ColorMatrix``; with two calibration illuminants, the
  matrices are interpolated linearly in inverse correlated colour temperature of the white point, and the
  white point of an AsShotNeutral is found by iterating white xy <-> neutral.
* ``CameraToXYZ_D50 = ForwardMatrix @ inv(diag(ReferenceNeutral)) @ inv(AB @ CC)`` when ForwardMatrix tags
  exist, else ``Bradford(white -> D50) @ inv(XYZtoCamera)``, scaled so that the camera neutral with its
  largest channel at 1 (the white level) maps to D50 with Y = 1.

The render pipeline consumes the result as white-balance gains on the mosaic (``1 / neutral``, G = 1) and one
matrix ``out_from_wb_cam`` (white-balanced camera RGB -> linear output RGB), then the output transfer function
(the torch per-pixel ops in :mod:`services.pipeline.ops.colour`). The synthesiser inverts exactly that:
``camera = neutral_g * (inv(out_from_wb_cam) @ L)`` for a linear output-space pixel ``L``.

The white: the file's AsShotNeutral, else its AsShotWhiteXY, else a grey-world estimate from the mosaic
(:func:`white_balance_neutral`). The older dcraw-style helpers (:func:`camera_rgb_matrix`,
:func:`as_shot_neutral`, :func:`camera_to_srgb_matrix`) remain: for a single D65-calibrated ColorMatrix and a
D65 white they agree with the DNG model (up to 1e-6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Matrix3 = tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]
MatrixLike = Sequence[Sequence[float]] | np.ndarray

# IEC 61966-2-1 linear sRGB (D65) -> CIE XYZ, as printed in the standard (the one definition).
SRGB_TO_XYZ_D65 = np.array(
    [
        [0.4124564, 0.3575761, 0.1804375],
        [0.2126729, 0.7151522, 0.0721750],
        [0.0193339, 0.1191920, 0.9503041],
    ]
)

# CIE 1931 xy chromaticities of the white points used here (D50 as in the DNG SDK and ICC PCS, D65 as in sRGB).
WHITE_D50 = (0.3457, 0.3585)
WHITE_D65 = (0.3127, 0.3290)
WHITE_A = (0.44757, 0.40745)

# Bradford cone response matrix (Lam 1985), XYZ -> sharpened LMS.
BRADFORD = np.array(
    [
        [0.8951, 0.2664, -0.1614],
        [-0.7502, 1.7135, 0.0367],
        [0.0389, -0.0685, 1.0296],
    ]
)

# EXIF LightSource code -> colour temperature (K), as the DNG SDK's IlluminantToTemperature assigns them.
ILLUMINANT_TEMPERATURES: dict[int, float] = {
    1: 5500.0,  # Daylight
    2: (3800.0 + 4500.0) * 0.5,  # Fluorescent
    3: 2850.0,  # Tungsten
    4: 5500.0,  # Flash
    9: 5500.0,  # Fine weather
    10: 6500.0,  # Cloudy weather
    11: 7500.0,  # Shade
    12: (5700.0 + 7100.0) * 0.5,  # Daylight fluorescent
    13: (4600.0 + 5500.0) * 0.5,  # Day white fluorescent
    14: (3800.0 + 4500.0) * 0.5,  # Cool white fluorescent
    15: (3250.0 + 3800.0) * 0.5,  # White fluorescent
    16: (2600.0 + 3250.0) * 0.5,  # Warm white fluorescent
    17: 2850.0,  # Standard light A
    18: 5500.0,  # Standard light B
    19: 6500.0,  # Standard light C
    20: 5500.0,  # D55
    21: 6500.0,  # D65
    22: 7500.0,  # D75
    23: 5000.0,  # D50
    24: 3200.0,  # ISO studio tungsten
}
ILLUMINANT_STD_A = 17
ILLUMINANT_D65 = 21

# Robertson (1968) isotemperature lines: (reciprocal megakelvin, u, v, slope), CIE 1960 UCS; as in the DNG SDK.
_ROBERTSON = np.array(
    [
        (0, 0.18006, 0.26352, -0.24341),
        (10, 0.18066, 0.26589, -0.25479),
        (20, 0.18133, 0.26846, -0.26876),
        (30, 0.18208, 0.27119, -0.28539),
        (40, 0.18293, 0.27407, -0.30470),
        (50, 0.18388, 0.27709, -0.32675),
        (60, 0.18494, 0.28021, -0.35156),
        (70, 0.18611, 0.28342, -0.37915),
        (80, 0.18740, 0.28668, -0.40955),
        (90, 0.18880, 0.28997, -0.44278),
        (100, 0.19032, 0.29326, -0.47888),
        (125, 0.19462, 0.30141, -0.58204),
        (150, 0.19962, 0.30921, -0.70471),
        (175, 0.20525, 0.31647, -0.84901),
        (200, 0.21142, 0.32312, -1.0182),
        (225, 0.21807, 0.32909, -1.2168),
        (250, 0.22511, 0.33439, -1.4512),
        (275, 0.23247, 0.33904, -1.7298),
        (300, 0.24010, 0.34308, -2.0637),
        (325, 0.24792, 0.34655, -2.4681),
        (350, 0.25591, 0.34951, -2.9641),
        (375, 0.26400, 0.35200, -3.5814),
        (400, 0.27218, 0.35407, -4.3633),
        (425, 0.28039, 0.35577, -5.3762),
        (450, 0.28863, 0.35714, -6.7262),
        (475, 0.29685, 0.35823, -8.5955),
        (500, 0.30505, 0.35907, -11.324),
        (525, 0.31320, 0.35968, -15.628),
        (550, 0.32129, 0.36011, -23.325),
        (575, 0.32931, 0.36038, -40.770),
        (600, 0.33724, 0.36051, -116.45),
    ]
)

TRANSFERS = ("srgb", "adobergb", "prophoto", "linear")
ADOBE_RGB_GAMMA = 563.0 / 256.0
PROPHOTO_GAMMA = 1.8
PROPHOTO_LINEAR_LIMIT = 1.0 / 512.0  # ROMM RGB: E' = 16 E below this


@dataclass(frozen=True)
class OutputSpace:
    """An RGB output space: primaries and white (CIE xy) and the name of its transfer function."""

    name: str
    primaries: tuple[tuple[float, float], tuple[float, float], tuple[float, float]]
    white: tuple[float, float]
    transfer: str
    description: str


_SRGB_PRIMARIES = ((0.64, 0.33), (0.30, 0.60), (0.15, 0.06))
OUTPUT_SPACES: dict[str, OutputSpace] = {
    "srgb": OutputSpace("srgb", _SRGB_PRIMARIES, WHITE_D65, "srgb", "sRGB IEC 61966-2-1"),
    "adobergb": OutputSpace(
        "adobergb", ((0.64, 0.33), (0.21, 0.71), (0.15, 0.06)), WHITE_D65, "adobergb", "Adobe RGB (1998)"
    ),
    "prophoto": OutputSpace(
        "prophoto",
        ((0.7347, 0.2653), (0.1596, 0.8404), (0.0366, 0.0001)),
        WHITE_D50,
        "prophoto",
        "ProPhoto RGB (ROMM RGB)",
    ),
    "linear": OutputSpace("linear", _SRGB_PRIMARIES, WHITE_D65, "linear", "Linear sRGB (Rec. 709 primaries, D65)"),
}


def output_space(name: str) -> OutputSpace:
    """The :data:`OUTPUT_SPACES` entry ``name``; ``ValueError`` naming the choices otherwise."""
    space = OUTPUT_SPACES.get(name)
    if space is None:
        raise ValueError(f"unknown output space {name!r}; expected one of {sorted(OUTPUT_SPACES)}")
    return space


# ---------------------------------------------------------------------------------------------------------
# 3x3 colorimetry (numpy float64)


def srgb_to_xyz_matrix() -> np.ndarray:
    """The standard D65 linear sRGB -> XYZ matrix :data:`SRGB_TO_XYZ_D65`, (3, 3) float64 (a fresh copy)."""
    return SRGB_TO_XYZ_D65.copy()


def _mat3(m: object, name: str) -> np.ndarray:
    """``m`` as a (3, 3) float64 array; a torch tensor is accepted by duck typing (no torch import here)."""
    detach = getattr(m, "detach", None)
    a = np.asarray(detach().cpu().numpy() if callable(detach) else m, dtype=np.float64)
    if a.shape != (3, 3):
        raise ValueError(f"{name} must be (3, 3), got {a.shape}")
    return a


def xy_to_xyz(xy: tuple[float, float] | np.ndarray) -> np.ndarray:
    """CIE xy -> XYZ with Y = 1, (3,) float64."""
    x, y = (float(v) for v in np.asarray(xy, dtype=np.float64).ravel()[:2])
    return np.array([x / y, 1.0, (1.0 - x - y) / y])


def xyz_to_xy(xyz: np.ndarray) -> tuple[float, float]:
    """CIE XYZ -> xy; XYZ must have a positive sum."""
    v = np.asarray(xyz, dtype=np.float64)
    total = float(v.sum())
    if total <= 0:
        raise ValueError(f"XYZ {v.tolist()} has no chromaticity")
    return (float(v[0] / total), float(v[1] / total))


def rgb_to_xyz_matrix(space: OutputSpace | str) -> np.ndarray:
    """Linear RGB -> XYZ (relative to the space's own white, Y_white = 1) from primaries and white, (3, 3)."""
    s = output_space(space) if isinstance(space, str) else space
    prim = np.stack([xy_to_xyz(p) for p in s.primaries], axis=1)  # columns: XYZ of each primary (Y = 1)
    scale = np.linalg.solve(prim, xy_to_xyz(s.white))
    return prim * scale[None, :]


def bradford_matrix(source_white: tuple[float, float], target_white: tuple[float, float]) -> np.ndarray:
    """Bradford chromatic adaptation XYZ(source white) -> XYZ(target white), (3, 3) float64."""
    src = BRADFORD @ xy_to_xyz(source_white)
    dst = BRADFORD @ xy_to_xyz(target_white)
    return np.linalg.inv(BRADFORD) @ np.diag(dst / src) @ BRADFORD


def xyz_d50_to_output_matrix(space: OutputSpace | str) -> np.ndarray:
    """XYZ relative to D50 (the DNG/ICC connection space) -> linear output RGB, via Bradford, (3, 3)."""
    s = output_space(space) if isinstance(space, str) else space
    return np.linalg.inv(rgb_to_xyz_matrix(s)) @ bradford_matrix(WHITE_D50, s.white)


def cct_from_xy(xy: tuple[float, float]) -> float:
    """Correlated colour temperature (K) of a white point: Robertson's method as in the DNG SDK."""
    x, y = float(xy[0]), float(xy[1])
    den = 1.5 - x + 6.0 * y
    u, v = 2.0 * x / den, 3.0 * y / den  # CIE 1960 UCS
    last_dt = 0.0
    for i in range(1, len(_ROBERTSON)):
        r, ui, vi, slope = _ROBERTSON[i]
        length = math.hypot(1.0, slope)
        du, dv = 1.0 / length, slope / length
        dt = -(u - ui) * dv + (v - vi) * du
        if dt <= 0.0 or i == len(_ROBERTSON) - 1:
            dt = -min(dt, 0.0)
            f = 0.0 if i == 1 else dt / (last_dt + dt)
            return 1.0e6 / (_ROBERTSON[i - 1, 0] * f + r * (1.0 - f))
        last_dt = dt
    raise AssertionError("unreachable")


def illuminant_temperature(code: int) -> float:
    """Temperature (K) of an EXIF LightSource code; 0 for unknown/other (the DNG SDK's rule)."""
    return ILLUMINANT_TEMPERATURES.get(int(code), 0.0)


def _triple(values: Sequence[float] | np.ndarray, name: str) -> tuple[float, float, float]:
    flat = np.asarray(values, dtype=np.float64).ravel().tolist()
    if len(flat) != 3:
        raise ValueError(f"{name} needs 3 values, got {len(flat)}")
    return (flat[0], flat[1], flat[2])


def _matrix3(m: MatrixLike | None, name: str) -> Matrix3 | None:
    """A (3, 3) matrix as a tuple of float rows (exact), None stays None; ``ValueError`` unless 3x3."""
    if m is None:
        return None
    try:
        a = _mat3(m, name)
    except ValueError as exc:  # ragged rows
        raise ValueError(f"{name} must be 3x3, got {m!r}") from exc
    return (_triple(a[0], name), _triple(a[1], name), _triple(a[2], name))


def _optional_array(m: Matrix3 | None) -> np.ndarray | None:
    return None if m is None else np.asarray(m, dtype=np.float64)


def _normalize_color_matrix(cm: np.ndarray) -> np.ndarray:
    """Scale ColorMatrix so the largest camera response to D50 white is 1 (the SDK's normalisation)."""
    peak = float(np.max(cm @ xy_to_xyz(WHITE_D50)))
    return cm / peak if peak > 0 else cm


def _normalize_forward_matrix(fm: np.ndarray) -> np.ndarray:
    """Scale ForwardMatrix rows so camera (1, 1, 1) maps to D50 white (Y = 1), as the SDK does."""
    xyz = fm @ np.ones(3)
    return np.diag(xy_to_xyz(WHITE_D50) / xyz) @ fm


@dataclass(frozen=True)
class CameraProfile:
    """The DNG camera-profile colour tags: the one class for them (RawMeta and the DNG writer use it too).

    Matrices are 3x3 (ColorMatrix1/2: XYZ -> camera; ForwardMatrix1/2: white-balanced camera -> XYZ D50;
    CameraCalibration1/2), ``analog_balance`` has 3 values; None where the file has none. Arrays or nested
    sequences are accepted and stored as tuples of floats (exact), so profiles compare and hash by value.
    ``illuminant_1/2`` are EXIF LightSource codes (CalibrationIlluminant1/2; 0 = absent/unknown); a profile
    with one ColorMatrix (or an unknown illuminant) is used as is, without interpolation.
    """

    color_matrix_1: Matrix3
    color_matrix_2: Matrix3 | None = None
    illuminant_1: int = ILLUMINANT_D65
    illuminant_2: int = 0
    forward_matrix_1: Matrix3 | None = None
    forward_matrix_2: Matrix3 | None = None
    camera_calibration_1: Matrix3 | None = None
    camera_calibration_2: Matrix3 | None = None
    analog_balance: tuple[float, float, float] | None = None

    def __init__(
        self,
        color_matrix_1: MatrixLike,
        color_matrix_2: MatrixLike | None = None,
        illuminant_1: int = ILLUMINANT_D65,
        illuminant_2: int = 0,
        forward_matrix_1: MatrixLike | None = None,
        forward_matrix_2: MatrixLike | None = None,
        camera_calibration_1: MatrixLike | None = None,
        camera_calibration_2: MatrixLike | None = None,
        analog_balance: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        cm1 = _matrix3(color_matrix_1, "color_matrix_1")
        assert cm1 is not None
        fields: dict[str, object] = {
            "color_matrix_1": cm1,
            "color_matrix_2": _matrix3(color_matrix_2, "color_matrix_2"),
            "illuminant_1": int(illuminant_1),
            "illuminant_2": int(illuminant_2),
            "forward_matrix_1": _matrix3(forward_matrix_1, "forward_matrix_1"),
            "forward_matrix_2": _matrix3(forward_matrix_2, "forward_matrix_2"),
            "camera_calibration_1": _matrix3(camera_calibration_1, "camera_calibration_1"),
            "camera_calibration_2": _matrix3(camera_calibration_2, "camera_calibration_2"),
            "analog_balance": None if analog_balance is None else _triple(analog_balance, "analog_balance"),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def weight_1(self, white: tuple[float, float]) -> float:
        """Interpolation weight of the illuminant-1 matrices for a white point (inverse-CCT, clamped)."""
        t1, t2 = illuminant_temperature(self.illuminant_1), illuminant_temperature(self.illuminant_2)
        if self.color_matrix_2 is None or t1 <= 0 or t2 <= 0 or t1 == t2:
            return 1.0
        temp = cct_from_xy(white)
        lo, hi, lo_is_1 = (t1, t2, True) if t1 < t2 else (t2, t1, False)
        if temp <= lo:
            g = 1.0
        elif temp >= hi:
            g = 0.0
        else:
            g = (1.0 / temp - 1.0 / hi) / (1.0 / lo - 1.0 / hi)
        return g if lo_is_1 else 1.0 - g

    @staticmethod
    def _interpolate(m1: np.ndarray | None, m2: np.ndarray | None, g: float) -> np.ndarray | None:
        if m1 is None or m2 is None:
            return m1 if m1 is not None else m2
        return g * m1 + (1.0 - g) * m2

    def xyz_to_camera(self, white: tuple[float, float]) -> np.ndarray:
        """``AB @ CC @ CM`` interpolated for the white point ``white`` (xy), (3, 3)."""
        g = self.weight_1(white)
        cm1 = _normalize_color_matrix(_mat3(self.color_matrix_1, "color_matrix_1"))
        cm2 = None if self.color_matrix_2 is None else _normalize_color_matrix(_mat3(self.color_matrix_2, "cm2"))
        cm = self._interpolate(cm1, cm2 if g < 1.0 else None, g)
        assert cm is not None
        return self.analog_and_calibration(white) @ cm

    def analog_and_calibration(self, white: tuple[float, float]) -> np.ndarray:
        """``AB @ CC`` for the white point (identity where the tags are absent), (3, 3)."""
        g = self.weight_1(white)
        cc1, cc2 = _optional_array(self.camera_calibration_1), _optional_array(self.camera_calibration_2)
        cc = self._interpolate(cc1, cc2, g)
        ab = np.eye(3) if self.analog_balance is None else np.diag(np.asarray(self.analog_balance, np.float64))
        return ab @ (np.eye(3) if cc is None else _mat3(cc, "camera_calibration"))

    def forward_matrix(self, white: tuple[float, float]) -> np.ndarray | None:
        """ForwardMatrix interpolated for the white point and normalised to map (1, 1, 1) to D50, or None."""
        fm1 = None if self.forward_matrix_1 is None else _normalize_forward_matrix(_mat3(self.forward_matrix_1, "fm1"))
        fm2 = None if self.forward_matrix_2 is None else _normalize_forward_matrix(_mat3(self.forward_matrix_2, "fm2"))
        return self._interpolate(fm1, fm2, self.weight_1(white))

    def neutral_to_xy(self, neutral: np.ndarray) -> tuple[float, float]:
        """White point (xy) of a camera neutral: iterate xy -> XYZtoCamera(xy) -> xy (DNG SDK NeutralToXY)."""
        n = np.asarray(neutral, dtype=np.float64)
        last = WHITE_D50
        for attempt in range(30):
            nxt = xyz_to_xy(np.linalg.solve(self.xyz_to_camera(last), n))
            if abs(nxt[0] - last[0]) + abs(nxt[1] - last[1]) < 1e-7:
                return nxt
            if attempt == 29:  # a two-value oscillation: settle on the middle
                nxt = ((nxt[0] + last[0]) * 0.5, (nxt[1] + last[1]) * 0.5)
            last = nxt
        return last

    def xy_to_neutral(self, white: tuple[float, float]) -> np.ndarray:
        """Camera neutral (largest channel 1) of a white point (xy): ``XYZtoCamera(xy) @ XYZ(xy)``."""
        n = self.xyz_to_camera(white) @ xy_to_xyz(white)
        return n / np.max(n)

    def camera_to_xyz_d50(self, neutral: np.ndarray, white: tuple[float, float]) -> np.ndarray:
        """Camera RGB (not white-balanced) -> XYZ D50, (3, 3); the neutral with max 1 maps to Y = 1."""
        n = np.asarray(neutral, dtype=np.float64)
        n = n / np.max(n)
        fm = self.forward_matrix(white)
        if fm is not None:
            ab_cc = self.analog_and_calibration(white)
            reference_neutral = np.linalg.solve(ab_cc, n)
            return fm @ np.diag(1.0 / reference_neutral) @ np.linalg.inv(ab_cc)
        pcs_to_camera = self.xyz_to_camera(white) @ bradford_matrix(WHITE_D50, white)
        pcs_to_camera = pcs_to_camera / float(np.max(pcs_to_camera @ xy_to_xyz(WHITE_D50)))
        return np.linalg.inv(pcs_to_camera)


# Highlights: where a pixel's most saturated channel passes this share of its raw white level, its white-balanced
# channels above the smallest gain blend into it, fully at the white level (``ops.colour.clip_highlights``, the
# previews' ``clip_highlights_raw``): blown highlights render white, not in the colour of the gains.
HIGHLIGHT_KNEE = 0.9


def clip_highlights_raw(cam: np.ndarray, gains: Sequence[float], axis: int = 0) -> np.ndarray:
    """:data:`HIGHLIGHT_KNEE`'s rule on raw-normalised camera RGB (before the gains; channels on ``axis``), in
    place: each channel ``c`` above ``min(gains) / gains[c]`` (where its white-balanced value passes the smallest
    gain) blends into that bound as the pixel's largest channel goes from the knee to 1."""
    ceiling = min(float(g) for g in gains)
    weight = np.clip((cam.max(axis=axis) - HIGHLIGHT_KNEE) / (1.0 - HIGHLIGHT_KNEE), 0.0, 1.0).astype(cam.dtype)
    for c, gain in enumerate(gains):
        plane = np.take(cam, c, axis=axis)
        over = np.maximum(plane - np.float32(ceiling / float(gain)), 0.0)
        over *= weight
        index: list[slice | int] = [slice(None)] * cam.ndim
        index[axis] = c
        cam[tuple(index)] -= over
    return cam


@dataclass(frozen=True)
class ColourTransform:
    """What the renderer applies: ``gains`` (R, G, B; G = 1) on the mosaic, then ``out_from_wb_cam``, then
    the transfer function named ``transfer``. ``white_xy``/``cct`` describe the scene white used."""

    gains: tuple[float, float, float]
    out_from_wb_cam: np.ndarray  # (3, 3) float64
    transfer: str
    output_space: str
    white_xy: tuple[float, float]
    cct: float

    @property
    def wb_cam_from_out(self) -> np.ndarray:
        """Inverse of :attr:`out_from_wb_cam`: linear output RGB -> white-balanced camera RGB (unprocessing)."""
        return np.linalg.inv(self.out_from_wb_cam)


def dng_colour_transform(
    profile: CameraProfile,
    *,
    neutral: np.ndarray | tuple[float, ...] | None = None,
    white_xy: tuple[float, float] | None = None,
    space: str = "srgb",
    baseline_exposure: float = 0.0,
) -> ColourTransform:
    """The DNG colour pipeline for one shot as gains + one matrix + transfer name.

    ``neutral`` is AsShotNeutral (camera RGB of the white, any scale); otherwise ``white_xy`` (AsShotWhiteXY);
    otherwise D65. ``baseline_exposure`` (EV) scales linear output by ``2 ** baseline_exposure``.
    """
    out = output_space(space)
    if neutral is not None:
        n = np.asarray(neutral, dtype=np.float64).ravel()
        if n.shape != (3,) or np.any(n <= 0):
            raise ValueError(f"neutral needs 3 positive values, got {n.tolist()}")
        white = profile.neutral_to_xy(n)
    else:
        white = WHITE_D65 if white_xy is None else (float(white_xy[0]), float(white_xy[1]))
        n = profile.xy_to_neutral(white)
    n_g = n / n[1]  # G = 1: the renderer's gains are 1 / n_g
    camera_to_pcs = profile.camera_to_xyz_d50(n, white)
    matrix = (2.0**baseline_exposure) * xyz_d50_to_output_matrix(out) @ camera_to_pcs @ np.diag(n_g)
    gains = (float(1.0 / n_g[0]), 1.0, float(1.0 / n_g[2]))
    return ColourTransform(gains, matrix, out.transfer, out.name, white, cct_from_xy(white))


def camera_to_srgb_matrix(color_matrix: object) -> np.ndarray:
    """Legacy dcraw-style ``inv(rownorm(color_matrix @ SRGB_TO_XYZ_D65))``, (3, 3) float64.

    ``color_matrix`` is the DNG ColorMatrix (XYZ -> camera; an array or a torch tensor). Equals the DNG
    pipeline's ``out_from_wb_cam`` for a single D65-calibrated matrix and a D65 as-shot white up to rounding;
    kept for existing callers.
    """
    return np.linalg.inv(camera_rgb_matrix(_mat3(color_matrix, "color_matrix")))


def _camera_from_srgb(color_matrix: MatrixLike) -> np.ndarray:
    return _mat3(color_matrix, "color_matrix") @ SRGB_TO_XYZ_D65  # [camera, srgb]


def camera_rgb_matrix(color_matrix: MatrixLike) -> np.ndarray:
    """linear sRGB -> white-balanced camera RGB, rows normalised to sum to 1; (3, 3) float64.

    ``color_matrix`` is the DNG ColorMatrix1 (XYZ -> camera, rows not normalised).
    """
    cam_rgb = _camera_from_srgb(color_matrix)
    return cam_rgb / cam_rgb.sum(axis=1, keepdims=True)


def as_shot_neutral(color_matrix: MatrixLike) -> np.ndarray:
    """Camera response to sRGB white (D65) normalised to green = 1: the DNG AsShotNeutral, (3,) float64."""
    neutral = _camera_from_srgb(color_matrix).sum(axis=1)
    return neutral / neutral[1]


# numpy float64 sRGB curves for the synthesiser's and the benchmarks' numpy data. The torch ops
# (services.pipeline.ops.colour.srgb_encode/srgb_decode) differ from these in the last bits of pow, so
# switching those callers over would change synthetic data and measured figures; the renderer uses the torch ops.


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    """Linear [0, 1] -> sRGB-encoded [0, 1], IEC 61966-2-1 piecewise curve (input clipped to [0, 1])."""
    x = np.clip(np.asarray(linear), 0.0, 1.0)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1.0 / 2.4) - 0.055)


def srgb_decode(encoded: np.ndarray) -> np.ndarray:
    """sRGB-encoded [0, 1] -> linear [0, 1] (inverse of :func:`srgb_encode`; input clipped to [0, 1])."""
    v = np.clip(np.asarray(encoded), 0.0, 1.0)
    return np.where(v <= 0.04045, v / 12.92, np.power((v + 0.055) / 1.055, 2.4))


# ---------------------------------------------------------------------------------------------------------
# A frame's colour: the white-balance decision and the transform


_SITES = ((0, 0), (0, 1), (1, 0), (1, 1))


class FrameColour(Protocol):
    """What the colour model reads of a frame's metadata (``services.raw.meta.RawMeta`` has it; meta.py imports
    this module for the profile class, so this module names the fields instead of importing RawMeta)."""

    @property
    def cfa(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def black_levels(self) -> tuple[float, float, float, float]: ...
    @property
    def white_level(self) -> float: ...
    @property
    def profile(self) -> CameraProfile: ...
    @property
    def as_shot_neutral(self) -> tuple[float, float, float] | None: ...
    @property
    def as_shot_white_xy(self) -> tuple[float, float] | None: ...
    @property
    def baseline_exposure(self) -> float: ...


def cfa_planes(mosaic: np.ndarray, meta: FrameColour) -> dict[str, list[np.ndarray]]:
    """The normalised CFA sub-planes of a (subsampled) mosaic, grouped by colour letter, float32. A linear
    frame's (H, W, 3) image gives its three channels, one plane each (black levels R, G, B, G)."""
    white = float(meta.white_level)
    planes: dict[str, list[np.ndarray]] = {"R": [], "G": [], "B": []}
    if meta.layout == "linear":
        for c, letter in enumerate("RGB"):
            black = meta.black_levels[c]
            planes[letter].append((mosaic[..., c].astype(np.float32) - black) / max(white - black, 1.0))
        return planes
    for (dy, dx), letter, black in zip(_SITES, meta.cfa, meta.black_levels, strict=True):
        plane = mosaic[dy::2, dx::2].astype(np.float32)
        planes[letter].append((plane - black) / max(white - black, 1.0))
    return planes


def _sample_cells(mosaic: np.ndarray, step: int) -> np.ndarray:
    """One 2 x 2 cell of every ``step`` x ``step`` block (``step`` even), put together as a smaller mosaic with the
    same CFA phase (a plain ``[::step, ::step]`` would keep one CFA site only); a linear image, every ``step``-th
    pixel."""
    h, w = (mosaic.shape[0] // step) * step, (mosaic.shape[1] // step) * step
    if mosaic.ndim == 3 or h == 0 or w == 0:
        return np.ascontiguousarray(mosaic[::step, ::step] if mosaic.ndim == 3 else mosaic)
    cells = mosaic[:h, :w].reshape(h // step, step, w // step, step)[:, :2, :, :2]
    return np.ascontiguousarray(cells).reshape(h // step * 2, w // step * 2)


def grey_world_neutral(meta: FrameColour, mosaic: np.ndarray) -> tuple[float, float, float]:
    """A camera neutral (R, G, B; G = 1) from the scene's mean colour, for files without an as-shot white."""
    planes = cfa_planes(_sample_cells(mosaic, 8), meta)
    means = {c: float(np.mean([p.mean() for p in ps])) for c, ps in planes.items()}
    g = max(means["G"], 1e-6)
    return (max(means["R"], 1e-6) / g, 1.0, max(means["B"], 1e-6) / g)


def has_as_shot_white(meta: FrameColour) -> bool:
    """Whether the file states its white: a positive AsShotNeutral or an AsShotWhiteXY."""
    neutral = meta.as_shot_neutral
    return bool(neutral and all(v > 0 for v in neutral)) or bool(meta.as_shot_white_xy)


def white_balance_neutral(meta: FrameColour, mosaic: np.ndarray) -> tuple[float, float, float] | None:
    """The white-balance decision for a shot: None where the file states its white (:func:`render_colour` then
    uses it), else the grey-world estimate of ``mosaic`` (:func:`grey_world_neutral`)."""
    return None if has_as_shot_white(meta) else grey_world_neutral(meta, mosaic)


def render_colour(
    meta: FrameColour,
    space: str = "srgb",
    *,
    neutral: tuple[float, float, float] | np.ndarray | None = None,
    apply_baseline_exposure: bool = True,
) -> ColourTransform:
    """White-balance gains + ``out_from_wb_cam`` + transfer name for a frame, per the DNG specification.

    The white is ``neutral`` when given (e.g. a grey-world estimate), else the file's AsShotNeutral, else its
    AsShotWhiteXY, else D65. BaselineExposure is applied as a linear ``2 ** EV`` unless told otherwise.
    """
    n = neutral if neutral is not None else meta.as_shot_neutral
    return dng_colour_transform(
        meta.profile,
        neutral=None if n is None else np.asarray(n, dtype=np.float64),
        white_xy=meta.as_shot_white_xy,
        space=space,
        baseline_exposure=meta.baseline_exposure if apply_baseline_exposure else 0.0,
    )
