"""Host <-> GPU copies of large arrays through pinned staging slots per device, host copies on threads.

Pageable copies of a stack's group accumulators are slow; through a pinned buffer they move at PCIe speed, and
the host side (a memory map or a fresh array, page faults included) is copied into/out of the pinned slots by a
few threads while the device copies the previous slot (the measured gain: docs/PERFORMANCE.md, "Choices
measured"). Each contiguous host row block is copied once; short blocks (rows of a crop) share a slot. On the
CPU these are plain conversions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

import numpy as np
import torch

STAGING_BYTES = 64 << 20
SLOTS = 4  # pinned slots per staging buffer
STAGING_BUFFERS = 3  # pinned staging buffers per device: transfers of that many threads at once
_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {np.dtype(np.int32): torch.int32, np.dtype(np.uint16): torch.uint16,
                                               np.dtype(np.uint8): torch.uint8}
_staging_lock = threading.Lock()


class _Staging:
    """A device's pinned host staging buffers (made on first need, up to :data:`STAGING_BUFFERS`, kept for the
    process) and the threads that copy host memory in and out of their slots. A transfer holds one buffer; a
    shard's download no longer waits for another shard's upload or download to finish (a worker computing
    several shards at once, each storing its rows and tiles)."""

    def __init__(self, device: torch.device) -> None:
        self.free: list[torch.Tensor] = []
        self.made = 0
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(SLOTS * 2, thread_name_prefix=f"strata-copy-{device}")

    @contextlib.contextmanager
    def buffer(self) -> Iterator[torch.Tensor]:
        with self.cond:
            while not self.free and self.made >= STAGING_BUFFERS:
                self.cond.wait()
            if self.free:
                raw = self.free.pop()
            else:
                raw = torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
                self.made += 1
        try:
            yield raw
        finally:
            with self.cond:
                self.free.append(raw)
                self.cond.notify()


_staging: dict[str, _Staging] = {}


def _pinned(device: torch.device) -> _Staging:
    """The device's staging buffers and copy threads (one set per process)."""
    with _staging_lock:
        if str(device) not in _staging:
            _staging[str(device)] = _Staging(device)
        return _staging[str(device)]


def _blocks(arr: np.ndarray) -> list[np.ndarray]:
    """Contiguous 1-D views covering ``arr`` in C order: the whole array, or one per leading index."""
    if arr.flags.c_contiguous:
        return [arr.reshape(-1)]
    return [b for sub in arr for b in _blocks(sub)]


def _chunks(arr: np.ndarray, size: int) -> list[list[np.ndarray]]:
    """``arr`` in C order as chunks of at most ``size`` elements, each a list of 1-D views (short blocks share)."""
    chunks: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    filled = 0
    for block in _blocks(arr):
        start = 0
        while start < block.size:
            n = min(size - filled, block.size - start)
            current.append(block[start : start + n])
            filled, start = filled + n, start + n
            if filled == size:
                chunks.append(current)
                current, filled = [], 0
    if current:
        chunks.append(current)
    return chunks


def _fill(slot: np.ndarray, pieces: Sequence[np.ndarray]) -> int:
    at = 0
    for piece in pieces:
        np.copyto(slot[at : at + piece.size], piece)  # releases the GIL
        at += piece.size
    return at


def _stage_in(arr: np.ndarray, slots: Sequence[np.ndarray], flush: Callable[[int, int, int], object],
              pool: ThreadPoolExecutor) -> None:
    """Copy ``arr`` in C order through ``slots``: threads fill the slots ahead; ``flush(offset, n, slot)`` runs
    in order on this thread once a slot holds the ``n`` elements at flat ``offset`` of ``arr``, and must be done
    with the slot when it returns."""
    chunks = _chunks(arr, slots[0].size)
    pending: dict[int, Future[int]] = {}
    for k in range(min(len(slots), len(chunks))):
        pending[k] = pool.submit(_fill, slots[k], chunks[k])
    offset = 0
    for k in range(len(chunks)):
        n = pending.pop(k).result()
        flush(offset, n, k % len(slots))
        offset += n
        if k + len(slots) < len(chunks):
            pending[k + len(slots)] = pool.submit(_fill, slots[k % len(slots)], chunks[k + len(slots)])


def _stage_out(size: int, slots: Sequence[np.ndarray], fetch: Callable[[int, int, int], object],
               put: Callable[[int, np.ndarray], object], pool: ThreadPoolExecutor | None) -> None:
    """Move ``size`` flat elements out through ``slots``: ``fetch(offset, n, slot)`` puts elements [offset,
    offset + n) into the slot (on this thread, in order), then ``put(offset, elements)`` takes them from the slot:
    on a ``pool`` thread while the next slot is fetched, or on this thread in order (``pool`` None)."""
    step = slots[0].size
    pending: list[Future[object] | None] = [None] * len(slots)
    for k, start in enumerate(range(0, size, step)):
        s = k % len(slots)
        if (previous := pending[s]) is not None:
            previous.result()
        n = min(step, size - start)
        fetch(start, n, s)
        if pool is None:
            put(start, slots[s][:n])
        else:
            pending[s] = pool.submit(put, start, slots[s][:n])
    for p in pending:
        if p is not None:
            p.result()


def _slots(raw: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    per = raw.numel() // SLOTS
    return [raw[i * per : (i + 1) * per].view(dtype) for i in range(SLOTS)]


def upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host int32, uint16 or uint8 array (a memory map or a slice of one) as a tensor of that dtype on
    ``device``."""
    if arr.dtype not in _TORCH_DTYPES:
        raise TypeError(f"upload takes int32, uint16 or uint8 arrays, got {arr.dtype}")
    if device.type != "cuda":
        host = np.ascontiguousarray(arr)
        return torch.from_numpy(host if host.flags.writeable else host.copy()).to(device)
    dtype = _TORCH_DTYPES[arr.dtype]
    out = torch.empty(arr.shape, dtype=dtype, device=device)
    flat_out = out.reshape(-1)
    staging = _pinned(device)
    with staging.buffer() as raw:
        bufs = _slots(raw, dtype)
        _stage_in(arr, [b.numpy().view(arr.dtype) for b in bufs],
                  lambda offset, n, s: flat_out[offset : offset + n].copy_(bufs[s][:n]), staging.pool)  # synchronous
    return out


def _host_dtype(tensor: torch.Tensor) -> np.dtype:
    found = [k for k, v in _TORCH_DTYPES.items() if v == tensor.dtype]
    if not found:
        raise TypeError(f"download takes int32, uint16 or uint8 tensors, got {tensor.dtype}")
    return found[0]


def download(tensor: torch.Tensor, out: np.ndarray | None = None) -> np.ndarray:
    """A device int32, uint16 or uint8 tensor as a host array: ``out`` (C-contiguous, same shape and dtype; e.g.
    a writable memory map, so the bytes land in the file's pages in one copy) or a new array."""
    dtype = _host_dtype(tensor)
    if out is None:
        out = np.empty(tuple(tensor.shape), dtype=dtype)
    elif out.shape != tuple(tensor.shape) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {dtype} {tuple(tensor.shape)}, got {out.dtype} {out.shape}")
    if tensor.device.type != "cuda":
        np.copyto(out, tensor.cpu().numpy())
        return out
    flat_out = out.reshape(-1)
    _through_slots(tensor, lambda at, part: np.copyto(flat_out[at : at + part.size], part), threaded=True)
    return out


def download_to(tensor: torch.Tensor, f: BinaryIO) -> None:
    """Write a device int32, uint16 or uint8 tensor's elements (C order, native byte order) to the binary file
    ``f`` through the pinned slots, in order: a stream (:meth:`services.storage.base.Storage.array_stream`), so
    no fresh memory map's pages are faulted in."""
    _host_dtype(tensor)
    if tensor.device.type != "cuda":
        f.write(tensor.contiguous().cpu().numpy().tobytes())
        return
    _through_slots(tensor, lambda _at, part: f.write(part.data), threaded=False)


def download_each(tensor: torch.Tensor, consumers: Sequence[Callable[[memoryview], object]]) -> None:
    """Hand a device int32, uint16 or uint8 tensor's bytes (C order) to every one of ``consumers``, in order, each on
    a thread of its own (a file's write and its SHA-256): through the pinned slots, a slot filled again once every
    consumer has taken it, so the device copies, the writes and the hash overlap and the slowest sets the pace (one
    after the other per slot, the hash and the write of an 80 MP TIFF took 0.33-0.44 s where the hash alone takes
    0.33 on an H100 host)."""
    dtype = _host_dtype(tensor)
    if tensor.device.type != "cuda":
        whole = tensor.contiguous().cpu().numpy().view(np.uint8).reshape(-1).data
        for consume in consumers:
            consume(whole)
        return
    flat = tensor.reshape(-1)
    with _pinned(tensor.device).buffer() as raw:
        bufs = _slots(raw, tensor.dtype)
        _stage_each(flat.numel(), [b.numpy().view(dtype) for b in bufs],
                    lambda offset, n, s: bufs[s][:n].copy_(flat[offset : offset + n]), consumers)


def _stage_each(size: int, slots: Sequence[np.ndarray], fetch: Callable[[int, int, int], object],
                consumers: Sequence[Callable[[memoryview], object]]) -> None:
    """Move ``size`` flat elements out through ``slots``: ``fetch(offset, n, slot)`` fills a slot (on this thread,
    in order) once every consumer is done with what it held; each consumer takes the slots' bytes in order on its
    own thread. The first error of a consumer is raised."""
    step = slots[0].size
    held: list[list[Future[object]]] = [[] for _ in slots]
    threads = [ThreadPoolExecutor(1, thread_name_prefix="strata-take") for _ in consumers]
    try:
        for k, start in enumerate(range(0, size, step)):
            s = k % len(slots)
            for taken in held[s]:
                taken.result()
            n = min(step, size - start)
            fetch(start, n, s)
            part = slots[s][:n].view(np.uint8).data
            held[s] = [thread.submit(consume, part) for thread, consume in zip(threads, consumers, strict=True)]
        for futures in held:
            for taken in futures:
                taken.result()
    finally:
        for thread in threads:
            thread.shutdown(wait=True, cancel_futures=True)


def _through_slots(tensor: torch.Tensor, put: Callable[[int, np.ndarray], object], threaded: bool) -> None:
    flat = tensor.reshape(-1)
    dtype = _host_dtype(tensor)
    staging = _pinned(tensor.device)
    with staging.buffer() as raw:
        bufs = _slots(raw, tensor.dtype)
        _stage_out(flat.numel(), [b.numpy().view(dtype) for b in bufs],
                   lambda offset, n, s: bufs[s][:n].copy_(flat[offset : offset + n]),  # synchronous
                   put, staging.pool if threaded else None)


PREFAULT_THREADS = 8
PREFAULT_BLOCK = 16 << 20  # bytes per zero-fill task
_prefault_pool: ThreadPoolExecutor | None = None


def prefault(arr: np.ndarray) -> Callable[[], None]:
    """Start touching every page of a fresh writable memory map (``arr``, C-contiguous) on background threads;
    returns a wait function to call before the real bytes are written into it.

    A new file's pages are allocated on first write, which made downloading a group accumulator into a fresh
    memory-mapped ``.npy`` several times slower than into touched memory (``scripts/gpu/io_probe.py``,
    docs/PERFORMANCE.md). Zero-filling the map while the GPU merges (numpy releases the GIL for the fill,
    torch while it waits on the device) moves that allocation off the critical path.
    """
    global _prefault_pool
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError("prefault needs a writable C-contiguous array")
    flat = arr.reshape(-1).view(np.uint8)
    with _staging_lock:
        if _prefault_pool is None:
            _prefault_pool = ThreadPoolExecutor(PREFAULT_THREADS, thread_name_prefix="strata-prefault")
        pool = _prefault_pool
    futures = [pool.submit(flat[i : i + PREFAULT_BLOCK].fill, 0) for i in range(0, flat.size, PREFAULT_BLOCK)]

    def wait() -> None:
        for f in futures:
            f.result()

    return wait


__all__ = ["PREFAULT_THREADS", "SLOTS", "STAGING_BYTES", "download", "download_each", "prefault", "upload"]
