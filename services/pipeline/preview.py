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

from services.raw.colour import clip_highlights_raw

LONG_EDGE = 1600
_PREVIEW_CHUNK = 16  # output rows per task of strips_preview
_BAND_BYTES = 1 << 21  # mosaic bytes per band of bin_mosaic: about a core's L2 cache
# Position of R, G, G, B in a 2x2 CFA block (row-major) for each pattern.
_SITES = {"RGGB": "RGGB", "BGGR": "BGGR", "GRBG": "GRBG", "GBRG": "GBRG"}


def bin_factor(height: int, width: int, long_edge: int = LONG_EDGE) -> int:
    """Extra binning after the 2x2 step so the binned long edge is the smallest one still >= ``long_edge``
    (at least 1)."""
    return max(1, max(height, width) // 2 // long_edge)


def bin_shift(factor: int) -> int:
    """Low bits dropped from each 16-bit sample before binning, so the sum of ``factor**2`` samples per CFA site
    fits 16 bits: ``factor**2 <= 2**shift`` (4 for the 80 MP frame's factor 3: 12 bits a sample are kept, far
    finer than an 8-bit preview shows, and the truncation's mean is added back)."""
    return max(0, (factor * factor - 1).bit_length())


def _threads(threads: int) -> int:
    return threads or min(8, os.cpu_count() or 1)


class MosaicBinner:
    """Bin sums of a Bayer mosaic for the fast preview, fed in bands of rows in any order and from any thread
    (numpy releases the GIL): the decoder hands it each band right after copying it
    (:func:`services.raw.fast_dng.decode_fast`), or :func:`bin_mosaic` feeds it a stored mosaic.

    ``sums`` is (h, w, 4) uint16: per ``2*factor`` block, the sum over its ``factor**2`` samples of each CFA site
    (row-major 2x2 order) of ``sample >> shift`` (:func:`bin_shift`). 16-bit lanes keep every step vectorised:
    rows are added as whole contiguous rows, then column pairs as one 32-bit lane (two 16-bit sums that cannot
    carry into each other). On the dev VM an 80 MP frame bins in about half the time of 32-bit strided sums.

    :meth:`start` sizes it for the frame; a band begins at a multiple of :attr:`block` rows (:meth:`band_rows`
    says how many rows a band should hold); rows past the last whole block, and columns past the last whole block,
    are dropped. :attr:`ready` is set by whoever fed the whole frame (:meth:`finish`)."""

    def __init__(self, long_edge: int = LONG_EDGE) -> None:
        self.long_edge = long_edge
        self.factor = self.shift = 0
        self.sums: np.ndarray | None = None
        self.ready = False

    @property
    def block(self) -> int:
        return 2 * self.factor

    def start(self, height: int, width: int, factor: int = 0) -> None:
        self.factor = factor or bin_factor(height, width, self.long_edge)
        self.shift = bin_shift(self.factor)
        h, w = height // self.block, width // self.block
        if h == 0 or w == 0:
            raise ValueError(f"mosaic {height}x{width} is smaller than one {self.block}x{self.block} block")
        self.sums = np.empty((h, w, 4), dtype=np.uint16)
        self.ready = False

    def band_rows(self, width: int, itemsize: int = 2) -> int:
        """Rows per band: whole blocks, about ``_BAND_BYTES`` of mosaic (a core's L2 cache)."""
        return self.block * max(1, _BAND_BYTES // (self.block * width * itemsize))

    def add(self, row0: int, rows: np.ndarray) -> None:
        """Bin the mosaic rows ``[row0, row0 + len(rows))``; ``row0`` a multiple of :attr:`block`."""
        assert self.sums is not None and row0 % self.block == 0, "start() first; bands begin on a block"
        b0 = row0 // self.block
        b1 = min(self.sums.shape[0], (row0 + rows.shape[0]) // self.block)
        if b1 <= b0:
            return
        f, n, w = self.factor, b1 - b0, self.sums.shape[1]
        cols = w * self.block
        shifted = np.right_shift(rows[: n * self.block, :cols], self.shift, dtype=np.uint16)
        by_row = shifted.reshape(n, f, 2, cols)  # block, row pair within it, CFA row, column
        rowsum = by_row[:, 0].copy()
        for a in range(1, f):
            rowsum += by_row[:, a]
        pairs = rowsum.view(np.uint32).reshape(n, 2, w, f)  # a CFA column pair as one 32-bit lane
        colsum = pairs[..., 0].copy()
        for b in range(1, f):
            colsum += pairs[..., b]
        self.sums[b0:b1] = colsum.view(np.uint16).reshape(n, 2, w, 2).transpose(0, 2, 1, 3).reshape(n, w, 4)

    def finish(self) -> None:
        self.ready = True

    def feed(self, mosaic: np.ndarray, threads: int = 0) -> MosaicBinner:
        """Bin a whole (H, W) mosaic (it may be memory-mapped), in bands on ``threads`` threads (default: the
        cores, up to 8: the H200 host's vCPUs scale poorly past that, scripts/gpu/preview_probe.py)."""
        if mosaic.ndim != 2:
            raise ValueError(f"mosaic must be (H, W), got {mosaic.shape}")
        if self.sums is None:
            self.start(*mosaic.shape)
        step = self.band_rows(mosaic.shape[1], mosaic.itemsize)
        rows = range(0, self.sums.shape[0] * self.block, step)  # type: ignore[union-attr]
        threads = _threads(threads)
        if threads == 1 or len(rows) == 1:
            for r0 in rows:
                self.add(r0, mosaic[r0 : r0 + step])
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="strata-preview") as pool:
                list(pool.map(lambda r0: self.add(r0, mosaic[r0 : r0 + step]), rows))
        self.finish()
        return self

    def means(self) -> np.ndarray:
        """(h, w, 4) float32 means of each CFA site (the dropped low bits' mean added back)."""
        assert self.sums is not None
        step = np.float32(1 << self.shift)
        return self.sums.astype(np.float32) * (step / np.float32(self.factor**2)) + (step - 1) / 2


def bin_mosaic(mosaic: np.ndarray, factor: int, threads: int = 0) -> np.ndarray:
    """(H, W) Bayer mosaic -> (h, w, 4) float32 means of each CFA site (row-major 2x2 order) over blocks of
    ``2*factor`` rows and columns, to within the dropped low bits (:class:`MosaicBinner`)."""
    if mosaic.ndim != 2:
        raise ValueError(f"mosaic must be (H, W), got {mosaic.shape}")
    binner = MosaicBinner()
    binner.start(mosaic.shape[0], mosaic.shape[1], factor)
    return binner.feed(mosaic, threads).means()


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


def _nearest(size: int, out: int) -> np.ndarray:
    """Indices of ``out`` samples of ``size`` (out <= size), each the one nearest its output pixel's centre."""
    return np.minimum(((np.arange(out) + 0.5) * (size / out)).astype(np.intp), size - 1)


def mosaic_preview(mosaic: np.ndarray, *, cfa: str, black: Sequence[float], white: float, gains: Sequence[float],
                   srgb_from_wb_cam: np.ndarray, long_edge: int = LONG_EDGE) -> np.ndarray:
    """The fast preview of a decoded mosaic: (h, w, 3) uint8 sRGB, long edge ``long_edge`` or less for a small
    frame (:func:`binned_preview`)."""
    return binned_preview(MosaicBinner(long_edge).feed(mosaic), cfa=cfa, black=black, white=white, gains=gains,
                          srgb_from_wb_cam=srgb_from_wb_cam, long_edge=long_edge)


def binned_preview(binner: MosaicBinner, *, cfa: str, black: Sequence[float], white: float,
                   gains: Sequence[float], srgb_from_wb_cam: np.ndarray, long_edge: int = LONG_EDGE,
                   threads: int = 0) -> np.ndarray:
    """A fed :class:`MosaicBinner` -> (h, w, 3) uint8 sRGB, long edge ``long_edge`` (or less for a small
    frame): the block nearest each output pixel, camera RGB as one (4 -> 3) matrix and offset on the sums (the
    dropped bits, black levels, the mean, greens averaged, clipped to [0, 1]), then the gains and the shot's matrix
    as one 3x3, then the sRGB table; in bands of rows on ``threads`` threads."""
    if cfa not in _SITES:
        raise ValueError(f"unsupported CFA {cfa!r}")
    assert binner.sums is not None, "feed the binner first"
    sums, step = binner.sums, float(1 << binner.shift)
    w, h = fit_size(sums.shape[0], sums.shape[1], long_edge)
    if (h, w) != sums.shape[:2]:  # the nearest block to each output pixel: the blocks are box means already, and
        # the JPEG writer's resize of the last few percent cost more than the colour of the whole preview
        sums = np.take(np.take(sums, _nearest(sums.shape[0], h), axis=0), _nearest(sums.shape[1], w), axis=1)
    sites: list[list[tuple[int, float]]] = [[], [], []]  # per camera channel: (CFA site, weight of its sum)
    offset = np.zeros(3, dtype=np.float32)
    for i, colour in enumerate(cfa):
        weight = (0.5 if colour == "G" else 1.0) / (white - max(black))
        sites["RGB".index(colour)].append((i, weight * step / binner.factor**2))
        offset["RGB".index(colour)] += weight * (black[i] - (step - 1) / 2)
    # The gains and the matrix as one 3x3, scaled to the sRGB table's steps.
    to_srgb = (np.asarray(gains, dtype=np.float32)[:, None] * np.asarray(srgb_from_wb_cam, dtype=np.float32).T
               * np.float32(_LUT_SIZE - 1))
    out = np.empty((h, w, 3), dtype=np.uint8)
    rows = max(1, (1 << 16) // max(1, w))  # about 64k pixels a band

    def band(r0: int) -> None:
        # Element-wise on planes, no matrix product: numpy's BLAS would start its own threads inside each of ours.
        values = sums[r0 : r0 + rows].astype(np.float32)
        n = values.shape[0]
        cam = np.empty((3, n, w), dtype=np.float32)
        for c, parts in enumerate(sites):
            np.multiply(values[..., parts[0][0]], np.float32(parts[0][1]), out=cam[c])
            for i, k in parts[1:]:
                cam[c] += values[..., i] * np.float32(k)
        cam -= offset[:, None, None]
        np.clip(cam, 0.0, 1.0, out=cam)
        clip_highlights_raw(cam, gains)  # blown highlights white, as in the render
        level = np.empty((n, w), dtype=np.float32)
        for c in range(3):
            np.multiply(cam[0], to_srgb[0, c], out=level)
            level += cam[1] * to_srgb[1, c]
            level += cam[2] * to_srgb[2, c]
            np.clip(level, 0.0, np.float32(_LUT_SIZE - 1), out=level)
            level += np.float32(0.5)
            out[r0 : r0 + n, :, c] = np.take(_SRGB_LUT, level.astype(np.int32))

    threads = _threads(threads)
    if threads == 1 or h <= rows:
        for r0 in range(0, h, rows):
            band(r0)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="strata-preview") as pool:
            list(pool.map(band, range(0, h, rows)))
    return out


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
    clip_highlights_raw(cam, gains, axis=-1)
    return srgb_encode(colour_rgb(cam, gains, srgb_from_wb_cam))


def preview_factor(height: int, width: int, long_edge: int = LONG_EDGE) -> int:
    """The integer box factor of :func:`strips_preview` for an image of this size."""
    return max(1, max(height, width) // long_edge)


def _premade_sums(premade: Sequence[tuple[int, np.ndarray]], blocks: int, out_w: int) -> np.ndarray | None:
    """The block sums of the whole preview from ``premade`` ((first block row, sums) per strip, made by the GPU
    workers: :func:`services.pipeline.binning.preview_sums`) when they cover every block row in order, else None
    (a strip boundary inside a block: the caller sums the rows itself)."""
    parts, row = [], 0
    for first, sums in sorted(premade, key=lambda p: p[0]):
        if first != row or sums.ndim != 3 or sums.shape[1:] != (out_w, 3):
            return None
        parts.append(sums)
        row += sums.shape[0]
    return np.concatenate(parts) if parts and row == blocks else None


def strips_preview(bands: Sequence[tuple[int, np.ndarray]], long_edge: int = LONG_EDGE, threads: int = 0,
                   premade: Sequence[tuple[int, np.ndarray]] = ()) -> np.ndarray:
    """Box downscale of the final render's strips ((y0, (rows, W, 3) uint16 sRGB-encoded), in order) to uint8,
    by an integer factor whose result's long edge is >= ``long_edge`` where the image allows it. Each chunk of
    output rows first adds its ``factor`` image rows (contiguous, vectorised), then the columns of that one row
    sum (a ``factor``-th of the data); chunks on ``threads`` threads (default: the cores, up to 8). A generic
    ``sum(axis=(1, 3))`` over the whole frame took 2.4 s of one core for 80 MP, holding a coordinator slot.
    ``premade``: the block sums the GPU workers made beside their strips; used when they cover the whole image
    (the same bytes, without reading the render again)."""
    height = sum(rows.shape[0] for _, rows in bands)
    width = bands[0][1].shape[1]
    factor = preview_factor(height, width, long_edge)
    out_w = width // factor
    sums = _premade_sums(premade, height // factor, out_w) if premade and out_w else None
    if sums is not None:
        return _to_uint8(sums, factor)
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

    threads = _threads(threads)
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="strata-preview") as pool:
        list(pool.map(reduce, jobs))
    return _to_uint8(out, factor)


def _to_uint8(sums: np.ndarray, factor: int) -> np.ndarray:
    """Block sums of 16-bit codes -> the 8-bit means."""
    return np.round(sums / np.float32(factor * factor * 257.0)).clip(0, 255).astype(np.uint8)


def fit_size(height: int, width: int, long_edge: int = LONG_EDGE) -> tuple[int, int]:
    """(w, h) scaled so the long edge is ``long_edge`` (never up)."""
    scale = min(1.0, long_edge / max(height, width))
    return max(1, math.floor(width * scale + 0.5)), max(1, math.floor(height * scale + 0.5))
