"""Frame-group accumulators kept on the device that made them, for the stack strip that fuses them next.

A frame group's accumulator is stored (the job's durable intermediate, what another worker or a retry reads)
and, where enabled (``STRATA_RESIDENT_ACCUMULATORS``: on GPUs by default), also kept on the device. When the
stack's strip then runs in the same worker process on the same device (one GPU: the usual case), it takes the
kept tensor instead of loading the stored file and uploading it again (1 GB for 8 x 50 MP frames). One tensor per
device, the latest; a strip takes it (no second reader), a later group replaces it. The integers are the same
either way: the stored file is the kept tensor downloaded.

With ``STRATA_GROUP_STORE=background`` (the default) a kept accumulator is stored by a thread of the worker after
the group's task has finished (:func:`store_later`): its download and write (1.2 GB for a pixel-shift group,
0.44-0.48 s on an H200 host) overlap the strip that fuses it instead of delaying it. Until the file is published a
marker (:func:`~services.storage.keys.pending_key`) says it is on its way: a reader waits for it
(:func:`await_stored`; in this process, for the thread), and the removal of the job's intermediates waits for the
marker to go (the coordinator removes them after the job is done, so that wait costs no latency), so a file is
never written again into a folder just removed. A worker that dies before the file is written leaves a marker that
no file follows: readers give up after :data:`PENDING_WAIT_S` and the job starts over
(:class:`~services.errors.IntermediateLost`), as for any lost intermediate.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from services.config import get_settings
from services.pipeline.transfer import download, prefault
from services.storage.base import Storage
from services.storage.keys import pending_key

log = logging.getLogger(__name__)
_lock = threading.Lock()
_kept: dict[str, tuple[str, torch.Tensor]] = {}
_stores: dict[str, Future[None]] = {}
_store_pool: ThreadPoolExecutor | None = None
PENDING_WAIT_S = 60.0  # how long a reader waits for a file that a marker announces (a 1 GB write takes < 1 s)
_POLL_S = 0.01


def enabled(device: str | torch.device) -> bool:
    """Whether groups merged on ``device`` are kept: ``auto`` (the default) on CUDA devices, ``on`` everywhere."""
    mode = get_settings().resident_accumulators
    return mode == "on" or (mode == "auto" and torch.device(device).type == "cuda")


def _name(job_id: str, key: str) -> str:
    return f"{job_id}\0{key}"


def keep(device: str | torch.device, job_id: str, key: str, accumulator: torch.Tensor) -> None:
    """Keep ``accumulator`` (int32 (C, H, W) on ``device``, computed) as the group ``key`` of ``job_id``."""
    with _lock:
        _kept[str(device)] = (_name(job_id, key), accumulator)


def take(device: str | torch.device, job_id: str, key: str) -> torch.Tensor | None:
    """The kept accumulator of group ``key`` of ``job_id`` on ``device``, removed from the cache; None if another
    group (or none) is kept there. On CUDA the tensor is marked as used by the caller's stream, so its memory is not
    handed out again while that stream still reads it."""
    with _lock:
        entry = _kept.get(str(device))
        if entry is None or entry[0] != _name(job_id, key):
            return None
        del _kept[str(device)]
    tensor = entry[1]
    if tensor.is_cuda:
        tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return tensor


def store_in_background(device: str | torch.device) -> bool:
    """Whether a group kept on ``device`` is stored after its task (``STRATA_GROUP_STORE``)."""
    return enabled(device) and get_settings().group_store == "background"


def store_later(storage: Storage, job_id: str, key: str, accumulator: torch.Tensor) -> None:
    """Store ``accumulator`` (int32 (C, H, W) on its device) as ``key`` on a background thread, after the work
    queued on the caller's stream; a marker announces it until the file is published (see the module's text)."""
    event = None
    if accumulator.is_cuda:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(accumulator.device))
    with storage.writer(pending_key(key), durable=False):
        pass
    global _store_pool
    name = _name(job_id, key)
    with _lock:
        if _store_pool is None:
            _store_pool = ThreadPoolExecutor(2, thread_name_prefix="strata-group-store")
        future = _stores[name] = _store_pool.submit(_store, storage, key, accumulator, event)
    future.add_done_callback(lambda done: _forget(name, done))


def _forget(name: str, future: Future[None]) -> None:
    """A finished store needs no waiting for (a strip that took the kept tensor never asks)."""
    with _lock:
        if _stores.get(name) is future:
            del _stores[name]


def _store(storage: Storage, key: str, accumulator: torch.Tensor, event: torch.cuda.Event | None) -> None:
    t0 = time.perf_counter()
    try:
        if event is not None:
            event.synchronize()
        with storage.array_writer(key, tuple(accumulator.shape), np.int32, durable=False) as out:
            prefault(out)()
            download(accumulator, out)
        log.info("frame group %s stored in %.2fs (in the background)", key, time.perf_counter() - t0)
    except Exception:  # a reader that needs the file finds it missing, and the job starts over
        log.exception("storing the frame group %s failed", key)
        raise
    finally:
        storage.delete_prefix(pending_key(key))


def wait_stored(job_id: str, key: str) -> None:
    """Wait until this process's background store of ``key`` (if any) is over, done or failed."""
    with _lock:
        future = _stores.pop(_name(job_id, key), None)
    if future is not None:
        future.exception()  # logged by the thread; a strip that took the kept tensor does not need the file


def await_stored(storage: Storage, job_id: str, key: str, timeout_s: float | None = None) -> None:
    """Before reading ``key``: wait for this process's background store of it, then, while the file is missing
    and another worker's marker announces it, for the file (at most ``timeout_s``, :data:`PENDING_WAIT_S`)."""
    wait_stored(job_id, key)
    deadline = time.monotonic() + (PENDING_WAIT_S if timeout_s is None else timeout_s)
    while not storage.exists(key) and storage.exists(pending_key(key)) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def clear() -> None:
    """Forget every kept tensor and wait for the background stores (tests)."""
    with _lock:
        _kept.clear()
        stores = list(_stores.values())
        _stores.clear()
    for future in stores:
        future.exception()


__all__ = ["PENDING_WAIT_S", "await_stored", "clear", "enabled", "keep", "store_in_background", "store_later", "take",
           "wait_stored"]
