"""16-bit TIFF output: tiled, compressed on a thread pool, with the output space's ICC profile."""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import tifffile

from services.storage import Storage

TILE = 256


@lru_cache(maxsize=8)
def icc_profile(colour_space: str) -> bytes:
    """ICC profile bytes for an output colour space: lcms's built-in sRGB via Pillow, else our v2 builder."""
    from PIL import ImageCms

    from services.export.icc import build_icc_profile

    if colour_space == "srgb":
        return bytes(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    return build_icc_profile(colour_space)  # ValueError for an unknown space


def encode_threads(configured: int) -> int:
    return configured if configured > 0 else max(os.cpu_count() or 1, 1)


def write_tiff(
    storage: Storage,
    key: str,
    rgb: np.ndarray,
    *,
    colour_space: str = "srgb",
    compression: str | None = "zstd",
    threads: int = 0,
    software: str = "Strata",
) -> tuple[str, int]:
    """Write ``rgb`` (H, W, 3) uint16 to ``key`` atomically; returns (sha256, bytes).

    Tiles are compressed by ``threads`` workers (tifffile's thread pool; zstd releases the GIL) into memory;
    the file is then hashed on a second thread while it is written (no second read of the file).
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint16:
        raise ValueError(f"expected (H, W, 3) uint16, got {rgb.shape} {rgb.dtype}")
    buf = io.BytesIO()
    tifffile.imwrite(
        buf,
        rgb,
        photometric="rgb",
        tile=(TILE, TILE),
        compression=compression,
        compressionargs={"level": 3} if compression == "zstd" else None,
        predictor=None,
        maxworkers=encode_threads(threads),
        iccprofile=icc_profile(colour_space),
        software=software,
        metadata=None,
    )
    with buf.getbuffer() as data, ThreadPoolExecutor(1) as pool:
        digest = pool.submit(lambda: hashlib.sha256(data).hexdigest())  # hashlib releases the GIL
        with storage.writer(key) as f:
            f.write(data)
        return digest.result(), len(data)
