"""A full disk under local storage or the scratch cache, said as such: found from outside on a 60 MB tmpfs, an upload
answered 500, jobs failed for good ("No space left on device", or numpy's "196608 requested and 189944 written"),
and a worker filling a memory-mapped result died of SIGBUS over and over. A full disk is
:class:`~services.errors.StorageUnavailable` (503 with Retry-After; workers retry with back-off) and a memory map
is only made where its bytes fit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from services.errors import StorageUnavailable

RESERVE = 64 << 20  # bytes kept free: below this the disk counts as full (logs, the database's journal)
_FULL = {errno.ENOSPC, errno.EDQUOT}


def free_bytes(where: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``where`` (None where it cannot be told)."""
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(exc: BaseException, where: Path) -> bool:
    """``exc`` is a write that failed for want of room: ENOSPC/EDQUOT, or a short write (no errno) on a disk
    with less than :data:`RESERVE` left."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in _FULL:
        return True
    free = free_bytes(where)
    return exc.errno is None and free is not None and free < RESERVE


def full(where: Path, detail: str = "") -> StorageUnavailable:
    free = free_bytes(where)
    left = "" if free is None else f" ({free / 1e6:.0f} MB left)"
    return StorageUnavailable(f"storage unavailable: the disk under {where} is full{left}{detail}; free space "
                              "(remove done jobs' files: DELETE /v1/jobs/{id}/files) and the work goes on")


def check_room(where: Path, nbytes: int) -> None:
    """:class:`StorageUnavailable` unless ``nbytes`` fit on the filesystem of ``where`` beside the reserve: a memory
    map written past a full disk is killed by SIGBUS, not told by an error."""
    free = free_bytes(where)
    if free is not None and free < nbytes + RESERVE:
        raise full(where, f": {nbytes / 1e6:.0f} MB wanted")
