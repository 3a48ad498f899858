"""Live-worker registry in Redis: each worker refreshes a key with a TTL; planners and /readyz read them."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import asdict, dataclass, fields

import redis

log = logging.getLogger(__name__)
PREFIX = "strata:workers:"


@dataclass(frozen=True)
class WorkerInfo:
    name: str  # Celery node name, e.g. gpu0@host
    kind: str  # "gpu" | "coordinator"
    gpu: str  # GPU id or "cpu"
    device: str  # torch device the worker computes on
    queue: str  # the worker's own queue
    host: str
    pid: int
    memory_mb: int = 0  # GPU memory a strip may plan for (0: unknown, a CPU worker)


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def live_workers(client: redis.Redis, kind: str | None = None) -> list[WorkerInfo]:
    """Workers whose heartbeat has not expired, sorted by name (stable GPU slots)."""
    infos = []
    for key in client.scan_iter(match=f"{PREFIX}*", count=100):
        raw = client.get(key)
        if raw:
            known = {f.name for f in fields(WorkerInfo)}  # newer or older workers may beat other fields
            info = WorkerInfo(**{k: v for k, v in json.loads(raw).items() if k in known})
            if kind is None or info.kind == kind:
                infos.append(info)
    return sorted(infos, key=lambda i: i.name)


class Heartbeat:
    """Refreshes this worker's registry key every ``interval`` seconds until stopped."""

    def __init__(self, url: str, info: WorkerInfo, interval: float) -> None:
        self.client = redis_client(url)
        self.info = info
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strata-heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def _beat(self) -> None:
        try:
            self.client.set(PREFIX + self.info.name, json.dumps(asdict(self.info)),
                            ex=max(int(self.interval * 3), 2))
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            self.client.delete(PREFIX + self.info.name)


def this_host() -> str:
    """This host's name: STRATA_NODE_NAME, else the hostname."""
    from services.config import get_settings

    return get_settings().host_name


def queue_depths(client: redis.Redis, queues: list[str]) -> dict[str, int]:
    """Messages waiting per queue (all priority levels of the Redis transport added up)."""
    depths = {}
    for q in queues:
        depths[q] = sum(int(client.llen(k)) for k in [q, *(f"{q}:{p}" for p in range(1, 10))])
    return depths
