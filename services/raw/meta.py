"""Metadata of a decoded RAW frame (a Bayer mosaic or a linear DNG's RGB image), JSON-serialisable so it can
travel through storage and Redis."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from services.raw.colour import CameraProfile, Matrix3

CFA_PATTERNS = ("RGGB", "BGGR", "GRBG", "GBRG")
LAYOUT_BAYER = "bayer"  # a (H, W) mosaic behind a 2x2 RGB CFA
LAYOUT_LINEAR = "linear"  # a (H, W, 3) linear camera-RGB image (a LinearRaw DNG): no CFA, no demosaic
LAYOUTS = (LAYOUT_BAYER, LAYOUT_LINEAR)


@dataclass(frozen=True)
class NoiseProfile:
    """DNG NoiseProfile model: ``variance = shot * x + read`` with x the signal normalised to [0, 1]."""

    shot: float
    read: float


SNR_GREY = 0.18  # the signal level a shot's signal-to-noise ratio is quoted at (18 % grey, normalised raw units)


def snr_db(shot: float, read: float, level: float = SNR_GREY) -> float:
    """Signal-to-noise ratio in dB at ``level`` of the noise model ``variance = shot * x + read``; infinite for a
    noise-free model."""
    variance = shot * level + read
    return math.inf if variance <= 0 else 20.0 * math.log10(level / math.sqrt(variance))


@dataclass(frozen=True)
class CaptureInfo:
    """What the camera recorded about the capture, carried into every output's TIFF/EXIF tags.

    Read at decode time from the file's TIFF/EXIF tags (DNG: IFD0 and its EXIF IFD), else from LibRaw. Every
    field is optional; ``datetime_original`` keeps the EXIF form ``YYYY:MM:DD HH:MM:SS`` (camera local time).
    ``orientation`` is the EXIF Orientation code 1..8, written into the outputs as read (pixels not rotated).
    """

    make: str = ""
    model: str = ""
    lens: str = ""
    datetime_original: str = ""
    exposure_time: float | None = None  # seconds
    f_number: float | None = None
    iso: int | None = None
    focal_length: float | None = None  # mm
    orientation: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"make": self.make, "model": self.model, "lens": self.lens, "datetime_original": self.datetime_original,
                "exposure_time": self.exposure_time, "f_number": self.f_number, "iso": self.iso,
                "focal_length": self.focal_length, "orientation": self.orientation}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureInfo:
        """Inverse of :meth:`to_dict`; missing keys take their defaults."""

        def num(key: str) -> float | None:
            value = d.get(key)
            return None if value is None else float(value)

        iso = d.get("iso")
        orientation = int(d.get("orientation") or 1)
        return cls(make=str(d.get("make") or ""), model=str(d.get("model") or ""), lens=str(d.get("lens") or ""),
                   datetime_original=str(d.get("datetime_original") or ""), exposure_time=num("exposure_time"),
                   f_number=num("f_number"), iso=None if iso is None else int(iso), focal_length=num("focal_length"),
                   orientation=orientation if 1 <= orientation <= 8 else 1)

    @property
    def capture_date(self) -> str | None:
        """``YYYY-MM-DD`` of ``datetime_original`` (None when absent or malformed)."""
        date = self.datetime_original[:10].replace(":", "-")
        try:  # a calendar date (2026-13-45 is not one)
            return dt.date.fromisoformat(date).isoformat() if len(date) == 10 and date[0:4] != "0000" else None
        except ValueError:
            return None


@dataclass(frozen=True)
class RawMeta:
    """Everything the render pipeline needs to know about one frame besides its pixels.

    ``layout``: "bayer" (a (H, W) mosaic, ``cfa`` its 2x2 pattern, ``black_levels`` per 2x2 site, row-major) or
    "linear" (a (H, W, 3) camera-RGB image, ``cfa`` "", ``black_levels`` per channel in LibRaw's order R, G, B,
    G). Dicts written before the field existed have no ``layout`` key and load as Bayer.

    ``profile`` holds the DNG camera-profile tags (ColorMatrix1 for ``profile.illuminant_1``, the optional
    second matrix, forward matrices, calibration, analog balance). For non-DNG files the decoder fills its
    ColorMatrix1 from LibRaw's cam_xyz (a D65 matrix). :meth:`to_dict` flattens the profile into the keys the
    stored dicts have always had; the optional ones default to "absent" so dicts written before they existed
    still load.
    """

    width: int
    height: int
    cfa: str
    black_levels: tuple[float, float, float, float]
    white_level: float
    profile: CameraProfile
    as_shot_neutral: tuple[float, float, float] | None
    make: str
    model: str
    noise_profile: NoiseProfile | None
    as_shot_white_xy: tuple[float, float] | None = None
    baseline_exposure: float = 0.0
    capture: CaptureInfo | None = None  # None: decoded by a version that did not read it
    layout: str = LAYOUT_BAYER

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == LAYOUT_LINEAR and self.cfa:
            raise ValueError(f"a linear frame has no CFA pattern, got {self.cfa!r}")
        if self.layout == LAYOUT_BAYER and self.cfa not in CFA_PATTERNS:
            raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {self.cfa!r}")
        if len(self.black_levels) != 4:
            raise ValueError(f"black_levels needs 4 values (one per 2x2 site or R, G, B, G), got "
                             f"{len(self.black_levels)}")

    @property
    def is_linear(self) -> bool:
        return self.layout == LAYOUT_LINEAR

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists), the profile's tags flattened under their stored keys."""
        p = self.profile
        return {
            "width": self.width,
            "height": self.height,
            "cfa": self.cfa,
            "black_levels": list(self.black_levels),
            "white_level": self.white_level,
            "color_matrix": _matrix_list(p.color_matrix_1),
            "as_shot_neutral": None if self.as_shot_neutral is None else list(self.as_shot_neutral),
            "make": self.make,
            "model": self.model,
            "noise_profile": (
                None
                if self.noise_profile is None
                else {"shot": self.noise_profile.shot, "read": self.noise_profile.read}
            ),
            **{name: _matrix_list(getattr(p, name)) for name in _OPTIONAL_MATRICES},
            "calibration_illuminants": [p.illuminant_1, p.illuminant_2],
            "analog_balance": None if p.analog_balance is None else list(p.analog_balance),
            "as_shot_white_xy": None if self.as_shot_white_xy is None else list(self.as_shot_white_xy),
            "baseline_exposure": self.baseline_exposure,
            "capture": None if self.capture is None else self.capture.to_dict(),
            "layout": self.layout,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RawMeta:
        """Inverse of :meth:`to_dict`; the optional colour keys may be missing (older dicts)."""
        neutral = d.get("as_shot_neutral")
        white_xy = d.get("as_shot_white_xy")
        noise = d.get("noise_profile")
        b0, b1, b2, b3 = (float(v) for v in d["black_levels"])
        return cls(
            width=int(d["width"]),
            height=int(d["height"]),
            cfa=str(d["cfa"]),
            black_levels=(b0, b1, b2, b3),
            white_level=float(d["white_level"]),
            profile=profile_from_dict(d),
            as_shot_neutral=None if neutral is None else _triple(neutral),
            make=str(d.get("make", "")),
            model=str(d.get("model", "")),
            noise_profile=None if noise is None else NoiseProfile(float(noise["shot"]), float(noise["read"])),
            as_shot_white_xy=None if white_xy is None else (float(white_xy[0]), float(white_xy[1])),
            baseline_exposure=float(d.get("baseline_exposure", 0.0)),
            capture=None if d.get("capture") is None else CaptureInfo.from_dict(d["capture"]),
            layout=str(d.get("layout", LAYOUT_BAYER)),
        )


def profile_from_dict(d: dict[str, Any]) -> CameraProfile:
    """The camera profile from the flat keys of a stored RawMeta dict (or of decoded DNG tags in that form)."""
    i1, i2 = (int(v) for v in d.get("calibration_illuminants", (21, 0)))
    balance = d.get("analog_balance")
    return CameraProfile(
        color_matrix_1=tuple(_triple(row) for row in d["color_matrix"]),
        color_matrix_2=_matrix(d.get("color_matrix_2")),
        illuminant_1=i1,
        illuminant_2=i2,
        forward_matrix_1=_matrix(d.get("forward_matrix_1")),
        forward_matrix_2=_matrix(d.get("forward_matrix_2")),
        camera_calibration_1=_matrix(d.get("camera_calibration_1")),
        camera_calibration_2=_matrix(d.get("camera_calibration_2")),
        analog_balance=None if balance is None else _triple(balance),
    )


def _triple(values: Any) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in values)
    return (a, b, c)


# The optional profile matrices, in the stored dicts' key order (stored under their CameraProfile field names).
_OPTIONAL_MATRICES = ("color_matrix_2", "forward_matrix_1", "forward_matrix_2", "camera_calibration_1",
                      "camera_calibration_2")


def _matrix(rows: Any) -> Matrix3 | None:
    """Rows of a stored matrix as a 3x3 tuple; wrong shapes are left for CameraProfile to report."""
    if rows is None:
        return None
    return tuple(_triple(row) for row in rows)  # type: ignore[return-value]


def _matrix_list(m: Matrix3 | None) -> list[list[float]] | None:
    return None if m is None else [list(row) for row in m]
