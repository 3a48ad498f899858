"""TIFF tiles compressed on the GPU: the horizontal predictor and deflate (nvCOMP) for a rendered strip, so the
16-bit TIFF's encode (the longest CPU step of a job: about 9 core-seconds for an 80 MP frame with libdeflate)
leaves the CPU.

A strip's tile rows that lie wholly inside it (and the image's last, partial one) are cut into
``TILE_H x TILE_W`` tiles (edge tiles zero-padded, as TIFF stores them), each put through TIFF Predictor 2
(each sample minus the same sample of the pixel to its left, per tile row) and compressed into one zlib stream
(RFC 1950: a 2-byte header, nvCOMP's raw deflate, the Adler-32 of the tile, computed on the GPU too): the
stream a TIFF reader inflates for Compression 8 (Adobe deflate). Tiles are small enough (48 KiB) for one
nvCOMP deflate chunk. Tile rows that straddle two strips are compressed by the writer on the CPU.

The result is two intermediates beside the strip (:func:`services.storage.keys.tile_keys`): the streams back to
back (uint8) and an index: ``[TILE_H, TILE_W, first tile row, tile rows, tiles per row, offsets...]`` (int64,
one offset per tile and the end). :func:`cpu_tile_streams` makes the same container with libdeflate (tests, and
the reference the GPU output is checked against). Pixels are identical either way; the bytes differ by encoder.

Status: on for every job by default (``STRATA_GPU_DEFLATE=on``) where the nvCOMP wheel is installed.
The nvCOMP calls run correctly on an H200 (scripts/gpu/check_tiles.py: every tile inflates exact, the TIFF reads
back exact). An 80 MP frame takes 0.185 s on the device path (scripts/gpu/profile_tiles.py; nvCOMP itself 0.07 s);
the streams come back through the pinned slots (a pageable copy took 0.29 s). Through the service a batch with a
proof per shot ran at 1.08 frames/s against 0.79 with the CPU's libdeflate, and an idle 80 MP shot took 1.29 s
against 1.53 s (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import logging
import threading
import zlib
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from services.pipeline.ops._checks import small
from services.pipeline.transfer import download, upload

log = logging.getLogger(__name__)

TILE_H, TILE_W = 64, 128  # 64 x 128 x 3 x 2 bytes = 48 KiB: one nvCOMP deflate chunk (<= 64 KiB)
HEADER = 5  # index entries before the offsets
_ADLER = 65521
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest-compression flag (header check bits valid)
_CHUNK = 24  # tile rows per nvCOMP call: 1536 image rows


def tile_rows_in(y0: int, y1: int, height: int) -> range:
    """The tile rows (indices) a strip of rows ``[y0, y1)`` of an image ``height`` rows tall holds whole: those
    inside it, and the last (partial) tile row of the image when the strip ends the image."""
    first = -(-y0 // TILE_H)
    last = y1 // TILE_H if y1 < height else -(-height // TILE_H)
    return range(first, max(first, last))


def _tiled(rows: torch.Tensor, tile_rows: range, y0: int) -> torch.Tensor:
    """(rows, W, 3) uint16 (as int32) -> (n, TILE_H, TILE_W, 3) int32 tiles of ``tile_rows``, zero-padded, with
    the horizontal predictor applied (mod 2**16)."""
    width = rows.shape[1]
    top, bottom = tile_rows.start * TILE_H - y0, tile_rows.stop * TILE_H - y0
    tx = -(-width // TILE_W)
    block = torch.zeros((bottom - top, tx * TILE_W, 3), dtype=torch.int32, device=rows.device)
    avail = min(bottom, rows.shape[0]) - top
    block[:avail, :width] = rows[top : top + avail]
    tiles = block.view(len(tile_rows), TILE_H, tx, TILE_W, 3).permute(0, 2, 1, 3, 4).reshape(-1, TILE_H, TILE_W, 3)
    diff = tiles.clone()
    diff[:, :, 1:] -= tiles[:, :, :-1]
    return diff & 0xFFFF


def _adler32(tile_bytes: torch.Tensor) -> torch.Tensor:
    """Adler-32 of each row of ``tile_bytes`` ((n, L) uint8 on any device) as int64, in chunks of tiles."""
    n, length = tile_bytes.shape
    weights = torch.arange(length, 0, -1, dtype=torch.int64, device=tile_bytes.device)  # L - i
    out = torch.empty(n, dtype=torch.int64, device=tile_bytes.device)
    for i in range(0, n, 512):
        b = tile_bytes[i : i + 512].to(torch.int64)
        a = (1 + b.sum(dim=1)) % _ADLER
        s = (length + (b * weights).sum(dim=1)) % _ADLER
        out[i : i + 512] = (s << 16) | a
    return out


def _to_bytes(tiles: torch.Tensor) -> torch.Tensor:
    """(n, TILE_H, TILE_W, 3) predictor output -> (n, L) uint8: each tile's little-endian uint16 samples."""
    lo = (tiles & 0xFF).to(torch.uint8)
    hi = (tiles >> 8).to(torch.uint8)
    return torch.stack((lo, hi), dim=-1).reshape(tiles.shape[0], -1)


def _container(streams: list[bytes], tile_rows: range, per_row: int) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(streams) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in streams], out=offsets[1:])
    index = np.concatenate([np.array([TILE_H, TILE_W, tile_rows.start, len(tile_rows), per_row], np.int64), offsets])
    return np.frombuffer(b"".join(streams), dtype=np.uint8), index


def cpu_tile_streams(rows: np.ndarray, y0: int, height: int, level: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The container of :func:`gpu_tile_streams`, made on the CPU with zlib-format libdeflate (tests, reference)."""
    import imagecodecs

    tile_rows = tile_rows_in(y0, y0 + rows.shape[0], height)
    per_row = -(-rows.shape[1] // TILE_W)
    if not len(tile_rows):
        return _container([], tile_rows, per_row)
    tiles = _tiled(torch.from_numpy(np.ascontiguousarray(rows)).to(torch.int32), tile_rows, y0)
    data = _to_bytes(tiles).numpy()
    streams = [bytes(imagecodecs.deflate_encode(t, level=level)) for t in data]
    return _container(streams, tile_rows, per_row)


_CODEC_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _codec(device_index: int, algorithm_type: int) -> Any:
    from nvidia import nvcomp  # type: ignore[import-not-found]  # optional: the GPU hosts' nvidia-nvcomp wheel

    return nvcomp.Codec(algorithm="Deflate", algorithm_type=algorithm_type, device_id=device_index,
                        bitstream_kind=nvcomp.BitstreamKind.RAW, uncomp_chunk_size=TILE_H * TILE_W * 6)


class _Interface:
    """Only the CUDA array interface of ``obj`` (a torch tensor, an nvCOMP array), kept alive with it: arrays
    cross between torch and nvCOMP as views, never by DLPack (whose hand-over of ownership freed memory twice)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.__cuda_array_interface__ = obj.__cuda_array_interface__


def gpu_available(device: str) -> bool:
    """Whether tiles can be compressed on ``device``: a CUDA device and nvCOMP importable."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    try:
        from nvidia import nvcomp  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def zlib_pack(flat: torch.Tensor, sizes: torch.Tensor, checks: torch.Tensor) -> torch.Tensor:
    """Raw deflate streams back to back (``flat`` uint8, stream i ``sizes[i]`` bytes) -> the n zlib streams back to
    back (RFC 1950: the 2-byte header, the stream, the big-endian Adler-32 ``checks[i]``), on ``flat``'s device:
    a few vectorised operations for any number of tiles (no Python loop per tile)."""
    dev = flat.device
    sizes = sizes.to(device=dev, dtype=torch.int64)
    n = sizes.numel()
    framed_sizes = sizes + 6
    starts = torch.cumsum(framed_sizes, 0) - framed_sizes  # where each zlib stream begins
    out = torch.empty(int(framed_sizes.sum()), dtype=torch.uint8, device=dev)
    out[starts], out[starts + 1] = _ZLIB_HEADER[0], _ZLIB_HEADER[1]
    src_starts = torch.cumsum(sizes, 0) - sizes
    shift = torch.repeat_interleave(starts + 2 - src_starts, sizes, output_size=flat.numel())
    out[torch.arange(flat.numel(), device=dev) + shift] = flat
    shifts = small([24, 16, 8, 0], dev, torch.int64)
    trailer = ((checks.to(device=dev, dtype=torch.int64)[:, None] >> shifts) & 0xFF).to(torch.uint8)
    out[(starts + 2 + sizes)[:, None] + torch.arange(4, device=dev)] = trailer
    return out if n else out[:0]


def zlib_wrap(payload: torch.Tensor, sizes: torch.Tensor, checks: torch.Tensor) -> torch.Tensor:
    """:func:`zlib_pack` of raw streams held at a fixed stride (``payload`` (n, stride) uint8, stream i in the first
    ``sizes[i]`` bytes of row i), as nvCOMP leaves them."""
    return zlib_pack(_compact(payload, sizes), sizes, checks)


def _compact(payload: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The first ``sizes[i]`` bytes of each row of ``payload`` ((n, stride) uint8), back to back."""
    keep = torch.arange(payload.shape[1], device=payload.device)[None, :] < sizes.to(payload.device)[:, None]
    return payload[keep]


class _Raw:
    """``nbytes`` of device memory at ``ptr`` as a uint8 CUDA array (kept alive by ``owner``)."""

    def __init__(self, ptr: int, nbytes: int, owner: Any) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


ENCODE_PATH: list[str] = []  # how the last chunk's streams came back (scripts/gpu/check_tiles.py prints it)


def _encode_chunk(codec: Any, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nvCOMP raw deflate of each row of ``data`` ((n, L) uint8 on a CUDA device): the n raw streams back to back
    (uint8 on the device) and their sizes. The input is one contiguous buffer carved by an offset table
    (``nvcomp.as_arrays(buffer, offsets, sizes)``); the output goes into one carved buffer too where nvCOMP takes
    it, else into its own allocation (read at a fixed stride where its entries have one)."""
    from nvidia import nvcomp

    n, length = data.shape
    dev = data.device
    srcs = nvcomp.as_arrays(_Interface(data.reshape(-1)), [i * length for i in range(n)], [length] * n)
    torch.cuda.current_stream(dev).synchronize()  # nvCOMP runs on its own stream: this one's rows must be there
    stride = _align16(length * 23 // 10 + 4096)  # nvCOMP 6 asks 111200 bytes for a 49152-byte deflate chunk
    out = torch.empty((n, stride), dtype=torch.uint8, device=dev)
    try:
        dst = nvcomp.as_arrays(_Interface(out.reshape(-1)), [i * stride for i in range(n)], [stride] * n)
        with _CODEC_LOCK:  # one codec per device, shared by a worker's threads (STRATA_GPU_WORKER_THREADS)
            encoded = codec.encode(srcs, out=dst)
            sizes = _sizes(encoded)  # reading the sizes waits for the compression
        ENCODE_PATH[:] = ["one carved output buffer"]
        return _compact(out, sizes), sizes
    except (ValueError, TypeError) as exc:
        del out
        ENCODE_PATH[:] = [f"nvCOMP's own output ({type(exc).__name__}: {exc})"]
    with _CODEC_LOCK:
        encoded = codec.encode(srcs)
        sizes = _sizes(encoded)
    ptrs = np.array([encoded[i].__cuda_array_interface__["data"][0] for i in range(n)], dtype=np.int64)
    steps = np.diff(ptrs)
    if n > 1 and (steps == steps[0]).all() and steps[0] >= int(sizes.max()):
        ENCODE_PATH.append(f"fixed stride {int(steps[0])}")
        block = torch.as_tensor(_Raw(int(ptrs[0]), int(steps[0]) * n, encoded), device=dev)
        return _compact(block.view(n, int(steps[0])), sizes), sizes  # a copy: boolean indexing
    ENCODE_PATH.append("entry by entry")
    flat = torch.cat([torch.as_tensor(_Raw(int(p), int(k), encoded), device=dev) for p, k in zip(ptrs, sizes.tolist(),
                                                                                              strict=True)])
    return flat, sizes


def _sizes(encoded: Any) -> torch.Tensor:
    sizes = encoded.buffer_sizes
    return torch.tensor(list(sizes() if callable(sizes) else sizes), dtype=torch.int64)


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def gpu_tile_streams(rows: np.ndarray | torch.Tensor, y0: int, height: int, device: str, algorithm_type: int = 2
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The strip's whole tile rows (see the module) predicted and deflated on ``device`` with nvCOMP; returns
    (streams, index) on the host (:func:`device_tile_streams`, then one pinned download)."""
    blob, index = device_tile_streams(rows, y0, height, device, algorithm_type)
    return download(blob), index


def device_tile_streams(rows: np.ndarray | torch.Tensor, y0: int, height: int, device: str,
                        algorithm_type: int = 2) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`gpu_tile_streams` with the streams left on the device (uint8), for the caller to download where
    they go (e.g. straight into the storage file's map through the pinned slots: a pageable ``.cpu()`` of the
    frame's 370 MB took 0.29 s of the 0.43 s on an H200, the deflate 0.07 s). ``rows``: the strip's (rows, W, 3)
    uint16, on the host or already on the device. Works through ``_CHUNK`` tile rows at a time (bounded device
    memory); the zlib framing is made on the device."""
    dev = torch.device(device)
    tile_rows = tile_rows_in(y0, y0 + rows.shape[0], height)
    per_row = -(-rows.shape[1] // TILE_W)
    if not len(tile_rows):
        blob, index = _container([], tile_rows, per_row)
        return torch.from_numpy(blob).to(dev), index
    codec = _codec(dev.index or 0, algorithm_type)
    parts: list[torch.Tensor] = []
    all_sizes: list[torch.Tensor] = []
    for first in range(tile_rows.start, tile_rows.stop, _CHUNK):
        chunk = range(first, min(first + _CHUNK, tile_rows.stop))
        top, bottom = chunk.start * TILE_H - y0, min(chunk.stop * TILE_H - y0, rows.shape[0])
        part = rows[top:bottom]
        gpu = (part.to(dev) if isinstance(part, torch.Tensor) else upload(part, dev)).to(torch.int32)
        data = _to_bytes(_tiled(gpu, chunk, y0 + top)).contiguous()
        checks = _adler32(data)
        flat, sizes = _encode_chunk(codec, data)
        parts.append(zlib_pack(flat, sizes, checks))
        all_sizes.append(sizes + len(_ZLIB_HEADER) + 4)
        del gpu, data, flat
    offsets = np.zeros(sum(len(s) for s in all_sizes) + 1, dtype=np.int64)
    np.cumsum(torch.cat(all_sizes).numpy(), out=offsets[1:])
    index = np.concatenate([np.array([TILE_H, TILE_W, tile_rows.start, len(tile_rows), per_row], np.int64),
                            offsets])
    return (torch.cat(parts) if len(parts) > 1 else parts[0]), index


def check_streams(blob: np.ndarray, index: np.ndarray, rows: np.ndarray, y0: int, sample: int = 8) -> None:
    """Inflate ``sample`` tiles of a container and compare them with ``rows``' predicted tiles (GPU checks)."""
    tile_rows = range(int(index[2]), int(index[2] + index[3]))
    tiles = _to_bytes(_tiled(torch.from_numpy(np.ascontiguousarray(rows)).to(torch.int32), tile_rows, y0)).numpy()
    offsets = index[HEADER:]
    for i in np.linspace(0, len(tiles) - 1, min(sample, len(tiles))).astype(int):
        got = zlib.decompress(bytes(blob[offsets[i] : offsets[i + 1]]))
        if got != tiles[i].tobytes():
            raise AssertionError(f"tile {i} does not inflate to its predicted samples")


__all__ = ["HEADER", "TILE_H", "TILE_W", "check_streams", "cpu_tile_streams", "device_tile_streams", "gpu_available",
           "gpu_tile_streams",
           "tile_rows_in", "zlib_pack", "zlib_wrap"]
