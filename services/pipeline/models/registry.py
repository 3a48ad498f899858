"""Which package serves a camera, and the per-process cache that keeps loaded packages resident.

Default package of a camera: the setting ``model_<camera>`` (``STRATA_MODEL_IQ3_S=/path/pkg.strata``), else the
learned package of the tier asked for (``best``, and ``max`` with a self-ensemble: :data:`BEST_PACKAGE`;
``fast``: the camera's package in :data:`LEARNED_DEFAULTS`; the tier comes from a job's recipes or the setting
``model_tier``) when that file is shipped in ``packages/`` and is not a smoke-test package, then the camera's fast
package, else ``classical_v1.strata``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch

from services.pipeline.models.base import Enhancer
from services.pipeline.models.manifest import Manifest
from services.pipeline.models.package import PACKAGE_SUFFIX, check_fits, load_package, read_package

log = logging.getLogger(__name__)

PACKAGES_DIR = Path(__file__).resolve().parent / "packages"
CLASSICAL_PACKAGE = "classical_v1.strata"
LEARNED_DEFAULTS: dict[str, str] = {"IQ3_S": "iq3s_denoise_v2.strata", "IQ2_XS": "iq2xs_multishot_v3.strata"}
BEST_PACKAGE = "strata_jdd_v2.strata"  # every camera's `best` tier (cameras "*")
TIERS = ("best", "fast", "max")
# The `max` tier is the best package with a self-ensemble over this many orientations (single frames only):
# without noise +0.36 dB with 2 and +0.63 dB with 4 on five photographs (+0.88 with 4 on ten), at 2x / 4x the
# model's GPU time (docs/QUALITY.md)
MAX_ORIENTATIONS = 4
# The `best` tier averages two orientations (identity and a quarter turn, base.ENSEMBLE_ORDER) of a clean single
# frame: one whose noise leaves a signal-to-noise ratio of at least CLEAN_SNR_DB at 18 % grey (base ISO to about ISO
# 1600 on the benchmark's noise line: the `low` level is 29.5 dB, `mid` 19.5). There the network's demosaicking error
# dominates and the second orientation cancels much of it (+0.57 dB without noise, +0.25 at low noise on the held-out
# photographs, +0.90 / +0.27 on images of other origins; docs/QUALITY.md) for about 0.09 s more GPU per 80 MP frame;
# noisier shots render once. The setting ``clean_orientations`` (1 turns it off) overrides the count.
CLEAN_SNR_DB = 24.0
CLEAN_ORIENTATIONS = 2
# The package a stack's frames' model pass uses when the shot renders with the key (everything after the merge uses
# the shot's own package): strata_jdd_v2_frames 2.2.0 is 2.0.0's weights trained on the stack's own objective (the
# average of N frames' renders, each told a quarter of its noise, against the truth; training.train --package
# frames), +0.09..+0.51 dB over 2.0.0's weights on the stack benchmark's photographs at mid noise (docs/QUALITY.md).
# The setting ``stack_frames_package`` overrides it.
FRAMES_PACKAGES: dict[str, str] = {BEST_PACKAGE: "strata_jdd_v2_frames.strata"}

_cache: dict[tuple[str, str, str | None], Enhancer] = {}
_manifests: dict[str, Manifest] = {}
_lock = threading.Lock()
_precision: ContextVar[str | None] = ContextVar("strata_model_precision", default=None)


def resolve_package(package: str | Path) -> Path:
    """A package path: as given when it exists, else a name (with or without ``.strata``) in ``packages/``."""
    p = Path(package)
    if p.exists():
        return p.resolve()
    name = p.name if p.suffix == PACKAGE_SUFFIX else p.name + PACKAGE_SUFFIX
    shipped = PACKAGES_DIR / name
    return shipped if shipped.exists() else p


def _setting(name: str) -> str | None:
    from services.config import get_settings

    value = getattr(get_settings(), name, None)
    return str(value) if value else None


def _configured(camera: str) -> str | None:
    return _setting(f"model_{camera.lower()}")


def package_ref(path: str | Path) -> str:
    """How a shot records its package: the bare file name for a shipped package (hosts differ in where the repo
    lives), else the path as given."""
    p = Path(path)
    return p.name if p.resolve().parent == PACKAGES_DIR and p.exists() else str(path)


@functools.lru_cache(maxsize=64)
def _is_smoke(path: Path, mtime_ns: int, size: int) -> bool:
    """Whether the package file is a smoke-test one, read once per version of the file (every ingest asks: reading
    and verifying the package cost 10 ms of each shot's plan)."""
    return read_package(path).manifest.is_smoke


def _shipped_learned(name: str, camera: str) -> Path | None:
    path = PACKAGES_DIR / name
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    if _is_smoke(path, stat.st_mtime_ns, stat.st_size):
        log.warning("%s is a smoke-test package; %s does not render with it", name, camera)
        return None
    return path


def default_package(camera: str, tier: str | None = None) -> Path:
    """The package ``camera`` renders with when none is named (see the module doc); ``tier``: best | fast | max
    (None: the setting ``model_tier``, best unless set)."""
    configured = _configured(camera)
    if configured:
        return resolve_package(configured)
    tier = resolve_tier(tier)
    names = ([BEST_PACKAGE] if tier in ("best", "max") else []) + [
        n for n in (LEARNED_DEFAULTS.get(camera.upper()),) if n]
    for name in names:
        path = _shipped_learned(name, camera)
        if path is not None:
            return path
    return PACKAGES_DIR / CLASSICAL_PACKAGE


def resolve_tier(tier: str | None) -> str:
    """``tier`` (best | fast | max), else the setting ``model_tier``, else best; ``ValueError`` for another."""
    tier = tier or _setting("model_tier") or "best"
    if tier not in TIERS:
        raise ValueError(f"model tier must be one of {TIERS}, got {tier!r}")
    return tier


def tier_orientations(tier: str | None, package: str | Path | None = None, snr: float | None = None) -> int:
    """How many orientations a single frame of ``tier`` averages (:meth:`Enhancer.enhance`).

    ``max``: the setting ``max_orientations`` (STRATA_MAX_ORIENTATIONS), else :data:`MAX_ORIENTATIONS`. ``best``
    rendering :data:`BEST_PACKAGE` a shot whose ``snr`` (:func:`services.raw.meta.snr_db`) is at least
    :data:`CLEAN_SNR_DB`: the setting ``clean_orientations`` (STRATA_CLEAN_ORIENTATIONS), else
    :data:`CLEAN_ORIENTATIONS`. Otherwise 1.
    """
    resolved = resolve_tier(tier)
    if resolved == "max":
        return int(_setting("max_orientations") or MAX_ORIENTATIONS)
    if (resolved == "best" and package is not None and Path(package).name == BEST_PACKAGE and snr is not None
            and snr >= CLEAN_SNR_DB):
        return int(_setting("clean_orientations") or CLEAN_ORIENTATIONS)
    return 1


def frames_package(package: str, companion: bool = True) -> str:
    """The package (a ref, as :func:`package_ref` records it) a stack's frames' model pass uses when the shot
    renders with ``package``: the setting ``stack_frames_package`` ("same": ``package`` itself; a name or path),
    else ("auto") the shipped companion in :data:`FRAMES_PACKAGES` where ``companion`` allows it, else ``package``.
    ``companion=False``: the stack's frames sample the scene at one place (a tripod, whole-pixel offsets), where the
    companion renders fine detail worse than the shot's package (:func:`services.pipeline.stack.stack_params`).
    Chosen once per shot (every frame group must use the same package for the groups' sums to fuse exactly)."""
    wanted = _setting("stack_frames_package") or "auto"
    if wanted == "same" or (wanted == "auto" and not companion):
        return package
    if wanted != "auto":
        return package_ref(resolve_package(wanted))
    path = resolve_package(package)
    shipped = FRAMES_PACKAGES.get(path.name) if path.parent == PACKAGES_DIR else None
    if shipped is None or _shipped_learned(shipped, "a stack") is None:
        return package
    return shipped


def package_manifest(package: str | Path) -> Manifest:
    """The verified manifest of a package (path or shipped name), read once per process: what a coordinator
    needs to plan strip halos without building the network."""
    path = resolve_package(package)
    with _lock:
        manifest = _manifests.get(str(path))
        if manifest is None:
            manifest = read_package(path).manifest
            _manifests[str(path)] = manifest
    return manifest


@contextmanager
def compute_precision(precision: str | None) -> Iterator[None]:
    """Within the block (this thread or task only), :func:`load_enhancer` calls that name no ``precision`` use
    ``precision`` (float32 | bfloat16 | float16; None: as outside). For callers that reach the enhancer through
    the render functions (benchmarks comparing precisions), without changing the process-wide settings."""
    token = _precision.set(precision)
    try:
        yield
    finally:
        _precision.reset(token)


def load_enhancer(camera: str, device: torch.device | str = "cpu", package: str | Path | None = None,
                  architecture: str | None = None, precision: str | None = None) -> Enhancer:
    """The resident enhancer for ``camera`` on ``device``: loaded once per (package, device, precision) in this
    process, then reused. ``package``: a path or a shipped name (default: :func:`default_package`);
    ``precision``: float32 | bfloat16 | float16 (default: the enclosing :func:`compute_precision`, else the
    setting ``model_precision``, else float16 on CUDA and float32 on the CPU: ``package.compute_dtype_for``).

    Raises :class:`ModelMismatch` when the package does not serve ``camera`` or is not of ``architecture``.
    """
    path = resolve_package(package) if package is not None else default_package(camera)
    precision = precision or _precision.get() or _setting("model_precision")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = (str(path), str(dev), precision)
    with _lock:
        enhancer = _cache.get(key)
        if enhancer is None:
            enhancer = load_package(path, dev, precision=precision)
            if dev.type == "cuda":  # its weights' copies done before another thread's stream reads them
                torch.cuda.current_stream(dev).synchronize()
            _cache[key] = enhancer
            log.info("model package %s v%s (%s, rf %d) resident on %s", enhancer.manifest.name,
                     enhancer.manifest.version, enhancer.manifest.architecture, enhancer.receptive_field, dev)
    check_fits(enhancer.manifest, path.name, camera, architecture)
    return enhancer


def clear_cache() -> None:
    """Forget every resident package (tests; a worker never needs it)."""
    with _lock:
        _cache.clear()
        _manifests.clear()


__all__ = ["BEST_PACKAGE", "CLASSICAL_PACKAGE", "FRAMES_PACKAGES", "LEARNED_DEFAULTS", "PACKAGES_DIR", "TIERS",
           "clear_cache", "compute_precision", "default_package", "frames_package", "load_enhancer", "package_manifest",
           "package_ref", "resolve_package"]
