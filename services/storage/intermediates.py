"""Intermediate arrays of a job (decoded frames, shard results): read back with loss detection, removed at once.

Intermediates are written atomically but not synced (docs/ARCHITECTURE.md, "Durability"): a host crash may lose
one, and a reader then raises :class:`~services.errors.IntermediateLost` so the job starts over from its uploads.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from services.errors import IntermediateLost, StorageUnavailable
from services.storage.base import Storage
from services.storage.keys import PENDING_SUFFIX, intermediate_prefixes

log = logging.getLogger(__name__)
PENDING_REMOVE_WAIT_S = 10.0  # a frame group's background store takes well under a second


def load_intermediate(storage: Storage, job_id: str, key: str) -> np.ndarray:
    """A job's intermediate array (memory-mapped); :class:`IntermediateLost` when it is gone or unreadable."""
    try:
        return storage.load_array(key)
    except (OSError, ValueError, EOFError) as exc:  # missing, truncated header, short data
        raise IntermediateLost(job_id, key, f"{type(exc).__name__}: {exc}") from exc


def remove_intermediates(storage: Storage, job_id: str, pending_wait_s: float = PENDING_REMOVE_WAIT_S) -> None:
    """Delete decoded frames and shard results; uploads and outputs stay. A file still being written after its
    task (its ``.pending`` marker, :func:`~services.storage.keys.pending_key`) is waited for, at most
    ``pending_wait_s``, so that it is not written again into a folder just removed (a marker left by a dead worker
    costs that wait, once)."""
    deadline = time.monotonic() + pending_wait_s
    while time.monotonic() < deadline and any(key.endswith(PENDING_SUFFIX) for prefix in intermediate_prefixes(job_id)
                                              for key, _ in storage.list_sizes(prefix)):
        time.sleep(0.02)
    for prefix in intermediate_prefixes(job_id):
        storage.delete_prefix(prefix)


def drop_intermediates(storage: Storage, job_id: str) -> bool:
    """:func:`remove_intermediates` after a job's state already moved on (cancelled, failed, done, started over):
    an object store that is away leaves them for the retention pass's sweep (``sweep_intermediates``) rather than
    failing a request or a step whose work is recorded. True when they were removed."""
    try:
        remove_intermediates(storage, job_id)
    except StorageUnavailable as exc:
        log.warning("job %s: intermediates left for the retention sweep: %s", job_id, exc.detail)
        return False
    return True


def sweep_partials(storage: Storage, job_id: str, older_than_s: float = 0.0) -> int:
    """Delete the half-written files a killed step left in the job's intermediates (its re-run rewrites them)."""
    return sum(storage.sweep_partials(prefix, older_than_s) for prefix in intermediate_prefixes(job_id))

