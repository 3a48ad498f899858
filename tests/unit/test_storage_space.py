"""A full disk is StorageUnavailable (503, retried), and no memory map is made past it (found from outside on a
60 MB tmpfs: uploads answered 500, jobs failed for good, a worker died of SIGBUS again and again)."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from services.errors import StorageUnavailable
from services.storage import space
from services.storage.local import LocalStorage


def test_a_write_that_finds_no_room_is_storage_unavailable(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    with pytest.raises(StorageUnavailable, match="is full"), storage.writer("jobs/j/out/a.tif") as f:
        f.write(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.rglob("*a.tif")) == []  # nothing half-written left
    with pytest.raises(PermissionError), storage.writer("jobs/j/out/b.tif"):  # other errors stay themselves
        raise PermissionError(errno.EACCES, "denied")


def test_a_short_write_on_a_nearly_full_disk_counts_as_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = LocalStorage(tmp_path)
    monkeypatch.setattr(space, "free_bytes", lambda where: 1 << 20)
    with pytest.raises(StorageUnavailable), storage.writer("k"):
        raise OSError("196608 requested and 189944 written")  # numpy's tofile on a full disk: no errno
    with pytest.raises(StorageUnavailable, match="is full"):
        storage.check()  # /readyz: not "ok" on a full disk


def test_no_memory_map_past_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = LocalStorage(tmp_path)
    with storage.array_writer("small.npy", (4, 4), np.uint16) as a:
        a[:] = 7
    monkeypatch.setattr(space, "free_bytes", lambda where: space.RESERVE + (1 << 20))
    with pytest.raises(StorageUnavailable, match="MB wanted"), \
            storage.array_writer("big.npy", (1024, 1024, 3), np.float32):
        pass  # never reached: a write into the map would be a SIGBUS
    assert not storage.exists("big.npy") and storage.exists("small.npy")
