"""The ``manifest.json`` of a model package: what the package is, what it serves, how to read its weights."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from services.pipeline.models.errors import ModelPackageError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
INPUT_NORMALISATIONS: tuple[str, ...] = ("wb_normalized_mosaic",)
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def halo_rows(receptive_field: int, sharpen_radius: int) -> int:
    """Rows a strip reads beyond each cut: ``receptive_field + sharpen_radius`` rounded up to even (CFA parity)."""
    if receptive_field < 0 or sharpen_radius < 0:
        raise ValueError(f"radii must be >= 0, got {receptive_field} and {sharpen_radius}")
    radius = receptive_field + sharpen_radius
    return radius + radius % 2


@dataclass(frozen=True)
class Manifest:
    """A package's description. ``receptive_field`` is the radius, in full-resolution pixels, beyond which input
    changes cannot reach an output pixel; the strip halo is derived from it (:meth:`halo_rows`)."""

    name: str
    version: str
    architecture: str
    cameras: tuple[str, ...]  # camera profiles served, or ("*",) for any
    receptive_field: int
    input: str = "wb_normalized_mosaic"
    noise_input: bool = False
    dtype: str = "float32"  # preferred compute dtype on a GPU; the CPU always computes in float32
    config: dict[str, Any] = field(default_factory=dict)  # architecture hyper-parameters
    files: dict[str, str] = field(default_factory=dict)  # role -> file name inside the package ("weights")
    sha256: dict[str, str] = field(default_factory=dict)  # role -> hex digest of that file
    training: dict[str, Any] = field(default_factory=dict)  # script, seed, data recipe, date, metrics
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ModelPackageError(f"invalid model manifest {self.name!r}: " + "; ".join(problems))

    def serves(self, camera: str) -> bool:
        """Whether this package is meant for ``camera`` (a profile name such as ``IQ3_S``)."""
        return "*" in self.cameras or camera.upper() in self.cameras

    def halo_rows(self, sharpen_radius: int) -> int:
        """The strip halo for this package followed by a sharpen of ``sharpen_radius``."""
        return halo_rows(self.receptive_field, sharpen_radius)

    @property
    def is_smoke(self) -> bool:
        """True for packages from ``training.train --smoke``: loadable, never a default."""
        return bool(self.training.get("smoke", False))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (tuples become lists)."""
        d = asdict(self)
        d["cameras"] = list(self.cameras)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """Validate and build; unknown keys are an error (a newer format this build cannot read)."""
        if not isinstance(d, dict):
            raise ModelPackageError(f"manifest must be a JSON object, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ModelPackageError(f"manifest has unknown keys {unknown}")
        missing = sorted(k for k in ("name", "version", "architecture", "cameras", "receptive_field") if k not in d)
        if missing:
            raise ModelPackageError(f"manifest misses required keys {missing}")
        cameras = d["cameras"]
        if not isinstance(cameras, list | tuple):
            raise ModelPackageError(f"manifest cameras must be a list, got {cameras!r}")
        kw = dict(d)
        kw["cameras"] = tuple(str(c).upper() for c in cameras)
        for key in ("config", "files", "sha256", "training"):
            if key in kw and not isinstance(kw[key], dict):
                raise ModelPackageError(f"manifest {key} must be an object, got {kw[key]!r}")
        return cls(**kw)


def _problems(m: Manifest) -> list[str]:
    """Everything wrong with a manifest, as readable phrases."""
    out: list[str] = []
    if not isinstance(m.name, str) or not _NAME.match(m.name):
        out.append(f"name must be lower-case letters, digits, '_', '.', '-', got {m.name!r}")
    if not isinstance(m.version, str) or not m.version:
        out.append(f"version must be a non-empty string, got {m.version!r}")
    if not isinstance(m.architecture, str) or not m.architecture:
        out.append(f"architecture must be a non-empty string, got {m.architecture!r}")
    if not m.cameras or not all(isinstance(c, str) and c for c in m.cameras):
        out.append(f"cameras must be a non-empty list of profile names or ['*'], got {list(m.cameras)}")
    if not isinstance(m.receptive_field, int) or isinstance(m.receptive_field, bool) or m.receptive_field < 0:
        out.append(f"receptive_field must be an integer >= 0, got {m.receptive_field!r}")
    if m.input not in INPUT_NORMALISATIONS:
        out.append(f"input must be one of {INPUT_NORMALISATIONS}, got {m.input!r}")
    if not isinstance(m.noise_input, bool):
        out.append(f"noise_input must be true or false, got {m.noise_input!r}")
    if m.dtype not in DTYPES:
        out.append(f"dtype must be one of {DTYPES}, got {m.dtype!r}")
    if m.format != FORMAT_VERSION:
        out.append(f"format {m.format!r} is not supported (this build reads {FORMAT_VERSION})")
    for role, name in m.files.items():
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name == MANIFEST_NAME:
            out.append(f"files.{role} must be a plain file name, got {name!r}")
        digest = m.sha256.get(role)
        if not isinstance(digest, str) or not _SHA256.match(digest):
            out.append(f"sha256.{role} must be 64 lower-case hex digits, got {digest!r}")
    extra = sorted(set(m.sha256) - set(m.files))
    if extra:
        out.append(f"sha256 names files not in files: {extra}")
    return out


__all__ = ["DTYPES", "FORMAT_VERSION", "INPUT_NORMALISATIONS", "MANIFEST_NAME", "Manifest", "halo_rows"]
