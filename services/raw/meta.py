"""Metadata of a decoded Bayer RAW frame, JSON-serialisable so it can travel through storage and Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CFA_PATTERNS = ("RGGB", "BGGR", "GRBG", "GBRG")
Matrix3 = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class NoiseProfile:
    """DNG NoiseProfile model: ``variance = shot * x + read`` with x the signal normalised to [0, 1]."""

    shot: float
    read: float


@dataclass(frozen=True)
class RawMeta:
    """Everything the render pipeline needs to know about one Bayer frame besides its pixels.

    ``color_matrix`` is ColorMatrix1 (XYZ -> camera) for ``calibration_illuminants[0]``; the optional DNG colour
    tags after ``noise_profile`` default to "absent" so dicts written before they existed still load. For
    non-DNG files the decoder fills ``color_matrix`` from LibRaw's cam_xyz (a D65 matrix).
    """

    width: int
    height: int
    cfa: str
    black_levels: tuple[float, float, float, float]
    white_level: float
    color_matrix: tuple[tuple[float, float, float], ...]
    as_shot_neutral: tuple[float, float, float] | None
    make: str
    model: str
    noise_profile: NoiseProfile | None
    color_matrix_2: Matrix3 | None = None
    calibration_illuminants: tuple[int, int] = (21, 0)  # EXIF LightSource codes; 0 = absent/unknown
    forward_matrix_1: Matrix3 | None = None
    forward_matrix_2: Matrix3 | None = None
    camera_calibration_1: Matrix3 | None = None
    camera_calibration_2: Matrix3 | None = None
    analog_balance: tuple[float, float, float] | None = None
    as_shot_white_xy: tuple[float, float] | None = None
    baseline_exposure: float = 0.0

    def __post_init__(self) -> None:
        if self.cfa not in CFA_PATTERNS:
            raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {self.cfa!r}")
        if len(self.black_levels) != 4:
            raise ValueError(f"black_levels needs 4 values (one per 2x2 site), got {len(self.black_levels)}")
        for name in _MATRIX_FIELDS:
            m = getattr(self, name)
            if m is not None and (len(m) != 3 or any(len(row) != 3 for row in m)):
                raise ValueError(f"{name} must be 3x3, got {m!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        return {
            "width": self.width,
            "height": self.height,
            "cfa": self.cfa,
            "black_levels": list(self.black_levels),
            "white_level": self.white_level,
            "color_matrix": [list(row) for row in self.color_matrix],
            "as_shot_neutral": None if self.as_shot_neutral is None else list(self.as_shot_neutral),
            "make": self.make,
            "model": self.model,
            "noise_profile": (
                None
                if self.noise_profile is None
                else {"shot": self.noise_profile.shot, "read": self.noise_profile.read}
            ),
            **{name: _matrix_list(getattr(self, name)) for name in _MATRIX_FIELDS[1:]},
            "calibration_illuminants": list(self.calibration_illuminants),
            "analog_balance": None if self.analog_balance is None else list(self.analog_balance),
            "as_shot_white_xy": None if self.as_shot_white_xy is None else list(self.as_shot_white_xy),
            "baseline_exposure": self.baseline_exposure,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RawMeta:
        """Inverse of :meth:`to_dict`; the optional colour keys may be missing (older dicts)."""
        neutral = d.get("as_shot_neutral")
        balance = d.get("analog_balance")
        white_xy = d.get("as_shot_white_xy")
        i1, i2 = (int(v) for v in d.get("calibration_illuminants", (21, 0)))
        noise = d.get("noise_profile")
        b0, b1, b2, b3 = (float(v) for v in d["black_levels"])
        return cls(
            width=int(d["width"]),
            height=int(d["height"]),
            cfa=str(d["cfa"]),
            black_levels=(b0, b1, b2, b3),
            white_level=float(d["white_level"]),
            color_matrix=tuple(_triple(row) for row in d["color_matrix"]),
            as_shot_neutral=None if neutral is None else _triple(neutral),
            make=str(d.get("make", "")),
            model=str(d.get("model", "")),
            noise_profile=None if noise is None else NoiseProfile(float(noise["shot"]), float(noise["read"])),
            color_matrix_2=_matrix(d.get("color_matrix_2")),
            calibration_illuminants=(i1, i2),
            forward_matrix_1=_matrix(d.get("forward_matrix_1")),
            forward_matrix_2=_matrix(d.get("forward_matrix_2")),
            camera_calibration_1=_matrix(d.get("camera_calibration_1")),
            camera_calibration_2=_matrix(d.get("camera_calibration_2")),
            analog_balance=None if balance is None else _triple(balance),
            as_shot_white_xy=None if white_xy is None else (float(white_xy[0]), float(white_xy[1])),
            baseline_exposure=float(d.get("baseline_exposure", 0.0)),
        )


def _triple(values: Any) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in values)
    return (a, b, c)


_MATRIX_FIELDS = (
    "color_matrix",
    "color_matrix_2",
    "forward_matrix_1",
    "forward_matrix_2",
    "camera_calibration_1",
    "camera_calibration_2",
)


def _matrix(rows: Any) -> Matrix3 | None:
    return None if rows is None else tuple(_triple(row) for row in rows)


def _matrix_list(m: Matrix3 | None) -> list[list[float]] | None:
    return None if m is None else [list(row) for row in m]
