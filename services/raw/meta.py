"""Metadata of a decoded Bayer RAW frame, JSON-serialisable so it can travel through storage and Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CFA_PATTERNS = ("RGGB", "BGGR", "GRBG", "GBRG")


@dataclass(frozen=True)
class NoiseProfile:
    """DNG NoiseProfile model: ``variance = shot * x + read`` with x the signal normalised to [0, 1]."""

    shot: float
    read: float


@dataclass(frozen=True)
class RawMeta:
    """Everything the render pipeline needs to know about one Bayer frame besides its pixels."""

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

    def __post_init__(self) -> None:
        if self.cfa not in CFA_PATTERNS:
            raise ValueError(f"cfa must be one of {CFA_PATTERNS}, got {self.cfa!r}")
        if len(self.black_levels) != 4:
            raise ValueError(f"black_levels needs 4 values (one per 2x2 site), got {len(self.black_levels)}")
        if len(self.color_matrix) != 3 or any(len(row) != 3 for row in self.color_matrix):
            raise ValueError(f"color_matrix must be 3x3, got {self.color_matrix!r}")

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
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RawMeta:
        """Inverse of :meth:`to_dict`."""
        neutral = d.get("as_shot_neutral")
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
        )


def _triple(values: Any) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in values)
    return (a, b, c)
