"""TIFF output (16 or 8 bits): tiled, compressed on a thread pool, with the output space's ICC profile and the
shot's tags (:mod:`services.export.metadata`).

Compression: ``deflate`` (the default; TIFF Compression 8 with the horizontal predictor, readable everywhere),
``lzw`` (5, with the predictor), ``zstd`` (50000, level 3, no predictor) or ``none``."""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import imagecodecs
import numpy as np
import tifffile

from services.export.icc import icc_profile
from services.pipeline import tiles
from services.storage import Storage

log = logging.getLogger(__name__)

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


def _tiles(bands: Bands, height: int, width: int, tile: tuple[int, int] = (TILE, TILE),
           rows: Iterable[int] | None = None) -> Iterator[np.ndarray]:
    """The image's ``tile`` (height, width) tiles in row-major order (of tile rows ``rows``, default all), as
    views of the bands (joined where a tile straddles two): tifffile copies and compresses them on its threads,
    so no stitched image is ever built."""
    th, tw = tile
    for ty in (range(0, height, th) if rows is None else (r * th for r in rows)):
        y1 = min(ty + th, height)
        parts = [(max(ty, top), min(y1, top + band.shape[0]), top, band) for top, band in bands
                 if top < y1 and top + band.shape[0] > ty]
        for tx in range(0, width, tw):
            views = [band[lo - top : hi - top, tx : tx + tw] for lo, hi, top, band in parts]
            yield views[0] if len(views) == 1 else np.concatenate(views)


PreTiled = Sequence[tuple[np.ndarray, np.ndarray]]  # (streams, index) per strip: services.pipeline.tiles
Pause = Callable[[], float]  # waits while the disk belongs to an interactive shot; the seconds it waited


class _Stored:
    """A GPU-compressed tile: bytes [start, end) of its strip's stored stream container (a memory map)."""

    __slots__ = ("blob", "end", "start")

    def __init__(self, blob: np.ndarray, start: int, end: int) -> None:
        self.blob, self.start, self.end = blob, start, end


def _pretiled_items(bands: Bands, height: int, width: int, pretiled: PreTiled
                    ) -> tuple[tuple[int, int], Iterator[_Stored | np.ndarray]]:
    """The tile geometry of GPU-compressed tiles and every tile in order: the stored stream where a strip's
    container holds its tile row, else the tile itself (a row straddling two strips), compressed by the caller."""
    th, tw = (int(v) for v in pretiled[0][1][:2])
    held: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
    for blob, index in pretiled:
        if (int(index[0]), int(index[1])) != (th, tw) or int(index[4]) != -(-width // tw):
            raise ValueError("GPU tile containers of different geometries in one image")
        for r in range(int(index[2]), int(index[2] + index[3])):
            held[r] = (blob, index, r - int(index[2]))

    def items() -> Iterator[_Stored | np.ndarray]:
        per_row = -(-width // tw)
        for r in range(-(-height // th)):
            if r in held:
                blob, index, local = held[r]
                offsets = index[tiles.HEADER + local * per_row : tiles.HEADER + (local + 1) * per_row + 1]
                for i in range(per_row):
                    yield _Stored(blob, int(offsets[i]), int(offsets[i + 1]))
            else:
                yield from _tiles(bands, height, width, (th, tw), [r])

    return (th, tw), items()


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
    pretiled: PreTiled = (),
    pause: Pause | None = None,
) -> tuple[str, int]:
    """Write ``rgb`` (H, W, 3) uint16 or uint8 to ``key`` atomically; returns (sha256, bytes).

    ``rgb`` may also be the image's row bands, ``[(first row, (rows, W, 3) array), ...]`` in order (a job's
    strips, memory-mapped): their tiles are compressed straight from the bands, never stitched.
    Tiles are compressed by ``threads`` workers (tifffile's thread pool; zstd releases the GIL) straight into the
    storage file; the file is then hashed from the page cache on a second thread while the writer makes it
    durable (fsync): faster than through an in-memory buffer (docs/PERFORMANCE.md, "Choices measured").
    ``pretiled``: deflate tiles the GPU already compressed (:mod:`services.pipeline.tiles`, one container per
    strip that has them); they are written as they are, in their geometry, and only the rest is compressed here.
    Such a file is laid out by tifffile first (:class:`_Layout`: header, IFD and tags, where each tile goes) and
    then written front to back straight from the stored streams while a second thread hashes the same bytes
    (:func:`write_segments`): no copy of each tile, no read-back after the write. ``pause``: called between
    chunks of the write and before its durable close (a batch-lane file yields the disk to interactive shots,
    :mod:`services.jobs.quiet`).
    """
    source, shape, dtype = _source(rgb)
    data: np.ndarray | Iterator[np.ndarray] | Iterator[bytes] = source
    codec = tiff_compression(compression)[0]
    tile = (TILE, TILE)
    laid_out = False
    if codec == "adobe_deflate" and pretiled and not isinstance(rgb, np.ndarray) and dtype == np.uint16:
        tile, data, laid_out = _with_stored_tiles(rgb, shape[0], shape[1], pretiled, encode_threads(threads))
    elif codec == "adobe_deflate":  # pre-compressed with libdeflate on our own threads (tifffile writes the bytes)
        whole = source if not isinstance(source, np.ndarray) else _tiles([(0, source)], shape[0], shape[1])
        data = _deflated_tiles(whole, encode_threads(threads))  # type: ignore[assignment]  # only bytes here

    tags = TiffTags(colour_space, software, ppi, description, tuple(extratags))

    def encode(f: BinaryIO) -> None:
        _imwrite(f, data, shape, dtype, tile, compression, encode_threads(threads), tags)

    if laid_out:
        t0 = time.perf_counter()
        layout = _Layout()
        encode(layout)  # type: ignore[arg-type]  # tifffile lays the file out; the tiles stay where they are
        segments = layout.segments()
        log.info("%s: laid out (%d tiles) in %.2fs", key, len(layout.placed), time.perf_counter() - t0)
        return write_segments(storage, key, segments, pause)
    return write_hashed(storage, key, encode, pause)


@dataclass(frozen=True)
class TiffTags:
    """What a TIFF records beside its pixels: the output space (its ICC profile) and the tags."""

    colour_space: str = "srgb"
    software: str = "Strata"
    ppi: float | None = None
    description: str | None = None
    extratags: tuple[tuple, ...] = ()


def _imwrite(f: BinaryIO, data: Any, shape: tuple[int, ...], dtype: np.dtype, tile: tuple[int, int],
             compression: str | None, threads: int, tags: TiffTags) -> None:
    codec, predictor, codec_args = tiff_compression(compression)
    tifffile.imwrite(
        f, data, shape=shape, dtype=dtype, photometric="rgb", tile=tile,
        compression=codec, compressionargs=codec_args, predictor=predictor, maxworkers=threads,
        iccprofile=icc_profile(tags.colour_space), software=tags.software, description=tags.description,
        resolution=None if tags.ppi is None else (tags.ppi, tags.ppi),
        resolutionunit=None if tags.ppi is None else "INCH", extratags=list(tags.extratags), metadata=None,
    )


def tiff_around(height: int, width: int, index: np.ndarray, tags: TiffTags) -> tuple[bytes, list[bytes]]:
    """The bytes a 16-bit deflate TIFF of a ``height`` x ``width`` image has before and after its tile data, when
    one container of GPU-compressed tiles (:mod:`services.pipeline.tiles`, ``index``) holds every tile: the file
    is then ``head``, the container's streams as they are, ``tail`` (bytes for bytes what :func:`write_tiff`
    writes from the same container and tags). A worker writes its strip's TIFF so, straight from the device."""
    rows = -(-height // int(index[0]))
    if int(index[2]) != 0 or int(index[3]) != rows:
        raise ValueError(f"the container holds tile rows {int(index[2])}..{int(index[2] + index[3])} of {rows}")
    tile, items = _pretiled_items([], height, width, [(_NO_BLOB, index)])
    layout = _Layout()
    _imwrite(layout, iter([_StandIn(t) for t in items]), (height, width, 3), np.dtype(np.uint16), tile,  # type: ignore[arg-type]
             "deflate", 1, tags)
    head, first, last, tail = layout.around()
    if (first, last) != (0, int(index[-1])):
        raise ValueError(f"tifffile placed the container's bytes {first}..{last}, expected 0..{int(index[-1])}")
    return head, tail


_NO_BLOB = np.empty(0, np.uint8)  # the container's stand-in when only the layout is made (never read)


def _with_stored_tiles(bands: Bands, height: int, width: int, pretiled: PreTiled, threads: int
                       ) -> tuple[tuple[int, int], Iterator[bytes], bool]:
    """The tile geometry, what tifffile is handed for the tiles, and whether the file is written in one pass
    (:class:`_Layout`): only when the stored streams hold all but the rows straddling their strips, since the pass
    keeps the tiles compressed here in memory until the write (the streamed path holds a few at a time)."""
    tile, items = _pretiled_items(bands, height, width, pretiled)
    tiled = _deflated_tiles(items, threads, tile)
    if -(-height // tile[0]) - sum(int(index[3]) for _, index in pretiled) <= len(pretiled):
        return tile, iter([_StandIn(t) for t in tiled]), True
    return tile, (bytes(memoryview(t.blob)[t.start : t.end]) if isinstance(t, _Stored) else t  # type: ignore[arg-type]
                  for t in tiled), False


DEFLATE_LEVEL = 1  # libdeflate 1: on noisy 16-bit renders both faster and smaller than 6 (docs/PERFORMANCE.md)


def _deflate_tile(tile: np.ndarray, size: tuple[int, int] = (TILE, TILE)) -> bytes:
    """One tile of ``size`` (edge tiles zero-padded, as TIFF stores them) through the horizontal predictor
    (TIFF Predictor 2: each sample minus the same sample of the pixel to its left) and zlib-format deflate."""
    if tile.shape[:2] != size:
        padded = np.zeros((*size, tile.shape[2]), dtype=tile.dtype)
        padded[: tile.shape[0], : tile.shape[1]] = tile
        tile = padded
    return bytes(imagecodecs.deflate_encode(imagecodecs.delta_encode(np.ascontiguousarray(tile), axis=-2),  # type: ignore[arg-type]
                                            level=DEFLATE_LEVEL))


def _deflated_tiles(items: Iterator[np.ndarray] | Iterator[np.ndarray | _Stored], threads: int,
                    size: tuple[int, int] = (TILE, TILE)) -> Iterator[bytes | _Stored]:
    """The tiles compressed on ``threads`` threads (libdeflate releases the GIL), in order, a bounded number
    ahead (so a large image never has all its compressed tiles waiting in memory); a stored stream passes
    through as it is."""
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-deflate") as pool:
        ahead: deque[Future[bytes] | bytes | _Stored] = deque()
        for item in items:
            if isinstance(item, _Stored):
                if not ahead:  # a stored stream with nothing before it: straight through (no queue, no Future:
                    yield item  # their overhead was about 0.1 s of an 80 MP frame's 9822 GPU tiles)
                    continue
                ahead.append(item)
            else:
                ahead.append(pool.submit(_deflate_tile, item, size))
            if len(ahead) >= 4 * max(1, threads):
                yield _ready(ahead.popleft())
        while ahead:
            yield _ready(ahead.popleft())


def _ready(tile: Future[bytes] | bytes | _Stored) -> bytes | _Stored:
    return tile.result() if isinstance(tile, Future) else tile


class _StandIn(bytes):
    """What tifffile is handed for a compressed tile when it only lays the file out (:class:`_Layout`): an empty
    ``bytes`` (tifffile tells pre-compressed tiles by that type) whose length is the tile's; the layout keeps the
    tile itself (a stored stream or compressed bytes) and where tifffile put it."""

    tile: bytes | _Stored
    n: int

    def __new__(cls, tile: bytes | _Stored) -> _StandIn:
        made = super().__new__(cls)
        made.tile, made.n = tile, tile.end - tile.start if isinstance(tile, _Stored) else len(tile)
        return made

    def __len__(self) -> int:
        return self.n


class _Layout(io.RawIOBase):
    """A file that tifffile writes into without the tile data: it keeps what tifffile writes itself (header, IFD,
    ICC profile, tags: small, some overwritten once the tiles' offsets are known) and where each tile goes. The
    file is then written front to back in one pass (:meth:`segments`), so its SHA-256 runs beside the write
    instead of reading the file back after it (0.19 s of an 80 MP frame's finalize on an H200 host)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = 0
        self.end = 0
        self.small: list[tuple[int, bytes]] = []
        self.placed: list[tuple[int, bytes | _Stored]] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = 0 if whence == os.SEEK_SET else self.pos if whence == os.SEEK_CUR else self.end
        self.pos = base + offset
        return self.pos

    def write(self, b: object) -> int:  # type: ignore[override]
        if type(b) is _StandIn:
            self.placed.append((self.pos, b.tile))
            n = b.n
        else:
            data = bytes(b)  # type: ignore[call-overload]
            self.small.append((self.pos, data))
            n = len(data)
        self.pos += n
        if self.pos > self.end:
            self.end = self.pos
        return n

    def around(self) -> tuple[bytes, int, int, list[bytes]]:
        """Where every tile is a stored stream of one container, in order: the bytes before the tiles, the
        container's first and last byte offsets placed, and the bytes after them (a gap as zeros)."""
        segments = self.segments()
        views = [s for s in segments if isinstance(s, memoryview)]
        if len(views) != 1 or not self.placed or not all(isinstance(t, _Stored) for _, t in self.placed):
            raise ValueError("the tiles are not one run of one container")
        first, last = self.placed[0][1], self.placed[-1][1]
        at = segments.index(views[0])
        return bytes(segments[0]), first.start, last.end, [bytes(s) for s in segments[at + 1 :]]  # type: ignore[union-attr]

    def segments(self) -> list[bytes | memoryview]:
        """The whole file in order: what tifffile wrote itself (later writes over earlier ones), the tiles where it
        put them (runs of consecutive stored streams as one slice of their container), zeros in any gap."""
        placed = sorted(self.placed, key=lambda p: p[0])
        data_start = placed[0][0] if placed else self.end
        head = bytearray(data_start)
        tail: list[tuple[int, bytes]] = []
        for pos, data in self.small:
            if pos + len(data) <= data_start:
                head[pos : pos + len(data)] = data
            else:
                tail.append((pos, data))
        out: list[bytes | memoryview] = [bytes(head)]
        at = data_start
        run: _Stored | None = None
        for pos, tile in placed:
            if pos != at:
                raise ValueError(f"tifffile placed a tile at {pos}, expected {at}")
            if isinstance(tile, _Stored) and run is not None and tile.blob is run.blob and tile.start == run.end:
                run.end = tile.end
            else:
                if run is not None:
                    out.append(memoryview(run.blob)[run.start : run.end])  # type: ignore[arg-type]
                run = _Stored(tile.blob, tile.start, tile.end) if isinstance(tile, _Stored) else None
                if run is None:
                    out.append(tile)  # type: ignore[arg-type]
            at += tile.end - tile.start if isinstance(tile, _Stored) else len(tile)
        if run is not None:
            out.append(memoryview(run.blob)[run.start : run.end])  # type: ignore[arg-type]
        for pos, data in sorted(tail, key=lambda t: t[0]):
            if pos < at:
                raise ValueError(f"tifffile wrote {len(data)} bytes at {pos}, inside the tiles (up to {at})")
            out += [bytes(pos - at), data]
            at = pos + len(data)
        return out


_WRITE_CHUNK = 8 << 20


def write_segments(storage: Storage, key: str, segments: Sequence[bytes | memoryview],
                   pause: Pause | None = None) -> tuple[str, int]:
    """Write ``segments`` in order to a new storage object ``key`` (atomic, durable) while a second thread hashes
    them; returns (sha256, bytes). Logs the times as :func:`write_hashed` does (the hash: the wait after the
    durable close), and the time ``pause`` (called before each chunk and before the close) waited."""
    t0 = time.perf_counter()
    waited = 0.0

    def sha256() -> str:
        h = hashlib.sha256()
        for segment in segments:
            h.update(segment)
        return h.hexdigest()

    with ThreadPoolExecutor(1) as pool:
        digest = pool.submit(sha256)
        with storage.writer(key) as f:
            for segment in segments:
                view = memoryview(segment)
                for at in range(0, len(view), _WRITE_CHUNK):  # bounded: an object store's part buffer stays small
                    waited += pause() if pause is not None else 0.0
                    f.write(view[at : at + _WRITE_CHUNK])
            waited += pause() if pause is not None else 0.0
            t_written = time.perf_counter()
        t_durable = time.perf_counter()
        hexdigest = digest.result()
    size = sum(len(s) if isinstance(s, bytes) else s.nbytes for s in segments)
    log.info("%s: %.1f MB encoded and written in %.2fs, durable %.2fs later, hashed %.2fs after that (one pass; "
             "%.2fs of it yielded to interactive shots)", key, size / 1e6, t_written - t0, t_durable - t_written,
             time.perf_counter() - t_durable, waited)
    return hexdigest, size


def _source(rgb: np.ndarray | Bands) -> tuple[np.ndarray | Iterator[np.ndarray], tuple[int, ...], np.dtype]:
    """What tifffile writes: the whole array, or the bands' tiles; with the image's shape and dtype."""
    if isinstance(rgb, np.ndarray):
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype not in (np.uint16, np.uint8):
            raise ValueError(f"expected (H, W, 3) uint16 or uint8, got {rgb.shape} {rgb.dtype}")
        return rgb, rgb.shape, rgb.dtype
    height, width = _check_bands(rgb)
    return _tiles(rgb, height, width), (height, width, 3), rgb[0][1].dtype


def write_hashed(storage: Storage, key: str, encode: Callable[[BinaryIO], object],
                 pause: Pause | None = None) -> tuple[str, int]:
    """Run ``encode`` into a new storage object ``key`` (atomic, durable); returns (sha256, bytes). The file is
    hashed from the page cache on a second thread while the writer makes it durable (fsync). Logs how long the
    encode, the durable close and the rest of the hash took (where a busy host's finalize time goes). ``pause``
    is called before the encode and before the durable close."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        with storage.file_writer(key) as f:  # tifffile seeks back; hashed from a map of the file
            if pause is not None:
                pause()
            encode(f)
            size = f.seek(0, os.SEEK_END)
            f.flush()
            written = _mapped(f, size)
            if written is not None:
                digest = pool.submit(hashlib.sha256, written)
            if pause is not None:
                pause()
            t_encoded = time.perf_counter()
        t_durable = time.perf_counter()
        if written is None:  # a backend whose writer cannot be mapped: read the object back
            h = hashlib.sha256()
            for chunk in storage.iter_chunks(key):
                h.update(chunk)
            return h.hexdigest(), size
        with written:
            hexdigest = digest.result().hexdigest()
    log.info("%s: %.1f MB encoded and written in %.2fs, durable %.2fs later, hashed %.2fs after that", key,
             size / 1e6, t_encoded - t0, t_durable - t_encoded, time.perf_counter() - t_durable)
    return hexdigest, size


def _mapped(f: BinaryIO, size: int) -> mmap.mmap | None:
    """A read-only map of the first ``size`` bytes of an open file, or None when it cannot be mapped."""
    try:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError, AttributeError):  # no descriptor, opened write-only, empty
        return None
