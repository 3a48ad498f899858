"""Local storage: listing under concurrent removal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_list_sizes_skips_files_removed_while_it_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's files removed by another process while a finalize lists them (DELETE .../files right after the job
    is done) were a FileNotFoundError that failed the finalize's last step; they are skipped."""
    from services.storage.local import LocalStorage

    storage = LocalStorage(tmp_path)
    for name in ("a", "b", "c"):
        with storage.writer(f"jobs/j/p0/{name}.npy") as f:
            f.write(b"x" * 3)
    real_stat = Path.stat
    calls: dict[Path, int] = {}

    def vanishing(after: int):  # type: ignore[no-untyped-def]
        def stat(self: Path, *args: object, **kwargs: object) -> os.stat_result:
            calls[self] = calls.get(self, 0) + 1
            if self.name == "b.npy" and calls[self] > after:  # b removed after ``after`` looks at it
                raise FileNotFoundError(2, "No such file or directory", str(self))
            return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]
        return stat

    monkeypatch.setattr(Path, "stat", vanishing(0))  # gone once the folder was read
    assert sorted(storage.list_sizes("jobs/j")) == [("jobs/j/p0/a.npy", 3), ("jobs/j/p0/c.npy", 3)]
    calls.clear()
    monkeypatch.setattr(Path, "stat", vanishing(1))  # gone between a first and a second look: one look is taken
    assert len(list(storage.list_sizes("jobs/j"))) in (2, 3)
    monkeypatch.undo()
    storage.delete_prefix("jobs/j")
    assert list(storage.list_sizes("jobs/j")) == [] and list(storage.list_sizes("jobs/none")) == []
