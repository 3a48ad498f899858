"""Prometheus metrics of every Strata process, multiprocess-safe.

Every process (API, coordinator, GPU workers) writes its counters and histograms to value files in one shared
folder (``PROMETHEUS_MULTIPROC_DIR``; default ``<data_dir>/metrics``, set here before prometheus_client is
imported, emptied by the launcher when the service starts). The API's ``/metrics`` adds them up and adds gauges
read at scrape time from the database and Redis (jobs by status, queue depths): see :func:`render_metrics`.
The value files are memory maps whose blocks are allocated before they are mapped (:class:`AllocatedValues`): a
full disk under the folder is a logged ENOSPC, never a SIGBUS.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time

from services.config import get_settings

log = logging.getLogger(__name__)


def _multiproc_dir() -> str:
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        folder = str(get_settings().resolved_metrics_dir)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    os.makedirs(folder, exist_ok=True)
    return folder


MULTIPROC_DIR = _multiproc_dir()

from prometheus_client import Counter, Histogram, values  # noqa: E402 - after the folder is chosen
from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict  # noqa: E402

_FULL = {errno.ENOSPC, errno.EDQUOT}
_warned_at = [-float("inf")]  # when a full disk was last said (once a minute at most)


def _no_room(exc: OSError, what: str) -> None:
    """A value file that found no room: said once a minute, and the caller carries on without it."""
    if exc.errno not in _FULL:
        raise exc
    if time.monotonic() - _warned_at[0] >= 60:
        _warned_at[0] = time.monotonic()
        log.warning("metrics: the disk under %s is full (%s): %s", MULTIPROC_DIR, exc.strerror, what)


def _allocated(filename: str) -> str:
    """``filename`` with its first blocks allocated, or, where the disk has none left, an in-memory file
    (``/proc/self/fd/N`` of a memfd) that no scrape reads: this process's metrics are missing, the process lives."""
    try:
        fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)  # as open() makes it: umask decides
    except OSError as exc:
        _no_room(exc, "this process's metrics are kept in memory, not in /metrics, until it restarts")
        return f"/proc/self/fd/{os.memfd_create('strata-metrics')}"
    try:
        if os.fstat(fd).st_size < _INITIAL_MMAP_SIZE:
            os.posix_fallocate(fd, 0, _INITIAL_MMAP_SIZE)
        return filename
    except OSError as exc:
        os.unlink(filename)  # an empty value file would break the scrape that reads it
        _no_room(exc, "this process's metrics are kept in memory, not in /metrics, until it restarts")
        return f"/proc/self/fd/{os.memfd_create('strata-metrics')}"
    finally:
        os.close(fd)


class AllocatedValues(MmapedDict):
    """prometheus_client's value file with its disk blocks allocated (``posix_fallocate``) before they are mapped.
    The library sizes the file with ``truncate``, which leaves it sparse: the first write into a page that a full
    disk has no block for killed the process with SIGBUS (the folder is under the data dir, which outputs can fill;
    found from outside). Now a full disk is ENOSPC: a file that cannot be made is kept in memory instead, a value
    that finds no room to grow into is not recorded, both said in the log; the process goes on."""

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        super().__init__(filename if read_mode else _allocated(filename), read_mode)

    def _init_value(self, key: str) -> None:
        size = len(key.encode("utf-8"))
        size = 4 + size + (8 - (size + 4) % 8) + 16  # the library's entry: length, padded key, value, timestamp
        capacity = self._capacity
        while self._used + size > capacity:
            capacity *= 2
        if capacity > self._capacity:  # allocated first: a full disk is an error here, not a SIGBUS later
            os.posix_fallocate(self._f.fileno(), 0, capacity)
        super()._init_value(key)

    def read_value(self, key: str) -> tuple[float, float]:
        try:
            value, timestamp = super().read_value(key)
            return float(value), float(timestamp)
        except OSError as exc:
            _no_room(exc, "a new metric value is not recorded")
            return 0.0, 0.0

    def write_value(self, key: str, value: float, timestamp: float) -> None:
        try:
            super().write_value(key, value, timestamp)
        except OSError as exc:
            _no_room(exc, "a new metric value is not recorded")


values.MmapedDict = AllocatedValues  # type: ignore[misc]  # what MultiProcessValue opens its value files with


def _process_id() -> str:
    """Value files are named by host and pid: containers sharing the folder (one data volume) have clashing pids."""
    return f"{socket.gethostname().replace('_', '-')}-{os.getpid()}"


values.ValueClass = values.MultiProcessValue(_process_id)

_STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
STAGE_SECONDS = Histogram("strata_stage_seconds", "Seconds of a coordinator step (ingest, advance/finalize).",
                          ["stage"], buckets=_STAGE_BUCKETS)
SHARD_SECONDS = Histogram("strata_shard_seconds", "Seconds of one shard task on a worker.", ["kind"],
                          buckets=_STAGE_BUCKETS)
PREVIEW_SECONDS = Histogram("strata_preview_seconds", "Seconds to make and write a preview.", ["kind"],
                            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5))
# ``worker`` (the Celery node name, e.g. cpu0@host) tells apart workers sharing a ``gpu`` id: CPU workers all say
# "cpu", and each compose GPU container sees its own card as "0". One series per worker process name.
GPU_BUSY_SECONDS = Counter("strata_gpu_busy_seconds",
                           "Seconds a worker spent computing shards (summed over its threads).", ["worker", "gpu"])
BYTES_UPLOADED = Counter("strata_bytes_uploaded", "Bytes of RAW frames received.")
BYTES_WRITTEN = Counter("strata_bytes_written", "Bytes of outputs written.")
RETRIES = Counter("strata_retries", "Task attempts retried (shards after a failure, steps after a transient error).",
                  ["task"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reset_multiproc_dir() -> None:
    """Remove the value files of this host's processes that are gone (an earlier run's; the launcher calls it
    before starting its children). Files of live processes (another service sharing the folder, the caller) and
    of other hosts stay: they are still counting."""
    host = socket.gethostname().replace("_", "-")
    for name in os.listdir(MULTIPROC_DIR):
        stem, _, ext = name.rpartition(".")
        owner = stem.split("_", 1)[-1]  # <kind>_<host>-<pid>
        owner_host, _, pid = owner.rpartition("-")
        if ext == "db" and owner_host == host and pid.isdigit() and not _alive(int(pid)):
            os.unlink(os.path.join(MULTIPROC_DIR, name))


def serve_folder(port: int) -> None:
    """Serve the counters and histograms of this host's processes (the multiprocess folder) on ``port`` from a
    daemon thread: on a host with workers and no API, whose folder no API adds up (found from outside: host B's
    worker metrics never reached Prometheus). The gauges read from the database and Redis stay the API's."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=MULTIPROC_DIR)
    start_http_server(port, registry=registry)
