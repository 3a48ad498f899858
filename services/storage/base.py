"""The storage interface: named blobs under keys like ``jobs/<id>/frames/0.dng``.

Big arrays travel through storage, never through Redis. Writes are atomic: a reader sees either nothing or
the whole object. Backends: local files (``local.py``) and S3-compatible object storage (``s3.py``, which says
which methods stream and which go through its local scratch cache).
"""

from __future__ import annotations

import hashlib
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np


class Storage(ABC):
    @abstractmethod
    def writer(self, key: str, durable: bool = True) -> AbstractContextManager[BinaryIO]:
        """A binary file that becomes visible under ``key`` only when the block exits without error.

        ``durable``: on disk (fsync) before the block exits; False for intermediates a job can recompute (a host
        crash may then lose them: readers raise and the job starts over, see ``flow.IntermediateLost``).
        Seekable and readable on local files (a writer may map what it wrote); on object storage a sequential
        stream (multipart upload): use :meth:`file_writer` for writers that seek or read back."""

    def file_writer(self, key: str, durable: bool = True) -> AbstractContextManager[BinaryIO]:
        """Like :meth:`writer` but always a real local file (seekable, readable, mappable): object stores write
        it in their scratch cache and upload it on exit."""
        return self.writer(key, durable)

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
    def room_for(self, key: str, nbytes: int) -> None:
        """StorageUnavailable unless ``nbytes`` more fit where ``key`` would be written on this host (local disk,
        scratch cache); checked before a memory map, whose writes past a full disk are a SIGBUS, not an error."""

    @abstractmethod
    def local_path(self, key: str) -> Path:
        """A filesystem path holding the object (for memory mapping and LibRaw)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None: ...

    renames = False  # whether :meth:`move` is a rename (no bytes copied)

    def move(self, src: str, dst: str) -> None:
        """Make the durable object ``src`` the object ``dst`` (replacing one there) and remove ``src``. Here a
        copy through a durable writer; a backend that can rename does."""
        with self.open(src) as f, self.writer(dst) as out:
            shutil.copyfileobj(f, out, 8 << 20)
        self.delete_prefix(src)

    @abstractmethod
    def iter_chunks(self, key: str, start: int = 0, end: int | None = None, chunk: int = 1 << 20) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of the object, in chunks."""

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` (first axis) of a stored ``.npy``; object stores read only those bytes."""
        return self.load_array(key)[start:stop]

    @abstractmethod
    def list_sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(key, bytes) of every object under ``prefix`` (a folder or a key; "" = everything)."""

    @abstractmethod
    def last_modified(self, prefix: str) -> float | None:
        """When anything under ``prefix`` was last written (seconds since the epoch); None when nothing is there."""

    def presigned_url(self, key: str, expires_s: int, disposition: str | None = None,
                      content_type: str | None = None) -> str | None:
        """A URL a client can GET the object from without the API for ``expires_s`` seconds, answered with these
        Content-Disposition and Content-Type headers; None when the backend has none (local files)."""
        return None

    def sweep_partials(self, prefix: str, older_than_s: float = 0.0) -> int:
        """Delete half-written files (``.part-*``, a writer killed before its rename) under ``prefix`` untouched for
        ``older_than_s``; how many. Object stores write whole objects only: nothing to sweep."""
        return 0

    def scratch_bytes(self) -> int:
        """Bytes in this host's local scratch cache (0 for backends without one)."""
        return 0

    def save_array(self, key: str, array: np.ndarray, durable: bool = True) -> None:
        """Store an array as ``.npy`` (memory-mappable by readers); ``durable`` as for :meth:`writer`."""
        with self.writer(key, durable) as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)

    @contextmanager
    def array_writer(self, key: str, shape: tuple[int, ...], dtype: np.dtype | type, durable: bool = True,
                     written: Callable[[], Sequence[tuple[int, int]] | None] | None = None) -> Iterator[np.ndarray]:
        """A writable memory-mapped ``.npy`` of ``shape`` and ``dtype`` to fill in place, published under ``key``
        when the block exits without error (no second copy of a large result through a file write).

        Not durable and not flushed, a file extended this way can come back from a host crash at full size with
        holes of zeros (a written file comes back short, which ``np.load`` notices). So a digest of sampled runs
        of the values is published first, beside it (``<key>.sample``), and :meth:`load_array` checks it.
        ``written``, asked when the block exits: the ranges of the first axis the block filled, where it left the
        rest unwritten on purpose (a lean strip): only those are sampled (touching the holes of a sparse file cost
        a GPU worker about 0.2 s a strip), and the reader samples the same rows (None: the whole array).
        """
        self.room_for(key, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        with self.path_writer(key) as tmp:
            array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
            yield array
            if durable or self.shared_between_hosts():
                array.flush()  # msync: on disk, or on the file server (another host's reader needs the pages there)
            else:  # published before the array: if the array's rename survives a crash, so did this one's
                with self.writer(key + SAMPLE_SUFFIX, durable=False) as f:
                    f.write(_sample_record(array, written() if written else None).encode())
            del array  # unmapped; on a local disk unsynced pages stay in the page cache

    @contextmanager
    def array_stream(self, key: str, shape: tuple[int, ...], dtype: np.dtype | type) -> Iterator[BinaryIO]:
        """A ``.npy`` of ``shape`` and ``dtype`` written as a stream (not durable): the block writes the raw
        values in C order to the file it gets (positioned after the header), e.g. straight from pinned device
        slots, with no page faults of a fresh memory map (a map cost a GPU worker about 0.15 s per 370 MB of
        tile streams). On exit the size is checked and the result published as :meth:`array_writer` does, sample
        digest first."""
        dt = np.dtype(dtype)
        with self.path_writer(key) as tmp:
            with open(tmp, "wb") as f:
                np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dt),
                                                         "fortran_order": False, "shape": tuple(shape)})
                start = f.tell()
                yield cast(BinaryIO, f)
                written = f.tell() - start
            expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            if written != expected:
                raise ValueError(f"{key}: {written} bytes written for a {dt} {tuple(shape)} array ({expected})")
            array = np.load(tmp, mmap_mode="r")  # closed above: on a file server, close flushed it there
            with self.writer(key + SAMPLE_SUFFIX, durable=False) as out:
                out.write(_sample_digest(array).encode())
            del array

    def abort_stale_uploads(self, older_than_s: float) -> int:
        """Abort uploads begun more than ``older_than_s`` ago and never completed (an object store's multipart
        uploads whose abort failed with the connection); how many. Local files have none (``sweep_partials``)."""
        return 0

    def check(self) -> None:  # noqa: B027 - a backend with nothing to check keeps this
        """Raise :class:`~services.errors.StorageUnavailable` when the backend cannot be used now (readiness)."""

    def shared_between_hosts(self) -> bool:
        """Whether readers on other hosts may open what this process writes (then memory-mapped writes must
        reach the server before publishing). True unless the backend knows better."""
        return True

    def load_array(self, key: str, mmap: bool = True) -> np.ndarray:
        """A stored array (memory-mapped by default). ``ValueError`` when it is torn: short (``np.load``) or, for
        an :meth:`array_writer` array, not matching its sample digest."""
        array = np.load(self.local_path(key), mmap_mode="r" if mmap else None, allow_pickle=False)
        if self.exists(key + SAMPLE_SUFFIX):
            with self.open(key + SAMPLE_SUFFIX) as f:
                expected = f.read().decode("ascii", "replace")
            if _sample_record(array, _recorded_rows(expected)) != expected:
                raise ValueError(f"{key} does not match its sample digest (torn by a crash?)")
        return array


SAMPLE_SUFFIX = ".sample"
_BLOCKS, _BLOCK = 1024, 64  # sampled runs of values, spread evenly over the array


def _sample_record(array: np.ndarray, rows: Sequence[tuple[int, int]] | None) -> str:
    """What ``<key>.sample`` holds: the digest of the whole array, or ``rows A:B,C:D <digest of those rows>``."""
    if rows is None:
        return _sample_digest(array)
    h = hashlib.blake2b(digest_size=16)
    for a, b in rows:
        h.update(f"{a}:{b}".encode())
        h.update(_sample_digest(array[a:b]).encode())
    return "rows " + ",".join(f"{a}:{b}" for a, b in rows) + " " + h.hexdigest()


def _recorded_rows(record: str) -> list[tuple[int, int]] | None:
    """The row ranges a ``.sample`` record covers (None: the whole array; a garbled record gives rows that do
    not reproduce it, so the check fails)."""
    if not record.startswith("rows "):
        return None
    try:
        return [(int(a), int(b)) for a, b in (part.split(":") for part in record.split(" ")[1].split(","))]
    except (ValueError, IndexError):
        return []


def _sample_digest(array: np.ndarray) -> str:
    """BLAKE2b of 1024 evenly spread runs of 64 values, with the shape and dtype. Cheap on a memory map (about
    1024 pages touched; a strided sample touching a page per value cost readers 0.1 s per 800 MB accumulator),
    and a crash's hole of zeros longer than the spacing (0.8 MB in 800 MB) cannot miss a run, which shows it
    unless the values there were zero anyway."""
    flat = array.reshape(-1)
    if flat.size <= _BLOCKS * _BLOCK:
        sample = np.ascontiguousarray(flat)
    else:
        starts = np.arange(_BLOCKS, dtype=np.int64) * (flat.size - _BLOCK) // (_BLOCKS - 1)
        sample = flat[starts[:, None] + np.arange(_BLOCK, dtype=np.int64)[None, :]]
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.shape}{array.dtype.str}".encode())
    h.update(sample.tobytes())
    return h.hexdigest()
