"""Linear-light box bins of a rendered image: the first, costly step of every resized output (a proof).

A resized output (:mod:`services.export.derive`) decodes the 16-bit codes of its space to linear light through a
lookup, averages ``k x k`` blocks, then filters the small result to its size. The bins are most of the work
(every pixel of the render, about 4 core-seconds for an 80 MP frame): a GPU worker makes them for the bin rows
wholly inside its strip right after rendering it (:func:`binned` on the device, stored beside the strip,
:func:`services.storage.keys.bin_key`), and the writer computes only the bin rows that straddle two strips. The
same function runs on the CPU, so both paths compute the same thing (float32 means; the devices may round the
last bit differently).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch

from services.pipeline.ops import decode_transfer
from services.pipeline.transfer import upload

_CHUNK_BINS = 128  # bin rows per step: bounded float temporaries


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
    bins = bin_rows_in(y0, y0 + rows.shape[0], k) if bins is None else bins
    wk = rows.shape[1] // k
    out = np.empty((len(bins), wk, 3), dtype=np.float32)
    if not len(bins) or wk == 0:
        return out
    dev = torch.device(device)
    lut = decode_lut(transfer).to(dev)
    for j, j1, codes in _code_chunks(rows, y0, k, bins, dev, torch.int64):
        lin = lut[codes]
        if k > 1:  # the k x k box mean, on the interleaved layout (no transposed copy)
            lin = lin.view(j1 - j, k, wk, k, 3).mean(dim=(1, 3))
        out[j - bins.start : j1 - bins.start] = lin.cpu().numpy()
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


__all__ = ["bin_rows_in", "binned", "decode_lut", "preview_sums"]
