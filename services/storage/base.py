"""The storage interface: named blobs under keys like ``jobs/<id>/frames/0.dng``.

Big arrays travel through storage, never through Redis. Writes are atomic: a reader sees either nothing or
the whole object. An object store can implement the same interface later.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np


class Storage(ABC):
    @abstractmethod
    def writer(self, key: str, durable: bool = True) -> AbstractContextManager[BinaryIO]:
        """A binary file that becomes visible under ``key`` only when the block exits without error.

        ``durable``: on disk (fsync) before the block exits; False for intermediates a job can recompute (a host
        crash may then lose them: readers raise and the job starts over, see ``flow.IntermediateLost``).
        Seekable; readable too where the backend allows it (local files: a writer may map what it wrote)."""

    @abstractmethod
    def path_writer(self, key: str) -> AbstractContextManager[Path]:
        """A local path to create the object at (for tools that write files themselves); published on exit."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """Open an object for reading; raises FileNotFoundError."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def local_path(self, key: str) -> Path:
        """A filesystem path holding the object (for memory mapping and LibRaw)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None: ...

    @abstractmethod
    def iter_chunks(self, key: str, start: int = 0, end: int | None = None, chunk: int = 1 << 20) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of the object, in chunks."""

    def save_array(self, key: str, array: np.ndarray, durable: bool = True) -> None:
        """Store an array as ``.npy`` (memory-mappable by readers); ``durable`` as for :meth:`writer`."""
        with self.writer(key, durable) as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)

    @contextmanager
    def array_writer(self, key: str, shape: tuple[int, ...], dtype: np.dtype | type, durable: bool = True
                     ) -> Iterator[np.ndarray]:
        """A writable memory-mapped ``.npy`` of ``shape`` and ``dtype`` to fill in place, published under ``key``
        when the block exits without error (no second copy of a large result through a file write)."""
        with self.path_writer(key) as tmp:
            array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
            yield array
            if durable:
                array.flush()  # msync: the pages are on disk
            del array  # unmapped; unsynced pages stay in the page cache

    def load_array(self, key: str, mmap: bool = True) -> np.ndarray:
        return np.load(self.local_path(key), mmap_mode="r" if mmap else None, allow_pickle=False)
