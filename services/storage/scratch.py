"""A bounded local scratch cache for an object store: objects a host reads as files (LibRaw, memory maps) and
files it writes before uploading them.

```
<root>/tmp/<random>-<name>          files being written or downloaded (never read by others)
<root>/obj/<sha1(key)>/<etag>.bin    a cached object, published by an atomic rename
```

Eviction is LRU by modification time (touched on every use) down to the size cap, skipping files used in the
last ``grace_s`` seconds (a path just handed to LibRaw or being mapped). Removing a file that another process
still maps or has open is safe on POSIX: its pages live until the last map or descriptor goes. The cap is a
target: files in use are never removed, so the cache may exceed it for a while.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ScratchCache:
    def __init__(self, root: Path, max_bytes: int, grace_s: float = 30.0) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.grace_s = grace_s
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        (self.root / "obj").mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str, etag: str) -> Path:
        """Where the object ``key`` at version ``etag`` is cached (may not exist)."""
        tag = "".join(c for c in etag if c.isalnum() or c == "-")[:80] or "none"
        return self.root / "obj" / hashlib.sha1(key.encode()).hexdigest() / f"{tag}{Path(key).suffix}"

    def lookup(self, key: str, etag: str, size: int) -> Path | None:
        """The cached copy of ``key`` if it is there at this version and size (then touched), else None."""
        path = self.path_for(key, etag)
        try:
            if path.stat().st_size != size:
                return None
            os.utime(path)
        except OSError:
            return None
        return path

    @contextmanager
    def temp_file(self, name: str) -> Iterator[Path]:
        """A fresh path in the cache's tmp folder, removed on exit unless published."""
        tmp = self.root / "tmp" / f"{uuid.uuid4().hex[:12]}-{Path(name).name[-80:]}"
        try:
            yield tmp
        finally:
            tmp.unlink(missing_ok=True)

    def publish(self, tmp: Path, key: str, etag: str) -> Path:
        """Move a complete file into the cache as ``key`` at ``etag`` (atomic rename; older versions dropped)."""
        path = self.path_for(key, etag)
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.iterdir():
            if old != path:
                old.unlink(missing_ok=True)
        os.replace(tmp, path)
        self.evict()
        return path

    def forget(self, key: str) -> None:
        """Drop every cached version of ``key`` (the object was deleted)."""
        folder = self.path_for(key, "x").parent
        if folder.is_dir():
            for f in folder.iterdir():
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()

    def files(self) -> list[tuple[float, int, Path]]:
        """(mtime, bytes, path) of every cached object."""
        out = []
        for path in (self.root / "obj").glob("*/*"):
            with contextlib.suppress(OSError):
                st = path.stat()
                out.append((st.st_mtime, st.st_size, path))
        return out

    def used_bytes(self) -> int:
        tmp = [p.stat().st_size for p in (self.root / "tmp").iterdir() if p.is_file()]
        return sum(b for _, b, _ in self.files()) + sum(tmp)

    def evict(self) -> int:
        """Remove least recently used objects until the cache fits its cap; returns the bytes removed."""
        files = sorted(self.files())
        total = sum(b for _, b, _ in files)
        removed, now = 0, time.time()
        for mtime, size, path in files:
            if total <= self.max_bytes:
                break
            if now - mtime < self.grace_s:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed += size
        return removed
