"""TIFF output (16 or 8 bits): tiled, compressed on a thread pool, with the output space's ICC profile and the
shot's tags (:mod:`services.export.metadata`).

Compression: ``deflate`` (the default; TIFF Compression 8 with the horizontal predictor, readable everywhere),
``lzw`` (5, with the predictor), ``zstd`` (50000, level 3, no predictor) or ``none``."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

import imagecodecs
import numpy as np
import tifffile

from services.export.icc import icc_profile
from services.storage import Storage

TILE = 256


COMPRESSIONS: dict[str, tuple[str | None, int | None, dict | None]] = {  # name: (tifffile codec, predictor, args)
    "none": (None, None, None),
    "deflate": ("adobe_deflate", 2, None),
    "lzw": ("lzw", 2, None),
    "zstd": ("zstd", None, {"level": 3}),
}


def tiff_compression(name: str | None) -> tuple[str | None, int | None, dict | None]:
    """tifffile's (compression, predictor, compressionargs) for a recipe's compression name."""
    spec = COMPRESSIONS.get(str(name or "none").lower())
    if spec is None:
        raise ValueError(f"unknown TIFF compression {name!r}; expected one of {sorted(COMPRESSIONS)}")
    return spec


def encode_threads(configured: int) -> int:
    return configured if configured > 0 else max(os.cpu_count() or 1, 1)


Bands = Sequence[tuple[int, np.ndarray]]  # (first row, (rows, W, 3) uint16 or uint8) in order, covering the image


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
    width, row, dtype = bands[0][1].shape[1], 0, bands[0][1].dtype
    for top, rows in bands:
        if (rows.ndim != 3 or rows.shape[1:] != (width, 3) or rows.dtype != dtype
                or dtype not in (np.uint16, np.uint8) or top != row):
            raise ValueError(f"bands must be consecutive (rows, {width}, 3) uint16 or uint8 from row 0; got one at "
                             f"row {top} {rows.shape} {rows.dtype} after row {row}")
        row += rows.shape[0]
    return row, width


def write_tiff(
    storage: Storage,
    key: str,
    rgb: np.ndarray | Bands,
    *,
    colour_space: str = "srgb",
    compression: str | None = "deflate",
    threads: int = 0,
    software: str = "Strata",
    ppi: float | None = None,
    description: str | None = None,
    extratags: Sequence[tuple] = (),
) -> tuple[str, int]:
    """Write ``rgb`` (H, W, 3) uint16 or uint8 to ``key`` atomically; returns (sha256, bytes).

    ``rgb`` may also be the image's row bands, ``[(first row, (rows, W, 3) array), ...]`` in order (a job's
    strips, memory-mapped): their tiles are compressed straight from the bands, never stitched.
    Tiles are compressed by ``threads`` workers (tifffile's thread pool; zstd releases the GIL) straight into the
    storage file; the file is then hashed from the page cache on a second thread while the writer makes it
    durable (fsync): faster than through an in-memory buffer (docs/PERFORMANCE.md, "Choices measured").
    """
    source, shape, dtype = _source(rgb)
    data: np.ndarray | Iterator[np.ndarray] | Iterator[bytes] = source
    codec, predictor, codec_args = tiff_compression(compression)
    if codec == "adobe_deflate":  # pre-compressed with libdeflate on our own threads (tifffile writes the bytes)
        data = _deflated_tiles(source if not isinstance(source, np.ndarray) else _tiles([(0, source)], *shape[:2]),
                               encode_threads(threads))

    def encode(f: BinaryIO) -> None:
        tifffile.imwrite(
            f, data, shape=shape, dtype=dtype, photometric="rgb", tile=(TILE, TILE),
            compression=codec, compressionargs=codec_args, predictor=predictor, maxworkers=encode_threads(threads),
            iccprofile=icc_profile(colour_space), software=software, description=description,
            resolution=None if ppi is None else (ppi, ppi), resolutionunit=None if ppi is None else "INCH",
            extratags=list(extratags), metadata=None,
        )

    return write_hashed(storage, key, encode)


DEFLATE_LEVEL = 6  # libdeflate: the size of zlib's level 6 at about twice its speed (docs/PERFORMANCE.md)


def _deflate_tile(tile: np.ndarray) -> bytes:
    """One TILE x TILE tile (edge tiles zero-padded, as TIFF stores them) through the horizontal predictor
    (TIFF Predictor 2: each sample minus the same sample of the pixel to its left) and zlib-format deflate."""
    if tile.shape[:2] != (TILE, TILE):
        padded = np.zeros((TILE, TILE, tile.shape[2]), dtype=tile.dtype)
        padded[: tile.shape[0], : tile.shape[1]] = tile
        tile = padded
    return bytes(imagecodecs.deflate_encode(imagecodecs.delta_encode(np.ascontiguousarray(tile), axis=-2),  # type: ignore[arg-type]
                                            level=DEFLATE_LEVEL))


def _deflated_tiles(tiles: Iterator[np.ndarray], threads: int) -> Iterator[bytes]:
    """The tiles compressed on ``threads`` threads (libdeflate releases the GIL), in order, a bounded number
    ahead (so a large image never has all its compressed tiles waiting in memory)."""
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-deflate") as pool:
        ahead: deque[Future[bytes]] = deque()
        for tile in tiles:
            ahead.append(pool.submit(_deflate_tile, tile))
            if len(ahead) >= 4 * max(1, threads):
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def _source(rgb: np.ndarray | Bands) -> tuple[np.ndarray | Iterator[np.ndarray], tuple[int, ...], np.dtype]:
    """What tifffile writes: the whole array, or the bands' tiles; with the image's shape and dtype."""
    if isinstance(rgb, np.ndarray):
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype not in (np.uint16, np.uint8):
            raise ValueError(f"expected (H, W, 3) uint16 or uint8, got {rgb.shape} {rgb.dtype}")
        return rgb, rgb.shape, rgb.dtype
    height, width = _check_bands(rgb)
    return _tiles(rgb, height, width), (height, width, 3), rgb[0][1].dtype


def write_hashed(storage: Storage, key: str, encode: Callable[[BinaryIO], object]) -> tuple[str, int]:
    """Run ``encode`` into a new storage object ``key`` (atomic, durable); returns (sha256, bytes). The file is
    hashed from the page cache on a second thread while the writer makes it durable (fsync)."""
    with ThreadPoolExecutor(1) as pool:
        with storage.file_writer(key) as f:  # tifffile seeks back; hashed from a map of the file
            encode(f)
            size = f.seek(0, os.SEEK_END)
            f.flush()
            written = _mapped(f, size)
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
