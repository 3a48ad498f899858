"""Prometheus value files on a full disk: their blocks are allocated before they are mapped, so a full disk is an
ENOSPC the process survives, not a SIGBUS (found from outside: prometheus_client grows its memory-mapped files with
truncate, sparse, and the first write into a page with no block behind it killed the process). On a real 256 KB
tmpfs filled up, before: a process whose file grew, or that started on the full disk, died of signal 7; after,
both went on (docs/OPERATIONS.md, Failure behaviour)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict

from services.metrics import AllocatedValues


def _no_room(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_value_files_are_allocated_not_sparse(tmp_path: Path) -> None:
    assert values.MmapedDict is AllocatedValues  # what every process's metrics are written with
    path = tmp_path / "counter_host-1.db"
    values_file = AllocatedValues(str(path))
    for i in range(2000):  # 96 bytes each, past the first 64 KiB: the file doubles, twice
        values_file.write_value(f"{'metric ' * 8}key-{i:05d}", float(i), 0.0)
    size = path.stat().st_size
    assert size >= 128 << 10 and path.stat().st_blocks * 512 >= size  # every byte has its block
    values_file.close()
    read = {k: v for k, v, _, _ in MmapedDict.read_all_values_from_file(str(path))}
    assert len(read) == 2000 and read[f"{'metric ' * 8}key-01999"] == 1999.0


def test_a_full_disk_drops_new_values_and_keeps_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "counter_host-2.db"
    values_file = AllocatedValues(str(path))
    values_file.write_value("kept", 1.0, 0.0)
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    for i in range(2000):  # no room to grow into: not recorded, no exception, no SIGBUS
        values_file.write_value(f"{'metric ' * 8}key-{i:05d}", float(i), 0.0)
    assert values_file.read_value("new") == (0.0, 0.0)
    values_file.write_value("kept", 2.0, 0.0)  # the values that have their room go on counting
    values_file.close()
    read = {k: v for k, v, _, _ in MmapedDict.read_all_values_from_file(str(path))}
    assert read["kept"] == 2.0 and path.stat().st_size == 64 << 10

    # A process starting on the full disk keeps its values in memory; no empty file is left for a scrape to trip on.
    started = AllocatedValues(str(tmp_path / "counter_host-3.db"))
    started.write_value("in-memory", 3.0, 0.0)
    assert started.read_value("in-memory") == (3.0, 0.0)
    started.close()
    assert not (tmp_path / "counter_host-3.db").exists()

    def broken(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "posix_fallocate", broken)  # another error stays itself
    with pytest.raises(OSError, match="Input/output"):
        AllocatedValues(str(tmp_path / "counter_host-4.db"))
