"""Prometheus metrics of every Strata process, multiprocess-safe.

Every process (API, coordinator, GPU workers) writes its counters and histograms to value files in one shared
folder (``PROMETHEUS_MULTIPROC_DIR``; default ``<data_dir>/metrics``, set here before prometheus_client is
imported, emptied by the launcher when the service starts). The API's ``/metrics`` adds them up and adds gauges
read at scrape time from the database and Redis (jobs by status, queue depths): see :func:`render_metrics`.
"""

from __future__ import annotations

import os
import socket

from services.config import get_settings


def _multiproc_dir() -> str:
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        folder = str(get_settings().resolved_metrics_dir)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    os.makedirs(folder, exist_ok=True)
    return folder


MULTIPROC_DIR = _multiproc_dir()

from prometheus_client import Counter, Histogram, values  # noqa: E402 - after the folder is chosen


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
GPU_BUSY_SECONDS = Counter("strata_gpu_busy_seconds",
                           "Seconds a worker spent computing shards (summed over its threads).", ["gpu"])
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
