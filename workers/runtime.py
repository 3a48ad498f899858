"""Per-process worker state: identity, device, the resident model, the heartbeat."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError

from services.config import get_settings
from services.db.schema import wait_for_database
from services.errors import StorageUnavailable
from services.export import recipes
from services.jobs.storage_identity import wait_for_storage
from services.pipeline import gate
from workers.registry import Heartbeat, WorkerInfo, live_workers, name_taken, pid_space, redis_client, this_host

log = logging.getLogger(__name__)
# What a periodic pass meets while a service it needs is away: logged as an outage, not a failure (OutageLog)
OUTAGES = (StorageUnavailable, RedisConnectionError, RedisTimeoutError, KombuOperationalError,
           DatabaseOperationalError, InterfaceError)


@dataclass(frozen=True)
class WorkerContext:
    name: str
    kind: str
    gpu: str
    device: str


_ctx: WorkerContext | None = None
_stopping = threading.Event()
_wakes: dict[str, threading.Event] = {}  # periodic passes by name: set to run one now (wake)
_heartbeat: Heartbeat | None = None


def own_queue(name: str) -> str:
    return f"gpu.{name}"


def pick_device(gpu: str) -> str:
    """The torch device of a worker pinned with CUDA_VISIBLE_DEVICES: its one GPU, or the CPU for a CPU worker.

    A worker pinned to a GPU that CUDA cannot see refuses to start rather than quietly computing on the CPU.
    """
    import torch

    if gpu == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(f"worker pinned to GPU {gpu} but CUDA sees no device (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); refusing to fall back to the CPU")
    return "cuda:0"


def _configure_torch(kind: str, device: str) -> None:
    import torch

    settings = get_settings()
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
    if device.startswith("cuda"):
        from services.pipeline.models.package import configure_cuda_numerics

        configure_cuda_numerics(settings.model_tf32)


def _warm_up(device: str) -> None:
    """Load every camera's model package once (it stays resident) and run it, so the first shard is not slow."""
    import numpy as np

    from services.jobs.cameras import PROFILES
    from services.pipeline.models.registry import default_package, package_ref
    from services.pipeline.render import RenderParams, render_mosaic

    for camera in PROFILES:
        model = package_ref(default_package(camera))
        params = RenderParams(cfa="RGGB", black=(0.0, 0.0, 0.0, 0.0), white=1.0, gains=(1.0, 1.0, 1.0),
                              rgb_cam=((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
                              noise_shot=1e-4, noise_read=1e-6, camera=camera, model=model)
        render_mosaic(np.full((128, 128), 0.5, dtype=np.float32), params, device=device, normalized=True)
        log.info("%s: model package %s resident on %s", camera, model, device)
    _warm_up_stacks(device)


def _warm_up_stacks(device: str) -> None:
    """A tiny stack merged and rendered as a stack strip: the merge's kernels load and the pinned staging slots and
    copy threads exist before the first frame group arrives."""
    import numpy as np

    from services.pipeline.models.registry import default_package, package_ref
    from services.pipeline.shot import shot_render_params
    from services.pipeline.stack import merge_frame_group, render_stack_strip, stack_params
    from services.raw.colour import CameraProfile
    from services.raw.meta import RawMeta

    rng = np.random.default_rng(0)
    frames = [rng.integers(1000, 20000, (64, 64), dtype=np.uint16) for _ in range(3)]
    meta = RawMeta(width=64, height=64, cfa="RGGB", black_levels=(0.0,) * 4, white_level=65535.0,
                   profile=CameraProfile(np.eye(3)), as_shot_neutral=None, make="", model="IQ2_XS",
                   noise_profile=None)
    params = stack_params(shot_render_params(meta, frames[0], camera="IQ2_XS",
                                             model=package_ref(default_package("IQ2_XS"))), len(frames))
    group = merge_frame_group((frames[0], meta), [(f, meta) for f in frames], device, stack_size=3, positions=[0, 1, 2],
                             params=params)
    render_stack_strip([group], 0, 64, params, device, pixel_shift=False)


def start(name: str, reconcile: Callable[[], object] | None = None, admit: Callable[[], object] | None = None,
          retention: Callable[[], object] | None = None) -> None:
    """Called once when the Celery worker is ready: pick the device, warm up, start the heartbeat; a coordinator
    also runs ``reconcile`` every STRATA_RECONCILE_INTERVAL_S, ``admit`` every STRATA_ADMISSION_INTERVAL_S and
    ``retention`` every STRATA_RETENTION_INTERVAL_S."""
    global _ctx, _heartbeat
    settings = get_settings()
    kind = settings.worker_kind
    gpu = settings.worker_gpu if kind == "gpu" else "cpu"
    device = pick_device(gpu) if kind == "gpu" else "cpu"
    # Not ready (no heartbeat, no message taken: Celery's loop waits for this) until the database answers at this
    # release's revision: found from outside, workers on an unreachable or unmigrated database said "ready".
    if not wait_for_database(name, _stopping) or not wait_for_storage(name, _stopping):
        return
    _configure_torch(kind, device)
    recipes.read_at_start()
    if kind == "gpu" and device.startswith("cuda"):  # device slots; the worker's other threads store results
        gate.configure(max(1, settings.gpu_worker_threads), settings.gpu_urgent_slots or 0, settings.gpu_urgent_yield_s)
    if kind == "gpu":
        _warm_up(device)
        log.info("%s: pipeline resident on %s (gpu %s)", name, device, gpu)
    _ctx = WorkerContext(name=name, kind=kind, gpu=gpu, device=device)
    slots = max(1, settings.gpu_worker_threads) if device.startswith("cuda") else 1
    from workers.app import broker_url

    info = WorkerInfo(name=name, kind=kind, gpu=gpu, device=device, queue=own_queue(name), host=this_host(),
                      pid=os.getpid(), slots=slots,
                      lane=settings.coordinator_lane if kind == "coordinator" else "all",
                      strip_budget_mb=_strip_memory_mb(device, settings.gpu_memory_fraction
                                                       / max(1, settings.workers_per_gpu) / slots),
                      instance=uuid.uuid4().hex, machine=socket.gethostname(), pid_space=pid_space())
    _heartbeat = Heartbeat(broker_url(settings), info, settings.worker_heartbeat_s,
                           memory_mb=lambda: memory_mb(device))
    taken = name_taken(_heartbeat.client, info)
    if taken is not None:
        raise RuntimeError(taken)  # the worker exits (workers/tasks.py: _on_ready)
    _heartbeat.start()
    if kind == "coordinator":  # decoder children waiting for the first stack's frames
        from services.raw.decode import prestart

        prestart(settings.decode_workers or min(8, os.cpu_count() or 1), settings.decode_memory_mb)
    if kind == "coordinator":
        for what, fn, interval in (("reconcile", reconcile, settings.reconcile_interval_s),
                                   ("admission", admit, settings.admission_interval_s),
                                   ("retention", retention, settings.retention_interval_s)):
            if fn is not None and interval > 0:
                threading.Thread(target=_periodic, args=(what, fn, interval), name=f"strata-{what}",
                                 daemon=True).start()


def _periodic(what: str, fn: Callable[[], object], interval: float) -> None:
    wake = _wakes.setdefault(what, threading.Event())
    while not _stopping.is_set():
        wake.wait(interval)
        wake.clear()  # a wake while the pass runs asks for one more
        if _stopping.is_set():
            return
        try:
            fn()
        except OUTAGES as exc:  # a line a minute while it lasts, not a 100-line traceback every few seconds
            outage.failed(what, exc)
        except Exception:  # noqa: BLE001 - the next pass tries again
            log.exception("%s pass failed", what)
        else:
            outage.passed(what)


class OutageLog:
    """Log a periodic pass's outage (broker, database or storage away) once when it starts, then at most once a
    ``every_s`` with how many passes it skipped, and once when a pass succeeds again."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._since: dict[str, tuple[float, int]] = {}  # pass -> (last line's time, passes skipped since)
        self._lock = threading.Lock()

    def failed(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        reason = getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}"
        with self._lock:
            last, skipped = self._since.get(what, (-float("inf"), 0))
            if now - last < self.every_s:
                self._since[what] = (last, skipped + 1)
                return
            self._since[what] = (now, 0)
        more = f" ({skipped} more pass(es) skipped since the last line)" if skipped else ""
        log.warning("%s pass skipped: %s%s", what, str(reason).splitlines()[0][:300], more)

    def passed(self, what: str) -> None:
        with self._lock:
            if self._since.pop(what, None) is None:
                return
        log.warning("%s pass runs again", what)


outage = OutageLog()


def wake(what: str) -> bool:
    """Run the periodic ``what`` pass (e.g. "admission") on its own thread now rather than at its next tick;
    False where this process runs no such pass (the caller then runs it itself)."""
    event = _wakes.get(what)
    if event is None or _stopping.is_set():
        return False
    event.set()
    return True


def memory_mb(device: str) -> float:
    """Memory in use: the torch CUDA allocator's on a GPU worker, the process's resident set on the CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.memory_allocated() / 2**20
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def held_elsewhere(shard_id: int) -> str | None:
    """The live worker (this one's other threads included) computing ``shard_id`` now, if any: a second delivery
    of its message (found from outside: hosts with different STRATA_VISIBILITY_TIMEOUT_S restored each other's
    messages and ran shards twice) is dropped; should that worker die, the reconciler sends the shard again."""
    if _heartbeat is None:
        return None
    with _heartbeat._lock:
        if shard_id in _heartbeat.shards:
            return _heartbeat.info.name
    try:
        return next((w.name for w in live_workers(_heartbeat.client) if shard_id in w.shards), None)
    except (RedisConnectionError, RedisTimeoutError):
        return None  # Redis away: run it (a duplicate is harmless, a lost shard is not)


@contextlib.contextmanager
def computing(shard_id: int, device: str, urgent: bool = False) -> Iterator[None]:
    """Hold a lease on ``shard_id`` (in this worker's heartbeat) while it computes; on a GPU, on this thread's own
    CUDA stream (a worker computing several shards at once, STRATA_GPU_WORKER_THREADS: one's copies overlap
    another's kernels), synchronised before the block exits. ``urgent`` (an interactive shot's shard): on the
    thread's high-priority stream, whose kernels the GPU schedules ahead of the batch strips' beside it, and first
    in line for a device slot (``services.pipeline.gate``)."""
    if _heartbeat is not None:
        _heartbeat.add_shard(shard_id)
    token = gate.urgent.set(urgent)  # an urgent shard takes the next free device slot first
    try:
        if device.startswith("cuda"):
            import torch

            stream = _thread_stream(device, urgent)
            with torch.cuda.stream(stream):
                yield
            stream.synchronize()
        else:
            yield
    finally:
        gate.urgent.reset(token)
        if _heartbeat is not None:
            _heartbeat.discard_shard(shard_id)


_streams = threading.local()


def _thread_stream(device: str, urgent: bool = False) -> Any:
    """This thread's CUDA stream on ``device``, its high-priority one when ``urgent`` (each created once per
    thread; torch maps the priority onto the device's range)."""
    import torch

    name = "urgent" if urgent else "stream"
    stream = getattr(_streams, name, None)
    if stream is None:
        stream = torch.cuda.Stream(device=torch.device(device), priority=-8 if urgent else 0)
        setattr(_streams, name, stream)
    return stream


@contextlib.contextmanager
def holding(job_id: str) -> Iterator[None]:
    """Hold a lease on ``job_id`` (in this coordinator's heartbeat) while a step of it runs."""
    if _heartbeat is None:
        yield
        return
    _heartbeat.hold(job_id)
    try:
        yield
    finally:
        _heartbeat.release(job_id)


def request_stop() -> None:
    """Celery's warm or cold shutdown was asked for (its signal handler, on the main thread): end the start's waits
    for the database and storage at once. Found timing the tests: a worker still waiting for an unmigrated database
    said "Warm shutdown" and ran on until its supervisor's SIGKILL 20 s later, since :func:`stop` runs only once
    Celery's loop, blocked in that wait, gets to its shutdown. Set from a thread: the handler may have
    interrupted this very thread inside the Event's non-reentrant lock."""
    threading.Thread(target=_stopping.set, name="strata-stop", daemon=True).start()


def stop() -> None:
    _stopping.set()
    for event in _wakes.values():
        event.set()
    if _heartbeat is not None:
        _heartbeat.stop()


def context() -> WorkerContext:
    """This worker's identity; a task run outside a started worker (tests) computes on the CPU."""
    if _ctx is None:
        return WorkerContext(name=f"local@{this_host()}", kind="gpu", gpu="cpu", device="cpu")
    return _ctx


def _strip_memory_mb(device: str, fraction: float) -> int:
    """The GPU memory strips may plan for: a share of what is free once the model is resident (0 on the CPU)."""
    if not device.startswith("cuda"):
        return 0
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free * fraction) >> 20


def gpu_capacity() -> tuple[int, int]:
    """(live GPU workers, the smallest memory budget among them; 0 when any is unknown) for planning. Workers, not
    their threads (STRATA_GPU_WORKER_THREADS): planning a strip or frame group per thread was measured slower on
    one H200 (docs/PERFORMANCE.md, "Two shards at once")."""
    from workers.app import broker_url

    try:
        workers = live_workers(redis_client(broker_url(get_settings())), "gpu")
    except Exception:  # noqa: BLE001 - planning still works with one worker and default strips
        return 1, 0
    budgets = [w.strip_budget_mb for w in workers]
    return max(1, len(workers)), (min(budgets) if budgets and min(budgets) > 0 else 0)


def gpu_worker_count() -> int:
    from workers.app import broker_url

    try:
        return max(1, len(live_workers(redis_client(broker_url(get_settings())), "gpu")))
    except Exception:  # noqa: BLE001 - planning still works with one group
        return 1
