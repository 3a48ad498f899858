"""The Strata path of the quality benchmark: the project's real pipeline, once per model package.

``decode_raw`` -> ``shot_render_params`` -> ``render_mosaic``: the code the GPU workers run. Heavy imports
(torch, the pipeline) happen inside the functions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from lab.quality.shots import CAMERA, SPACE

CLASSICAL = "classical_v1"
LEARNED = "strata_jdd_v1"  # the fast tier
BEST = "strata_jdd_v2"  # the best tier (the default)
# the best tier as the service renders a single frame: two orientations on a clean shot (tier_orientations)
DEFAULT_PACKAGES = (f"{CLASSICAL}.strata", f"{LEARNED}.strata", f"{BEST}.strata", f"{BEST}.strata@auto")
AUTO = 0  # split_ensemble's count for ``@auto``


def split_ensemble(package: str) -> tuple[str, int]:
    """``PACKAGE@N`` (a package rendered as a self-ensemble of N orientations, N = 2, 4 or 8: the ``max`` tier is
    ``strata_jdd_v2.strata@4``) -> (PACKAGE, N); ``PACKAGE@auto`` (the orientations the ``best`` tier picks for the
    shot, :func:`~services.pipeline.models.registry.tier_orientations`) -> (PACKAGE, :data:`AUTO`); a plain package
    -> (package, 1)."""
    base, _, count = package.rpartition("@")
    if base and count.isdigit():
        return base, int(count)
    if base and count == "auto":
        return base, AUTO
    return package, 1


def package_label(package: str) -> str:
    """Method name of a package: its file stem (``classical_v1.strata`` -> ``classical_v1``), with ``@N`` for an
    ensemble of N orientations (``@auto``: as the best tier picks)."""
    base, n = split_ensemble(package)
    name = Path(base).name
    name = name[: -len(".strata")] if name.endswith(".strata") else name
    return f"{name}@auto" if n == AUTO else f"{name}@{n}" if n > 1 else name


def package_available(package: str) -> bool:
    """Whether the package resolves to an existing file or directory."""
    from services.pipeline.models.registry import resolve_package

    return resolve_package(split_ensemble(package)[0]).exists()


def decode(dng: Path, work: Path) -> tuple[Any, np.ndarray, float]:
    """``decode_raw`` in its sandboxed child: (RawMeta, mosaic, seconds)."""
    from services.raw.decode import decode_raw

    t0 = time.perf_counter()
    npy = work / f"{dng.parent.name}.npy"
    meta = decode_raw(dng, npy)
    mosaic = np.load(npy)
    npy.unlink(missing_ok=True)
    return meta, mosaic, time.perf_counter() - t0


def render_strata(meta: Any, mosaic: np.ndarray, package: str, device: str,
                  sharpen_amount: float | None = None) -> tuple[np.ndarray, float]:
    """The real pipeline: ``shot_render_params`` (sRGB, IQ3_S, ``package``, ``PACKAGE@N`` an ensemble of N
    orientations, ``PACKAGE@auto`` as the best tier picks) -> ``render_mosaic``; (image, s).

    ``sharpen_amount`` overrides the pipeline's unsharp-mask amount (a diagnostic; None keeps the default).
    """
    from dataclasses import replace

    import torch

    from services.pipeline.models.registry import tier_orientations
    from services.pipeline.render import render_mosaic
    from services.pipeline.shot import shot_render_params
    from services.raw.meta import snr_db

    t0 = time.perf_counter()
    package, orientations = split_ensemble(package)
    params = shot_render_params(meta, mosaic, SPACE, CAMERA, model=package)
    if orientations == AUTO:
        orientations = tier_orientations("best", package, snr_db(params.noise_shot, params.noise_read))
    params = replace(params, orientations=orientations)
    if sharpen_amount is not None:
        params = replace(params, sharpen_amount=sharpen_amount)
    out = render_mosaic(mosaic, params, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def warm_up(package: str, device: str) -> None:
    """Load the package onto the device once, so timings exclude loading (workers keep packages resident)."""
    from services.pipeline.models.registry import load_enhancer

    load_enhancer(CAMERA, device, package=split_ensemble(package)[0])
