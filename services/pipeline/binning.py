"""Linear-light box bins of a rendered image: the first, costly step of every resized output (a proof).

A resized output (:mod:`services.export.derive`) decodes the 16-bit codes of its space to linear light through a
lookup, averages ``k x k`` blocks, then filters the small result to its size. The bins are most of the work
(every pixel of the render, about 4 core-seconds for an 80 MP frame): a GPU worker makes them for the bin rows
wholly inside its strip right after rendering it (:func:`binned` on the device, stored beside the strip,
:func:`services.storage.keys.bin_key`), and the writer computes only the bin rows that straddle two strips. The
same function runs on the CPU, so both paths compute the same thing (float32 means; the devices may round the
last bit differently).

The rest of a resized output, the filter from the bins to its size, the transfer's encoding, the output sharpening
and the quantisation (:func:`finish_resized`, :func:`quantise`), is small work on a GPU (milliseconds) but 0.6-1.1 s
of a coordinator's two threads for an 80 MP frame's proof under a batch (docs/PERFORMANCE.md): a worker whose strip
holds the whole image makes the finished output itself (:func:`proof_from_bins`), and the writer only encodes its
file.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from services.pipeline.ops import decode_transfer, encode_transfer, sharpen, to_uint16
from services.pipeline.transfer import upload

_CHUNK_BINS = 128  # bin rows per step: bounded float temporaries
OUTPUT_SHARPEN_SIGMA = 0.8


@lru_cache(maxsize=8)
def decode_lut(transfer: str) -> torch.Tensor:
    """uint16 code -> linear light float32 for ``transfer``, all 65536 codes (the per-pixel decode as a lookup)."""
    return decode_transfer(torch.arange(65536, dtype=torch.float32) / 65535.0, transfer).contiguous()


def bin_rows_in(y0: int, y1: int, k: int) -> range:
    """The bin rows (of ``k`` image rows each) that rows ``[y0, y1)`` hold whole."""
    first = -(-y0 // k)
    return range(first, max(first, y1 // k))


@torch.inference_mode()
def binned(rows: np.ndarray | torch.Tensor, y0: int, k: int, transfer: str, device: str = "cpu",
           bins: range | None = None) -> np.ndarray:
    """The ``k x k`` linear-light means of ``rows`` ((n, W, 3) uint16 codes of ``transfer``, the image's rows from
    ``y0``) for bin rows ``bins`` (default: all it holds whole): (len(bins), W // k, 3) float32. The last partial
    bin column is dropped. ``rows`` may be a tensor already on ``device`` (a worker's strip before its download:
    no second trip across the bus; the same values as from its host copy)."""
    return binned_on(rows, y0, k, transfer, device, bins).cpu().numpy()


@torch.inference_mode()
def binned_on(rows: np.ndarray | torch.Tensor, y0: int, k: int, transfer: str, device: str = "cpu",
              bins: range | None = None) -> torch.Tensor:
    """:func:`binned`, left on ``device`` (a float32 tensor)."""
    bins = bin_rows_in(y0, y0 + rows.shape[0], k) if bins is None else bins
    wk = rows.shape[1] // k
    dev = torch.device(device)
    out = torch.empty((len(bins), wk, 3), dtype=torch.float32, device=dev)
    if not len(bins) or wk == 0:
        return out
    lut = decode_lut(transfer).to(dev)
    for j, j1, codes in _code_chunks(rows, y0, k, bins, dev, torch.int64):
        lin = lut[codes]
        if k > 1:  # the k x k box mean, on the interleaved layout (no transposed copy)
            lin = lin.view(j1 - j, k, wk, k, 3).mean(dim=(1, 3))
        out[j - bins.start : j1 - bins.start] = lin
    return out


def _code_chunks(rows: np.ndarray | torch.Tensor, y0: int, k: int, bins: range, dev: torch.device,
                 dtype: torch.dtype) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(j, j1, codes)`` for bin rows ``[j, j1)`` of ``bins`` (up to :data:`_CHUNK_BINS` at a time): their
    ``k`` image rows each, whole bins wide, on ``dev`` as ``dtype`` (from a tensor there or a host array)."""
    wk = rows.shape[1] // k
    for j in range(bins.start, bins.stop, _CHUNK_BINS):
        j1 = min(j + _CHUNK_BINS, bins.stop)
        block = rows[j * k - y0 : j1 * k - y0, : wk * k]
        yield j, j1, (block.to(dev) if isinstance(block, torch.Tensor) else upload(block, dev)).to(dtype)


@torch.inference_mode()
def preview_sums(rows: np.ndarray | torch.Tensor, y0: int, factor: int, device: str = "cpu") -> np.ndarray:
    """The exact sums of ``factor x factor`` blocks of codes ((n, W, 3) uint16 rows of the image from ``y0``; a
    tensor already on ``device`` or a host array) for the block rows they hold whole: (blocks, W // factor, 3)
    float32, the sums :func:`services.pipeline.preview.strips_preview` makes (integers below 2**24: exact either
    way). A GPU worker makes them for the final preview beside its strip, so the coordinator does not read the
    whole render again."""
    blocks = bin_rows_in(y0, y0 + rows.shape[0], factor)
    wk = rows.shape[1] // factor
    out = np.empty((len(blocks), wk, 3), dtype=np.float32)
    if not len(blocks) or wk == 0:
        return out
    for j, j1, codes in _code_chunks(rows, y0, factor, blocks, torch.device(device), torch.int32):
        sums = codes.reshape(j1 - j, factor, wk, factor, 3).sum(dim=(1, 3), dtype=torch.int32)
        out[j - blocks.start : j1 - blocks.start] = sums.float().cpu().numpy()
    return out


def finish_resized(x: torch.Tensor, size: tuple[int, int], transfer: str, sharpen_amount: float = 0.0
                   ) -> torch.Tensor:
    """A resized output from its linear-light bins ``x`` ((1, 3, h', w') float32, any layout): the bicubic filter
    with antialiasing to ``size`` (h, w), clamped, encoded with ``transfer``, then the optional output sharpening.
    Returns (1, 3, h, w) float32 in [0, 1] on ``x``'s device."""
    h, w = size
    if (h, w) != tuple(x.shape[-2:]):
        x = F.interpolate(x, size=(h, w), mode="bicubic", antialias=True, align_corners=False).contiguous()
    else:
        x = x.contiguous()
    x = encode_transfer(x.clamp(0.0, 1.0), transfer)
    if sharpen_amount > 0 and min(h, w) > 2:
        x = sharpen(x, sharpen_amount, OUTPUT_SHARPEN_SIGMA)
    return x


def quantise(x: torch.Tensor, bits: int) -> np.ndarray:
    """(1, 3, h, w) encoded floats in [0, 1] -> (h, w, 3) uint8 or uint16 codes on the host (round half up)."""
    if bits == 16:
        codes = to_uint16(x)[0].permute(1, 2, 0)
    else:
        codes = torch.floor(x * 255.0 + 0.5).clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)
    return codes.contiguous().cpu().numpy()


@torch.inference_mode()
def proof_from_bins(bins: torch.Tensor, size: tuple[int, int], transfer: str, sharpen_amount: float, bits: int
                    ) -> np.ndarray:
    """The finished resized output (``(h, w, 3)`` codes of ``bits``, on the host) from the whole image's
    linear-light bins ((H // k, W // k, 3) float32 on any device, :func:`binned_on`), computed where they are: what
    the writer derives from the same bins (:func:`services.export.derive.resize_linear`), in the same
    channels-last layout."""
    return quantise(finish_resized(bins.permute(2, 0, 1)[None], size, transfer, sharpen_amount), bits)


__all__ = ["OUTPUT_SHARPEN_SIGMA", "bin_rows_in", "binned", "binned_on", "decode_lut", "finish_resized", "preview_sums",
           "proof_from_bins", "quantise"]
