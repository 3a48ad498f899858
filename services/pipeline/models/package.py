"""Model packages (``*.strata``): a zip file or a directory holding ``manifest.json`` and safetensors weights.

Reading checks the manifest, the weights' sha256, the architecture (known to this build, receptive field as
declared, weights that fit) and, when asked, the camera and the architecture the caller expects.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import Tensor

from services.pipeline.models.architectures import architecture_of
from services.pipeline.models.base import PRECISIONS, Enhancer
from services.pipeline.models.errors import ModelMismatch, ModelPackageError
from services.pipeline.models.manifest import MANIFEST_NAME, Manifest

PACKAGE_SUFFIX = ".strata"
WEIGHTS_FILE = "weights.safetensors"
_ZIP_DATE = (2024, 1, 1, 0, 0, 0)  # fixed timestamps: the same package bytes from the same weights


@dataclass(frozen=True)
class Package:
    """A package read from disk: its manifest and (verified) weights, not yet on a device."""

    path: Path
    manifest: Manifest
    weights: dict[str, Tensor] | None

    @property
    def source(self) -> str:
        return self.path.name


def _read_files(path: Path) -> dict[str, bytes]:
    """All top-level files of a package (zip or directory) by name."""
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    if not path.is_file():
        raise ModelPackageError(f"model package {path} does not exist")
    try:
        with zipfile.ZipFile(path) as zf:
            return {Path(n).name: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    except zipfile.BadZipFile as exc:
        raise ModelPackageError(f"model package {path.name} is neither a zip file nor a directory") from exc


def read_package(path: str | Path) -> Package:
    """Read and verify a package: manifest, sha256 of every listed file, weights decoded to CPU tensors."""
    path = Path(path)
    files = _read_files(path)
    if MANIFEST_NAME not in files:
        raise ModelPackageError(f"model package {path.name} has no {MANIFEST_NAME}")
    try:
        raw = json.loads(files[MANIFEST_NAME])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelPackageError(f"model package {path.name}: {MANIFEST_NAME} is not valid JSON: {exc}") from exc
    manifest = Manifest.from_dict(raw)
    for role, name in manifest.files.items():
        if name not in files:
            raise ModelPackageError(f"model package {path.name} misses {name} ({role})")
        digest = hashlib.sha256(files[name]).hexdigest()
        if digest != manifest.sha256[role]:
            raise ModelPackageError(f"model package {path.name} is corrupt: sha256 of {name} is {digest}, "
                                    f"manifest says {manifest.sha256[role]}")
    weights = None
    if "weights" in manifest.files:
        try:
            weights = load_safetensors(files[manifest.files["weights"]])
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise ModelPackageError(f"model package {path.name}: weights are not safetensors: {exc}") from exc
    return Package(path=path, manifest=manifest, weights=weights)


def check_fits(manifest: Manifest, source: str, camera: str | None = None, architecture: str | None = None) -> None:
    """Raise :class:`ModelMismatch` if the package is not for ``camera`` or not of ``architecture``."""
    if architecture is not None and manifest.architecture != architecture:
        raise ModelMismatch(f"model architecture mismatch: package {source} is architecture "
                            f"{manifest.architecture}, expected {architecture}")
    if camera is not None and not manifest.serves(camera):
        raise ModelMismatch(f"model architecture mismatch: package {source} serves cameras "
                            f"{list(manifest.cameras)}, not {camera.upper()}")


def configure_cuda_numerics(tf32_convolutions: bool) -> None:
    """TF32 tensor cores for the enhancer's float32 convolutions only when asked (the default pass is float16,
    :func:`compute_dtype_for`; float32 stays the exact reference and the CPU's numerics)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = tf32_convolutions


# The default reduced precision on a GPU. float16 keeps 10 bits of mantissa against bfloat16's 7: on an 80 MP frame
# (H200) 0.164 s against 0.175 s (bf16) and 0.238 s (float32 + TF32) under autocast (0.085 / 0.096 s since as
# ``jdd.FoldedJDD``), 13 LSB mean off float32 + TF32 against 112 (bf16), and the quality benchmark within 0.01 dB
# where bf16 lost up to 0.11 dB (docs/PERFORMANCE.md). The
# network's activations stay far inside float16's range (inputs about [0, 4], noise maps scaled to about 1).
GPU_PRECISION = "float16"


def compute_dtype_for(manifest: Manifest, device: torch.device, precision: str | None) -> torch.dtype:
    """``precision`` if given; else float16 on a GPU (:data:`GPU_PRECISION`), float32 on the CPU.

    Strips must stitch to the one-piece render within 1 LSB of 16 bits. In reduced precision each convolution
    rounds its output, so a strip matches the frame only where cuDNN runs the same kernel for both shapes: measured
    on an H200 for float16 and bfloat16 on full 80 MP frames cut in halves, 8 strips and uneven strips down to 2
    rows, another CFA phase and the max tier's orientations: 0 LSB everywhere (``scripts/gpu/model_precision.py``;
    ``strata bench enhance`` repeats the check on any device). STRATA_MODEL_PRECISION=float32 is the exact fallback.
    """
    del manifest
    name = precision or (GPU_PRECISION if device.type == "cuda" else "float32")
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {name!r}")
    return PRECISIONS[name]


def load_package(path: str | Path, device: torch.device | str = "cpu", camera: str | None = None,
                 architecture: str | None = None, precision: str | None = None) -> Enhancer:
    """Read, verify and build a package's :class:`Enhancer` on ``device``.

    ``camera``/``architecture``: what the caller needs; a package for something else raises
    :class:`ModelMismatch`. ``precision``: "float32", "bfloat16" or "float16" (default: float16 on CUDA, float32
    on the CPU).
    """
    pkg = read_package(path)
    check_fits(pkg.manifest, pkg.source, camera, architecture)
    arch = architecture_of(pkg.manifest, pkg.source)
    dev = torch.device(device)
    return arch.build(pkg.manifest, pkg.weights, dev, compute_dtype_for(pkg.manifest, dev, precision))


def write_package(path: str | Path, manifest: Manifest, weights: dict[str, Tensor] | None = None) -> Manifest:
    """Write a zip package (deterministic bytes); ``files``/``sha256`` of the written manifest are filled in.

    Returns the manifest as written. The weights go out as contiguous float32 CPU tensors.
    """
    path = Path(path)
    if path.suffix != PACKAGE_SUFFIX:
        raise ValueError(f"a model package file must end in {PACKAGE_SUFFIX}, got {path.name}")
    blobs: dict[str, bytes] = {}
    files: dict[str, str] = {}
    sha: dict[str, str] = {}
    if weights is not None:
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in weights.items()}
        blob = save_safetensors(tensors)  # no metadata: safetensors writes it in hash order (not reproducible)
        blobs[WEIGHTS_FILE], files["weights"], sha["weights"] = blob, WEIGHTS_FILE, hashlib.sha256(blob).hexdigest()
    final = Manifest.from_dict({**manifest.to_dict(), "files": files, "sha256": sha})
    architecture_of(final, path.name)
    text = json.dumps(final.to_dict(), indent=2, sort_keys=True) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in [(MANIFEST_NAME, text.encode()), *sorted(blobs.items())]:
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return final


__all__ = ["PACKAGE_SUFFIX", "WEIGHTS_FILE", "Package", "check_fits", "compute_dtype_for", "load_package",
           "read_package", "write_package"]
