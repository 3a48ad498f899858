"""16-bit TIFF output: tiled, compressed on a thread pool, with the output space's ICC profile."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import BinaryIO

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


Bands = Sequence[tuple[int, np.ndarray]]  # (first row, (rows, W, 3) uint16) in order, covering the image


def _tiles(bands: Bands, height: int, width: int) -> Iterator[np.ndarray]:
    """The image's TILE x TILE tiles in row-major order, as views of the bands (joined where a tile straddles
    two): tifffile copies and compresses them on its threads, so no stitched image is ever built."""
    for ty in range(0, height, TILE):
        y1 = min(ty + TILE, height)
        parts = [(max(ty, top), min(y1, top + rows.shape[0]), top, rows) for top, rows in bands
                 if top < y1 and top + rows.shape[0] > ty]
        for tx in range(0, width, TILE):
            views = [rows[lo - top : hi - top, tx : tx + TILE] for lo, hi, top, rows in parts]
            yield views[0] if len(views) == 1 else np.concatenate(views)


def _check_bands(bands: Bands) -> tuple[int, int]:
    if not bands:
        raise ValueError("no image bands")
    width, row = bands[0][1].shape[1], 0
    for top, rows in bands:
        if rows.ndim != 3 or rows.shape[1:] != (width, 3) or rows.dtype != np.uint16 or top != row:
            raise ValueError(f"bands must be consecutive (rows, {width}, 3) uint16 from row 0; got one at row {top} "
                             f"{rows.shape} {rows.dtype} after row {row}")
        row += rows.shape[0]
    return row, width


def write_tiff(
    storage: Storage,
    key: str,
    rgb: np.ndarray | Bands,
    *,
    colour_space: str = "srgb",
    compression: str | None = "zstd",
    threads: int = 0,
    software: str = "Strata",
) -> tuple[str, int]:
    """Write ``rgb`` (H, W, 3) uint16 to ``key`` atomically; returns (sha256, bytes).

    ``rgb`` may also be the image's row bands, ``[(first row, (rows, W, 3) array), ...]`` in order (a job's
    strips, memory-mapped): their tiles are compressed straight from the bands, never stitched.
    Tiles are compressed by ``threads`` workers (tifffile's thread pool; zstd releases the GIL) straight into the
    storage file; the file is then hashed from the page cache on a second thread while the writer makes it
    durable (fsync): faster than through an in-memory buffer (docs/PERFORMANCE.md, "Choices measured").
    """
    if isinstance(rgb, np.ndarray):
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint16:
            raise ValueError(f"expected (H, W, 3) uint16, got {rgb.shape} {rgb.dtype}")
        data: np.ndarray | Iterator[np.ndarray] = rgb
        shape = rgb.shape
    else:
        height, width = _check_bands(rgb)
        data, shape = _tiles(rgb, height, width), (height, width, 3)
    icc = icc_profile(colour_space)
    with ThreadPoolExecutor(1) as pool:
        with storage.file_writer(key) as f:  # tifffile seeks back; hashed from a map of the file
            tifffile.imwrite(
                f,
                data,
                shape=shape,
                dtype=np.uint16,
                photometric="rgb",
                tile=(TILE, TILE),
                compression=compression,
                compressionargs={"level": 3} if compression == "zstd" else None,
                predictor=None,
                maxworkers=encode_threads(threads),
                iccprofile=icc,
                software=software,
                metadata=None,
            )
            size = f.seek(0, os.SEEK_END)
            f.flush()
            written = _mapped(f, size)
            # Hash what was written (from the page cache) while the writer's exit makes it durable (fsync).
            if written is not None:
                digest = pool.submit(hashlib.sha256, written)
        if written is None:  # a backend whose writer cannot be mapped: read the object back
            h = hashlib.sha256()
            for chunk in storage.iter_chunks(key):
                h.update(chunk)
            return h.hexdigest(), size
        with written:
            return digest.result().hexdigest(), size


def _mapped(f: BinaryIO, size: int) -> mmap.mmap | None:
    """A read-only map of the first ``size`` bytes of an open file, or None when it cannot be mapped."""
    try:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError, AttributeError):  # no descriptor, opened write-only, empty
        return None
