"""Live-worker registry in Redis: each worker refreshes a key with a TTL; planners and /readyz read them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import redis

log = logging.getLogger(__name__)
PREFIX = "strata:workers:"
# Leases a supervisor handed back for a child it saw die (SIGKILL, OOM): the reconciler re-dispatches them at its
# next pass, without waiting for the dead heartbeat to expire or for the coordinator queue to drain.
ABANDONED_JOBS = "strata:abandoned:jobs"
ABANDONED_SHARDS = "strata:abandoned:shards"
# The coordinators' exclusive passes (redis-py Locks; a holder's token starts with its node name and "-").
RECONCILE_LOCK = "strata:reconcile-lock"
ADMISSION_LOCK = "strata:admission-lock"
RETENTION_LOCK = "strata:retention-lock"
LOCKS = (RECONCILE_LOCK, ADMISSION_LOCK, RETENTION_LOCK)
_TOKEN = re.compile(rb".+-[0-9a-f]{32}")  # workers.tasks._exclusive: node name, "-", uuid4 hex
_DELETE_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
# A worker whose start is refused (workers/tasks.py: _on_ready: its name taken by another live process, a GPU it
# cannot see) exits with this code; its supervisor backs off before starting it again (workers/launcher.py).
CANNOT_START_EXIT = 3


@dataclass(frozen=True)
class WorkerInfo:
    name: str  # Celery node name, e.g. gpu0@host
    kind: str  # "gpu" | "coordinator"
    gpu: str  # GPU id or "cpu"
    device: str  # torch device the worker computes on
    queue: str  # the worker's own queue
    host: str
    pid: int
    current_shard: int | None = None  # the (lowest) shard id being computed, None when idle
    shards: tuple[int, ...] = ()  # every shard being computed (a worker with STRATA_GPU_WORKER_THREADS > 1)
    slots: int = 1  # shards it computes at once
    lane: str = "all"  # a coordinator's: "interactive" for an express coordinator
    memory_mb: float = 0.0  # torch.cuda.memory_allocated on a GPU, the process's RSS on the CPU
    beat_at: float = 0.0  # Unix time of the last heartbeat
    jobs: tuple[str, ...] = ()  # jobs a coordinator is ingesting or advancing now (its leases)

    strip_budget_mb: int = 0  # GPU memory a strip may plan for (0: unknown, a CPU worker)
    instance: str = ""  # this process's start (a random id): tells two processes of one name apart
    machine: str = ""  # the machine's own hostname (``host`` is STRATA_NODE_NAME where set)
    pid_space: str = ""  # which process IDs ``pid`` is among (:func:`pid_space`): containers share hostnames

    @property
    def busy(self) -> bool:
        """Computing a shard (a GPU worker) or holding a job's ingest or advance (a coordinator)."""
        return bool(self.shards) or self.current_shard is not None or bool(self.jobs)


def read_worker(client: redis.Redis, name: str) -> WorkerInfo | None:
    """The live heartbeat of the worker ``name``, if any."""
    raw = client.get(PREFIX + name)
    if not raw:
        return None
    fields = json.loads(raw)
    return WorkerInfo(**{k: v for k, v in fields.items() if k in WorkerInfo.__dataclass_fields__})


def name_taken(client: redis.Redis, info: WorkerInfo) -> str | None:
    """Why ``info``'s name is another live process's (its heartbeat is fresh and from another machine, or from a
    process of this one that still runs), else None. Found from outside: a copied env file gave two hosts one
    STRATA_NODE_NAME; their workers overwrote each other's heartbeat and a shard ran on both at once."""
    other = read_worker(client, info.name)
    if other is None or not other.instance or other.instance == info.instance:
        return None
    if other.machine == info.machine and other.pid_space == info.pid_space and not _pid_alive(other.pid):
        return None  # this machine's earlier process of that name, dead: its key has not expired yet
    return (f"another process already runs as {info.name} (pid {other.pid} on {other.machine or other.host}, "
            f"heartbeat {max(0.0, time.time() - other.beat_at):.0f} s ago): two workers of one name overwrite each "
            f"other's heartbeat and run shards twice; give each host its own STRATA_NODE_NAME")


def pid_space() -> str:
    """This process's PID namespace on this boot of its kernel ("" where Linux does not say): two containers of one
    hostname (the compose file's `hostname: strata-gpu0` on two hosts) see each other's pids as dead, so a heartbeat
    from another namespace is never taken for a dead process of this one. Found from outside: two hosts' gpu
    containers ran as one name, took over each other's shards and rendered frame groups twice."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def live_workers(client: redis.Redis, kind: str | None = None) -> list[WorkerInfo]:
    """Workers whose heartbeat has not expired, sorted by name (stable GPU slots)."""
    infos = []
    for key in client.scan_iter(match=f"{PREFIX}*", count=100):
        raw = client.get(key)
        if raw:
            fields = json.loads(raw)
            info = WorkerInfo(**{k: v for k, v in fields.items() if k in WorkerInfo.__dataclass_fields__})
            info = replace(info, jobs=tuple(info.jobs), shards=tuple(info.shards) or (
                (info.current_shard,) if info.current_shard is not None else ()))
            if kind is None or info.kind == kind:
                infos.append(info)
    return sorted(infos, key=lambda i: i.name)


@dataclass(frozen=True)
class Leases:
    """What the live workers hold, from their heartbeats: a shard or job held by no live worker is lost."""

    alive: frozenset[str]
    shards: frozenset[int]
    jobs: frozenset[str]


def leases(client: redis.Redis) -> Leases:
    workers = live_workers(client)
    return Leases(frozenset(w.name for w in workers),
                  frozenset(s for w in workers for s in w.shards),
                  frozenset(j for w in workers for j in w.jobs))


def release_dead(client: redis.Redis, name: str, pid: int) -> tuple[list[str], list[int]]:
    """A supervisor saw its child ``name`` (process ``pid``) die: end its leases now rather than when its heartbeat
    expires. Its heartbeat key goes (if it is still that process's), the jobs and shards it held are marked
    abandoned for the reconciler, and the exclusive passes it held are unlocked. Returns (jobs, shards) held."""
    key = PREFIX + name
    raw = client.get(key)
    jobs: list[str] = []
    shards: list[int] = []
    another = False  # the key is another live process's of that name: its locks are its own too
    if raw:
        fields = json.loads(raw)
        another = int(fields.get("pid", -1)) != pid
        if not another:
            jobs = list(fields.get("jobs") or ())
            shards = [int(s) for s in fields.get("shards") or ()] or (
                [int(fields["current_shard"])] if fields.get("current_shard") is not None else [])
            pipe = client.pipeline()
            if jobs:
                pipe.sadd(ABANDONED_JOBS, *jobs)
                pipe.expire(ABANDONED_JOBS, 3600)  # with no reconciler running (interval 0) they go by themselves
            if shards:
                pipe.sadd(ABANDONED_SHARDS, *shards)
                pipe.expire(ABANDONED_SHARDS, 3600)
            pipe.eval(_DELETE_IF, 1, key, raw)
            pipe.execute()
    # Found from outside: a second `strata workers --coordinator` on a host whose names were taken was refused and
    # restarted over and over; each death unlocked the passes of the live coordinator of that name.
    for lock in () if another else LOCKS:
        token = client.get(lock)
        if isinstance(token, bytes) and _TOKEN.fullmatch(token) and token.rsplit(b"-", 1)[0] == name.encode():
            client.eval(_DELETE_IF, 1, lock, token)
    return jobs, shards


def abandoned(client: redis.Redis) -> tuple[frozenset[str], frozenset[int]]:
    """The jobs and shards whose holders' supervisors saw them die (see :func:`release_dead`)."""
    return (frozenset(j.decode() if isinstance(j, bytes) else str(j) for j in client.smembers(ABANDONED_JOBS)),
            frozenset(int(s) for s in client.smembers(ABANDONED_SHARDS)))


def forget_abandoned(client: redis.Redis, jobs: frozenset[str], shards: frozenset[int]) -> None:
    """The reconciler has judged these (re-dispatched, or found them moved on)."""
    if jobs:
        client.srem(ABANDONED_JOBS, *jobs)
    if shards:
        client.srem(ABANDONED_SHARDS, *shards)


def heartbeat_ttl(interval: float) -> int:
    """Seconds a heartbeat key lives: a worker is dead after about three missed beats."""
    return max(int(interval * 3 + 0.999), 2)


class Heartbeat:
    """Refreshes this worker's registry key every ``interval`` seconds until stopped. The key also says what the
    worker holds (its shard, the jobs a coordinator is working on): the reconciler re-dispatches whatever is marked
    running in the database but held by no live heartbeat."""

    def __init__(self, url: str, info: WorkerInfo, interval: float,
                 memory_mb: Callable[[], float] | None = None) -> None:
        self.client = redis_client(url)
        self.info = info
        self.shards: set[int] = set()
        self.jobs: dict[str, int] = {}  # job id -> how many of this process's threads hold it
        self._lock = threading.Lock()
        self.memory_mb = memory_mb or (lambda: 0.0)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strata-heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def add_shard(self, shard_id: int) -> None:
        """Note a shard now computing and beat at once (before it starts: the reconciler never sees it unheld)."""
        with self._lock:
            self.shards.add(shard_id)
        self._beat()

    def discard_shard(self, shard_id: int) -> None:
        with self._lock:
            self.shards.discard(shard_id)
        self._beat()

    def hold(self, job_id: str) -> None:
        """This process works on ``job_id`` now (an ingest or advance): beat at once, before the step starts."""
        with self._lock:
            self.jobs[job_id] = self.jobs.get(job_id, 0) + 1
        self._beat()

    def release(self, job_id: str) -> None:
        with self._lock:
            left = self.jobs.get(job_id, 0) - 1
            if left > 0:
                self.jobs[job_id] = left
            else:
                self.jobs.pop(job_id, None)
        self._beat()

    def _beat(self) -> None:
        with self._lock:
            jobs, shards = tuple(sorted(self.jobs)), tuple(sorted(self.shards))
        info = replace(self.info, current_shard=shards[0] if shards else None, shards=shards,
                       memory_mb=round(self.memory_mb(), 1), beat_at=time.time(), jobs=jobs)
        try:
            self.client.set(PREFIX + self.info.name, json.dumps(asdict(info)), ex=heartbeat_ttl(self.interval))
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)

    def _run(self) -> None:
        warned = False
        while not self._stop.wait(self.interval):
            with contextlib.suppress(redis.RedisError):
                other = read_worker(self.client, self.info.name)
                if not warned and other is not None and other.instance and other.instance != self.info.instance:
                    warned = True  # another process writes our key: said once, loudly (see name_taken)
                    log.error("another process (pid %s on %s) beats as %s too: give each host its own "
                              "STRATA_NODE_NAME", other.pid, other.machine or other.host, self.info.name)
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


def queue_depths_by_priority(client: redis.Redis, queues: list[str], priorities: dict[str, int]
                             ) -> dict[str, dict[str, int]]:
    """Messages waiting per queue and named priority (the Redis transport keeps priority p in ``queue:p``,
    priority 0 in ``queue`` itself)."""
    return {q: {name: int(client.llen(q if p == 0 else f"{q}:{p}")) for name, p in priorities.items()}
            for q in queues}
