"""Local-directory storage (shared filesystem when several hosts are used)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from services.errors import StorageUnavailable
from services.storage.base import Storage
from services.storage.space import check_room, full, is_full


class LocalStorage(Storage):
    def __init__(self, root: Path, early_sync_s: float = 0.1) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.early_sync_s = early_sync_s  # STRATA_EARLY_SYNC_S; 0: only the closing fsync

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"storage key escapes the root: {key!r}")
        return path

    @contextmanager
    def path_writer(self, key: str) -> Iterator[Path]:
        """A temporary path renamed to ``key`` when the block exits without error; a full disk, met by the block
        or here, is :class:`StorageUnavailable` (:mod:`services.storage.space`)."""
        path = self._path(key)
        tmp = path.with_name(f".part-{uuid.uuid4().hex[:8]}-{path.name}")  # same suffix: tools append none
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            os.replace(tmp, path)
        except OSError as exc:
            if is_full(exc, self.root):
                raise full(self.root) from exc
            raise
        finally:
            tmp.unlink(missing_ok=True)

    @contextmanager
    def writer(self, key: str, durable: bool = True) -> Iterator[BinaryIO]:
        """A new file under ``key``, renamed into place when the block exits. ``durable``: while the block writes,
        a thread hands what is written so far to the disk every ``early_sync_s`` (fdatasync), so the closing fsync
        only waits for the tail (an 80 MP TIFF is 370 MB: about 0.25 s of the H200 host's disk after the encode,
        now mostly during it); 0: the closing fsync alone."""
        with self.path_writer(key) as tmp, open(tmp, "w+b") as f:  # readable: writers may map what they wrote
            stop = threading.Event()
            early = durable and self.early_sync_s > 0
            syncer = threading.Thread(target=_sync_while, args=(f.fileno(), stop, self.early_sync_s),
                                      daemon=True) if early else None
            if syncer is not None:
                syncer.start()
            try:
                yield f
            finally:
                stop.set()
                if syncer is not None:
                    syncer.join()
            f.flush()
            if durable:
                os.fsync(f.fileno())

    def check(self) -> None:
        if not (self.root.is_dir() and os.access(self.root, os.W_OK | os.X_OK)):
            raise StorageUnavailable(f"storage unavailable: {self.root} is not a writable directory")
        check_room(self.root, 0)  # /readyz said "ok" on a full disk

    def room_for(self, key: str, nbytes: int) -> None:
        check_room(self.root, nbytes)

    def shared_between_hosts(self) -> bool:
        """True when the root is on a network filesystem (NFS, SMB, Ceph, Lustre, FUSE ...), from /proc/mounts;
        also when that cannot be read."""
        return _network_filesystem(self.root)

    def open(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def local_path(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(key)
        return path

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file():
            path.unlink(missing_ok=True)

    renames = True

    def move(self, src: str, dst: str) -> None:
        """A rename (``src`` must already be durable: its bytes are not synced again)."""
        target = self._path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(self._path(src), target)
        except OSError as exc:
            if is_full(exc, self.root):
                raise full(self.root) from exc
            raise

    def list_sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every file under ``prefix`` with its size. A file or folder removed while the listing runs (another
        process deleting the job's files: DELETE .../files beside a finalize) is skipped, not an error."""
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            paths: Iterator[Path] = iter([base])
        else:  # os.walk ignores folders that vanish under it
            paths = (Path(top) / name for top, _, names in os.walk(base) for name in names)
        for path in paths:
            if path.name.startswith(".part-"):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield path.relative_to(self.root).as_posix(), st.st_size

    def last_modified(self, prefix: str) -> float | None:
        base = self._path(prefix)
        paths = [base] if base.is_file() else [Path(top) / n for top, _, names in os.walk(base) for n in names]
        times = []
        for path in paths:
            with contextlib.suppress(OSError):
                times.append(path.stat().st_mtime)
        return max(times, default=None)

    def sweep_partials(self, prefix: str, older_than_s: float = 0.0) -> int:
        base = self._path(prefix)
        cutoff, n = time.time() - older_than_s, 0
        for path in base.rglob("*.part*") if base.is_dir() else []:
            with contextlib.suppress(OSError):
                if (path.name.startswith(".part-") or path.name.endswith(".part")) and path.stat().st_mtime <= cutoff:
                    path.unlink()
                    n += 1
        return n

    def iter_chunks(self, key: str, start: int = 0, end: int | None = None, chunk: int = 1 << 20) -> Iterator[bytes]:
        with self.open(key) as f:
            f.seek(start)
            remaining = (end if end is not None else os.fstat(f.fileno()).st_size) - start  # the open file's size
            while remaining > 0:
                data = f.read(min(chunk, remaining))
                if not data:
                    break
                remaining -= len(data)
                yield data


_LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "f2fs", "jfs", "reiserfs",
                      "bcachefs", "vfat", "exfat", "ntfs", "ntfs3", "hfsplus", "apfs"}


def mount_type(path: Path, mounts: str) -> str:
    """The filesystem type of the mount holding ``path``, from /proc/mounts text ("" when none matches)."""
    best, fstype = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


@lru_cache(maxsize=16)
def _network_filesystem(path: Path) -> bool:
    """Whether ``path`` lies on a filesystem other hosts may share: anything not known to be local."""
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return True
    return mount_type(path, mounts) not in _LOCAL_FILESYSTEMS


def _sync_while(fd: int, stop: threading.Event, interval: float) -> None:
    """fdatasync ``fd`` every ``interval`` seconds until ``stop`` is set (errors end it: the closing fsync reports
    them)."""
    while not stop.wait(interval):
        try:
            getattr(os, "fdatasync", os.fsync)(fd)
        except OSError:
            return
