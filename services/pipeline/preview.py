"""Previews: small sRGB images of a shot, as pure functions on the CPU (numpy).

Two sources:

* :func:`mosaic_preview` -- the fast path at ingest, from the decoded reference mosaic: each block of
  ``2f x 2f`` photosites is summed per CFA site (2x2 binning, then ``f x f`` more: one pass over the mosaic,
  a free reshape of it), levels normalised, white balance and the shot's camera -> sRGB matrix applied, sRGB
  encoded. It does not wait for the render (no demosaic, no model).
* :func:`strips_preview` -- at finalize, a box downscale of the final render's sRGB-encoded strips.

Both return (h, w, 3) uint8 with a long edge of at most ``long_edge`` (the writer resizes to it exactly).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

LONG_EDGE = 1600
_PREVIEW_CHUNK = 16  # output rows per task of strips_preview
_BAND_BYTES = 1 << 21  # mosaic bytes per band of bin_mosaic: about a core's L2 cache
# Position of R, G, G, B in a 2x2 CFA block (row-major) for each pattern.
_SITES = {"RGGB": "RGGB", "BGGR": "BGGR", "GRBG": "GRBG", "GBRG": "GBRG"}


def bin_factor(height: int, width: int, long_edge: int = LONG_EDGE) -> int:
    """Extra binning after the 2x2 step so the binned long edge is the smallest one still >= ``long_edge``
    (at least 1)."""
    return max(1, max(height, width) // 2 // long_edge)


def bin_mosaic(mosaic: np.ndarray, factor: int, threads: int = 0) -> np.ndarray:
    """(H, W) Bayer mosaic -> (h, w, 4) float32 means of each CFA site (see :func:`bin_sums`)."""
    return bin_sums(mosaic, factor, threads).astype(np.float32) / np.float32(factor * factor)


def bin_sums(mosaic: np.ndarray, factor: int, threads: int = 0) -> np.ndarray:
    """(H, W) Bayer mosaic -> (h, w, 4) uint32 sums of each CFA site (row-major 2x2 order) over blocks of
    ``2*factor`` rows and columns; the last partial block of rows/columns is dropped. Strided views added up
    in place: no copy of the mosaic (it may be memory-mapped). Small bands of rows (about ``_BAND_BYTES`` of the
    mosaic each, so a band stays in a core's L2 cache across its ``4 * factor**2`` passes) on ``threads`` threads
    (default: the cores, up to 8; numpy releases the GIL). Bands a quarter of the frame each, as before, left the
    band in the shared L3 at best: 268 ms on 8 threads of the H200 host for an 80 MP frame. On that host (16
    vCPUs) 4-8 threads are fastest (99-111 ms from a mapped file), 16 slower (175 ms): scripts/gpu/preview_probe.py."""
    if mosaic.ndim != 2:
        raise ValueError(f"mosaic must be (H, W), got {mosaic.shape}")
    block = 2 * factor
    h, w = mosaic.shape[0] // block, mosaic.shape[1] // block
    if h == 0 or w == 0:
        raise ValueError(f"mosaic {mosaic.shape} is smaller than one {block}x{block} block")
    acc = np.zeros((h, w, 4), dtype=np.uint32)
    step = max(1, _BAND_BYTES // (block * mosaic.shape[1] * mosaic.itemsize))

    def band(r0: int) -> None:
        r1 = min(r0 + step, h)
        rows, out = mosaic[r0 * block : r1 * block], acc[r0:r1]
        for a in range(factor):
            for b in range(factor):
                for site in range(4):
                    p, q = divmod(site, 2)
                    out[..., site] += rows[a * 2 + p :: block, b * 2 + q :: block][: r1 - r0, :w]

    threads = threads or min(8, os.cpu_count() or 1)
    if threads == 1 or h <= step:
        for r0 in range(0, h, step):
            band(r0)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="strata-preview") as pool:
            list(pool.map(band, range(0, h, step)))
    return acc


def _srgb_curve(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)


_LUT_SIZE = 8192  # linear steps of the encode table: finer than 8-bit sRGB needs anywhere on the curve
_SRGB_LUT = np.round(_srgb_curve(np.linspace(0.0, 1.0, _LUT_SIZE)) * 255.0).astype(np.uint8)


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    """Linear [0, 1] -> sRGB-encoded uint8 (IEC 61966-2-1), through a table (no per-pixel power)."""
    index = (np.clip(linear, 0.0, 1.0) * np.float32(_LUT_SIZE - 1) + np.float32(0.5)).astype(np.int32)
    return _SRGB_LUT[index]


def colour_rgb(cam: np.ndarray, gains: Sequence[float], srgb_from_wb_cam: np.ndarray) -> np.ndarray:
    """Camera RGB -> linear sRGB: white balance gains, then the shot's 3x3 matrix."""
    wb = cam * np.asarray(gains, dtype=np.float32)
    return np.clip(wb @ np.asarray(srgb_from_wb_cam, dtype=np.float32).T, 0.0, 1.0)


def mosaic_preview(mosaic: np.ndarray, *, cfa: str, black: Sequence[float], white: float, gains: Sequence[float],
                   srgb_from_wb_cam: np.ndarray, long_edge: int = LONG_EDGE) -> np.ndarray:
    """The fast preview of a decoded mosaic: (h, w, 3) uint8 sRGB, long edge in [long_edge, 2*long_edge) or
    less for a small frame."""
    factor = bin_factor(mosaic.shape[0], mosaic.shape[1], long_edge)
    sums = bin_sums(mosaic, factor)
    h, w = sums.shape[:2]
    # Camera RGB as one (4 -> 3) matrix and offset on the sums (black levels, the mean, greens averaged, clipped to
    # [0, 1]), then colour_rgb as one 3x3 with the gains folded in: two small matrix products, no per-site passes.
    if cfa not in _SITES:
        raise ValueError(f"unsupported CFA {cfa!r}")
    scale = 1.0 / ((white - max(black)) * factor * factor)
    to_cam = np.zeros((4, 3), dtype=np.float32)
    for i, colour in enumerate(cfa):
        to_cam[i, "RGB".index(colour)] = scale * (0.5 if colour == "G" else 1.0)
    offset = (np.asarray(black, dtype=np.float32) * np.float32(factor * factor)) @ to_cam
    cam = sums.reshape(-1, 4).astype(np.float32) @ to_cam
    cam -= offset
    np.clip(cam, 0.0, 1.0, out=cam)
    to_srgb = (np.asarray(gains, dtype=np.float32)[:, None] * np.asarray(srgb_from_wb_cam, dtype=np.float32).T)
    return srgb_encode(cam @ to_srgb).reshape(h, w, 3)


def linear_preview(image: np.ndarray, *, black: Sequence[float], white: float, gains: Sequence[float],
                   srgb_from_wb_cam: np.ndarray, long_edge: int = LONG_EDGE) -> np.ndarray:
    """The fast preview of a linear DNG's (H, W, 3) image: means of ``2f x 2f`` blocks (the mosaic preview's
    size), levels, white balance, the shot's matrix, sRGB; (h, w, 3) uint8."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be (H, W, 3), got {image.shape}")
    block = 2 * bin_factor(image.shape[0], image.shape[1], long_edge)
    h, w = image.shape[0] // block, image.shape[1] // block
    if h == 0 or w == 0:
        raise ValueError(f"image {image.shape} is smaller than one {block}x{block} block")
    acc = np.zeros((h, w, 3), dtype=np.float64)
    for a in range(block):
        for b in range(block):
            acc += image[a::block, b::block][:h, :w]
    levels = np.asarray(black[:3], dtype=np.float32)
    cam = np.clip((acc.astype(np.float32) / np.float32(block * block) - levels) / (np.float32(white) - levels), 0, 1)
    return srgb_encode(colour_rgb(cam, gains, srgb_from_wb_cam))


def strips_preview(bands: Sequence[tuple[int, np.ndarray]], long_edge: int = LONG_EDGE, threads: int = 0
                   ) -> np.ndarray:
    """Box downscale of the final render's strips ((y0, (rows, W, 3) uint16 sRGB-encoded), in order) to uint8,
    by an integer factor whose result's long edge is >= ``long_edge`` where the image allows it. Each chunk of
    output rows first adds its ``factor`` image rows (contiguous, vectorised), then the columns of that one row
    sum (a ``factor``-th of the data); chunks on ``threads`` threads (default: the cores, up to 8). A generic
    ``sum(axis=(1, 3))`` over the whole frame took 2.4 s of one core for 80 MP, holding a coordinator slot."""
    height = sum(rows.shape[0] for _, rows in bands)
    width = bands[0][1].shape[1]
    factor = max(1, max(height, width) // long_edge)
    out_w = width // factor
    pieces: list[tuple[np.ndarray, int]] = []  # (rows to reduce, output rows), in order
    carry = np.zeros((0, width, 3), dtype=np.uint16)
    for _, rows in bands:
        data = np.concatenate([carry, np.asarray(rows)]) if carry.shape[0] else np.asarray(rows)
        usable = data.shape[0] // factor * factor
        if usable:
            pieces.append((data[:usable], usable // factor))
        carry = data[usable:]
    if not pieces or out_w == 0:
        return np.zeros((1, max(out_w, 1), 3), dtype=np.uint8)
    out = np.empty((sum(n for _, n in pieces), out_w, 3), dtype=np.float32)
    jobs, at = [], 0
    for data, n in pieces:
        for r0 in range(0, n, _PREVIEW_CHUNK):
            jobs.append((data, r0, min(r0 + _PREVIEW_CHUNK, n), at + r0))
        at += n

    def reduce(job: tuple[np.ndarray, int, int, int]) -> None:
        data, r0, r1, dst = job
        rows = np.ascontiguousarray(data[r0 * factor : r1 * factor]).reshape(r1 - r0, factor, width * 3)
        acc = rows[:, 0].astype(np.uint32)
        for a in range(1, factor):
            acc += rows[:, a]
        cols = acc[:, : out_w * factor * 3].reshape(r1 - r0, out_w, factor, 3)
        total = cols[:, :, 0].copy()
        for a in range(1, factor):
            total += cols[:, :, a]
        out[dst : dst + r1 - r0] = total

    threads = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-preview") as pool:
        list(pool.map(reduce, jobs))
    return np.round(out / np.float32(factor * factor * 257.0)).clip(0, 255).astype(np.uint8)


def fit_size(height: int, width: int, long_edge: int = LONG_EDGE) -> tuple[int, int]:
    """(w, h) scaled so the long edge is ``long_edge`` (never up)."""
    scale = min(1.0, long_edge / max(height, width))
    return max(1, math.floor(width * scale + 0.5)), max(1, math.floor(height * scale + 0.5))
