"""Thin Celery tasks: open a session, load by id, call one service function, enqueue what it returns."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import redis
from celery import Task
from celery.signals import (
    after_setup_logger,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import LockError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from services.batches.admission import Admission, admission_pass, unsent_notifications
from services.batches.notify import notification
from services.batches.service import record_delivery
from services.batches.webhook import refused_address
from services.config import get_settings
from services.db.models import Job
from services.db.session import mark_worker_process, reset_engine, session_scope
from services.errors import IntermediateLost, NotFound, StorageUnavailable
from services.jobs import flow
from services.jobs.previews import preview_ingested
from services.jobs.quiet import QuietWindow
from services.jobs.reconcile import Held, reconcile, unsent_ingests
from services.jobs.retention import PruneReport, retention_pass, sweep_recently_ended
from services.jobs.service import mark_enqueued
from services.jobs.states import ACTIVE
from services.jobs.tickets import Repairs, ShardOutcome, ShardTicket
from services.metrics import GPU_BUSY_SECONDS, RETRIES, SHARD_SECONDS, STAGE_SECONDS
from services.storage import get_storage
from services.storage.intermediates import sweep_partials
from workers import runtime
from workers.app import (
    COORDINATOR_QUEUE,
    COORDINATOR_QUEUES,
    GPU_QUEUE,
    GPU_QUEUES,
    INTERACTIVE_GPU_QUEUE,
    PRIORITIES,
    REPAIR_PRIORITY,
    broker_url,
    celery_app,
    coordinator_queue,
    gpu_queue,
)
from workers.express import ExpressLane
from workers.registry import (
    ADMISSION_LOCK,
    CANNOT_START_EXIT,
    RECONCILE_LOCK,
    RETENTION_LOCK,
    abandoned,
    forget_abandoned,
    heartbeat_ttl,
    leases,
    live_workers,
    queue_depths,
    redis_client,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_express: ExpressLane | None = None  # a GPU worker's consumer of interactive shards (STRATA_GPU_EXPRESS_LANE)


def _priority(name: str, repair: bool) -> int:
    return REPAIR_PRIORITY if repair else PRIORITIES.get(name, PRIORITIES["interactive"])


def dispatch_shards(tickets: list[ShardTicket], repair: bool = False) -> None:
    """Send shard tasks: to the shared GPU queue, or to one worker's own queue when a split_ratio applies;
    ``repair``: ahead of everything queued (the reconciler's re-dispatches)."""
    slots = None
    for t in tickets:
        queue = gpu_queue(t.priority)
        if t.slot is not None:
            if slots is None:
                slots = live_workers(redis_client(broker_url(get_settings())), "gpu")
            if t.slot < len(slots):
                queue = slots[t.slot].queue
        run_shard.apply_async((t.shard_id,), {"urgent": t.priority == "interactive"}, queue=queue,
                              priority=_priority(t.priority, repair))


def dispatch_advance(job_id: str, priority: str, repair: bool = False) -> None:
    advance.apply_async((job_id,), queue=coordinator_queue(priority), priority=_priority(priority, repair))


def enqueue_ingest(job_id: str, priority: str, repair: bool = False, retry: bool = True) -> None:
    """``retry`` False: one try at the publish (the outbox's send, which tries again later itself)."""
    ingest.apply_async((job_id,), queue=coordinator_queue(priority), priority=_priority(priority, repair),
                       retry=retry)


# What a send to a broker that is down raises (kombu wraps connection errors in its OperationalError).
BROKER_DOWN = (KombuOperationalError, redis.RedisError, OSError)


@functools.cache
def quiet_window(url: str, max_wait_s: float) -> QuietWindow:
    """This process's handle on the disk's quiet window (one Redis client per broker URL)."""
    return QuietWindow(redis_client(url), max_wait_s)


def _quiet() -> QuietWindow:
    settings = get_settings()
    return quiet_window(broker_url(settings), settings.interactive_quiet_s)


def send_ingest(job_id: str, priority: str, session: Session | None = None) -> bool:
    """The outbox's send: enqueue the job's ingest and record it (``jobs.enqueued_at``); False when the broker
    is down (the job stays in the outbox and the coordinator's outbox pass sends it once the broker is back).
    ``session``: the caller's, to record it with (an API request must not hold a second pooled connection while
    its own holds one: 30 uploads at once then exhausted the pool, each waiting for another's connection)."""
    try:
        enqueue_ingest(job_id, priority, retry=False)  # a broker that hangs: STRATA_BROKER_TIMEOUT_S, then later
    except BROKER_DOWN as exc:
        log.warning("job %s: ingest not sent (broker unreachable: %s); the outbox sends it later", job_id, exc)
        return False
    if session is not None:
        mark_enqueued(session, job_id)
        return True
    with session_scope() as own:
        mark_enqueued(own, job_id)
    return True


def _start_over(exc: IntermediateLost) -> None:
    """A step found an intermediate gone (its host crashed): the job starts over from its uploads (rewind_job
    says so). A job that ended meanwhile (cancelled: its intermediates were removed under the step) is left be."""
    with session_scope() as session:
        job = session.get(Job, exc.job_id)
        if job is None or job.status not in ACTIVE:
            log.info("job %s ended meanwhile (%s): %s", exc.job_id, job.status if job else "deleted", exc)
            return
        priority = job.priority
        restart = flow.rewind_job(session, get_storage(), exc.job_id, str(exc))
    if restart:
        enqueue_ingest(exc.job_id, priority)


# The database or broker being briefly away is no reason to fail a job: such tasks are retried with back-off
# (and the coordinator's reconciler re-dispatches anything still lost afterwards).
TRANSIENT = (OperationalError, InterfaceError, redis.ConnectionError, StorageUnavailable)
RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": 2, "retry_backoff_max": 60, "max_retries": 20}


def _coordinator_step(step: str, job_id: str, work: Callable[[], list[ShardTicket]]) -> None:
    """Run one coordinator step of a job and dispatch the shards it returns. A job that is gone is skipped;
    transient errors propagate (the task retries); a lost intermediate starts the job over; anything else fails
    the job with its reason."""
    try:
        tickets = work()
    except NotFound:
        return
    except IntermediateLost as exc:
        _start_over(exc)
        return
    except TRANSIENT:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure ends the job with its reason
        log.exception("%s of job %s failed", step, job_id)
        with session_scope() as session:
            flow.fail_job(session, job_id, f"{step} failed: {exc}", get_storage())
        admit_soon()
        return
    dispatch_shards(tickets)
    if not tickets:  # the job may have ended: its batch-lane slot is free now
        admit_soon()


@celery_app.task(name="strata.ingest", **RETRY)
def ingest(job_id: str) -> None:
    def work() -> list[ShardTicket]:
        with session_scope() as session:
            n_workers, memory_mb = runtime.gpu_capacity()
            return flow.ingest_job(session, get_storage(), get_settings(), job_id, n_workers, memory_mb)

    with STAGE_SECONDS.labels(stage="ingest").time(), runtime.holding(job_id):
        _coordinator_step("ingest", job_id, work)
    try:  # after the shards went out: the GPUs do not wait for the preview
        with session_scope() as session:
            preview_ingested(session, get_storage(), job_id, get_settings().batch_encode_nice)
    except Exception:  # noqa: BLE001 - a preview never fails or retries a job
        log.exception("job %s: fast preview failed", job_id)


@celery_app.task(name="strata.run_shard", bind=True, max_retries=get_settings().shard_max_retries)
def run_shard(self: Task, shard_id: int, urgent: bool = False) -> None:
    """Compute one shard; ``urgent`` (an interactive shot's) on the worker's high-priority GPU stream."""

    def retry(exc: Exception, countdown: float, max_retries: int | None) -> None:
        raise self.retry(exc=exc, countdown=countdown, max_retries=max_retries) from exc

    compute_shard(shard_id, urgent, self.request.retries, retry)


def compute_shard(shard_id: int, urgent: bool, attempt: int,
                  retry: Callable[[Exception, float, int | None], None]) -> None:
    """The shard task's body, for Celery's pool and the express lane alike: ``attempt`` is the retries so far,
    ``retry(exc, countdown, max_retries)`` sends the shard again later (and ends this attempt)."""
    settings = get_settings()
    ctx = runtime.context()
    holder = runtime.held_elsewhere(shard_id)
    if holder is not None:
        log.warning("shard %s: %s computes it already; this second delivery is dropped (are STRATA_VISIBILITY_"
                    "TIMEOUT_S and STRATA_NODE_NAME right on every host?)", shard_id, holder)
        return
    t0 = time.perf_counter()
    outcome: ShardOutcome | None = None
    try:
        with runtime.computing(shard_id, ctx.device, urgent), session_scope() as session:
            outcome = flow.run_shard(session, get_storage(), shard_id, worker=ctx.name, gpu=ctx.gpu,
                                     device=ctx.device, delay_s=settings.fault_shard_delay_s, quiet=_quiet())
    except NotFound:
        return
    except IntermediateLost as exc:
        _start_over(exc)
        return
    except TRANSIENT as exc:
        RETRIES.labels(task="run_shard").inc()
        delay = min(2 ** (attempt + 1), 60)
        log.warning("shard %s: %s; retrying in %d s", shard_id, exc, delay)
        with contextlib.suppress(*TRANSIENT), session_scope() as session:  # the database may be what is away
            flow.note_retry(session, shard_id, delay)
        retry(exc, delay, 20)
        return
    except Exception as exc:  # noqa: BLE001 - retried a bounded number of times, then the job fails
        with session_scope() as session:
            if flow.shard_abandoned(session, get_storage(), shard_id):  # e.g. cancelled while it computed
                log.info("shard %s stopped (%s: %s): its job ended or moved on meanwhile", shard_id,
                         type(exc).__name__, exc)
                return
        final = attempt >= settings.shard_max_retries
        log.exception("shard %s failed (attempt %d)", shard_id, attempt + 1)
        with session_scope() as session:
            flow.record_shard_failure(session, shard_id, f"{type(exc).__name__}: {exc}", final=final,
                                      storage=get_storage(), retry_in_s=1)
        if not final:
            RETRIES.labels(task="run_shard").inc()
            retry(exc, 1, None)
        return
    finally:
        seconds = time.perf_counter() - t0
        SHARD_SECONDS.labels(kind=outcome.kind if outcome is not None else "unfinished").observe(seconds)
        GPU_BUSY_SECONDS.labels(worker=ctx.name, gpu=ctx.gpu).inc(seconds)
    if outcome.phase_complete:
        dispatch_advance(outcome.job_id, outcome.priority)


def express_shard(task: str, args: list[Any], kwargs: dict[str, Any], retries: int, wait_s: float = 0.0) -> None:
    """The express lane's handler (workers/express.py): a shard task taken off the interactive GPU queue, run on
    the lane's thread. A retry, or a message whose countdown has not run out (``wait_s``), goes to the shared GPU
    queue at the interactive priority as an ordinary Celery message, whose consumers hold it until it is due."""
    if task != run_shard.name:
        log.warning("express lane: %s is not a shard task; dropped", task)
        return
    shard_id, urgent = int(args[0]), bool(kwargs.get("urgent", args[1] if len(args) > 1 else False))

    def later(countdown: float, attempts: int) -> None:
        run_shard.apply_async((shard_id,), {"urgent": urgent}, queue=GPU_QUEUE,
                              priority=_priority("interactive", False), countdown=countdown, retries=attempts)

    def retry(exc: Exception, countdown: float, max_retries: int | None) -> None:
        if max_retries is not None and retries >= max_retries:
            raise exc
        later(countdown, retries + 1)

    if wait_s > 0:
        later(wait_s, retries)
        return
    compute_shard(shard_id, urgent, retries, retry)


@celery_app.task(name="strata.advance", **RETRY)
def advance(job_id: str) -> None:
    def work() -> list[ShardTicket]:
        with session_scope() as session:
            return flow.advance_job(session, get_storage(), get_settings(), job_id, _quiet())

    with STAGE_SECONDS.labels(stage="advance").time(), runtime.holding(job_id):
        _coordinator_step("advance", job_id, work)


def reconcile_once() -> Repairs | None:
    """One reconciliation pass (one coordinator at a time): re-dispatch lost work."""

    def work(client: redis.Redis) -> Repairs:
        settings = get_settings()
        alive = {w.name for w in live_workers(client, "gpu")}
        depths = queue_depths(client, [*COORDINATOR_QUEUES, *GPU_QUEUES])
        backlog = sum(depths[q] for q in COORDINATOR_QUEUES)
        stale_after_s = max(settings.visibility_timeout_s, 30)
        ttl = heartbeat_ttl(settings.worker_heartbeat_s)
        judged: list[tuple[frozenset[str], frozenset[int]]] = []

        def held() -> Held | None:
            if int(client.info("server").get("uptime_in_seconds", 0)) < ttl:
                return None  # a restarted Redis: live workers have not all beaten again yet
            jobs, shards = abandoned(client)  # before the heartbeats: a lease handed back is not live again
            now = leases(client)
            judged.append((jobs, shards))
            return Held(now.alive, now.shards, now.jobs, jobs, shards)

        with session_scope() as session:
            repairs = reconcile(session, alive_workers=alive, coordinator_backlog=backlog,
                                stale_after_s=min(stale_after_s, settings.lost_message_after_s), held=held,
                                grace_s=ttl, gpu_backlog=sum(depths[q] for q in GPU_QUEUES))
            unsent = unsent_notifications(session, stale_after_s)
            try:  # the repairs go out even while the object store is away (said once a minute, not a pass)
                sweep_recently_ended(session, get_storage(), within_s=60, partials_older_than_s=ttl)
                runtime.outage.passed("reconcile sweep")
            except StorageUnavailable as exc:
                runtime.outage.failed("reconcile sweep", exc)
        for job_id, priority in repairs.ingest:
            log.warning("reconcile: re-enqueueing ingest of job %s", job_id)
            sweep_partials(get_storage(), job_id, older_than_s=ttl)  # a live writer's file is newer
            enqueue_ingest(job_id, priority, repair=True)
        if repairs.shards:
            log.warning("reconcile: re-dispatching %d lost shard(s)", len(repairs.shards))
            for job_id in {t.job_id for t in repairs.shards if t.job_id}:
                sweep_partials(get_storage(), job_id, older_than_s=ttl)
            dispatch_shards(repairs.shards, repair=True)
        for job_id, priority in repairs.advance:
            log.warning("reconcile: advancing stalled job %s", job_id)
            dispatch_advance(job_id, priority, repair=True)
        for batch_id in unsent:
            log.warning("reconcile: re-sending the lost webhook of batch %s", batch_id)
            notify_batch.apply_async((batch_id,), queue=COORDINATOR_QUEUE)
        for jobs, shards in judged:  # after the re-dispatches: a send that failed is judged again next pass
            forget_abandoned(client, jobs, shards)
        return repairs

    return _exclusive(RECONCILE_LOCK, 30, work)


def batch_capacity(client: redis.Redis) -> int:
    """Batch-lane jobs allowed in flight: STRATA_BATCH_IN_FLIGHT, else enough to keep every stage busy: two per
    live GPU worker slot (one computing, one queued behind it; a worker has STRATA_GPU_WORKER_THREADS slots) and
    one per live batch coordinator slot (jobs decoding or encoding their TIFFs; interactive shots' ingest and
    finalize go to the express coordinator, so no slot is kept spare for them: 10 on one H200 host with the
    defaults, which rendered a 48-shot batch at 3.11-3.23 frames/s sustained against 2.53-2.56 with 7 and two
    slots a coordinator, docs/PERFORMANCE.md). At least GPU slots + 1.
    Before, GPU workers + 1 left one H200 idle 80 % of a batch: a job's TIFF encode (about 1 s) was the only work
    that overlapped the next job's GPU work."""
    settings = get_settings()
    if settings.batch_in_flight:
        return settings.batch_in_flight
    gpus = sum(max(1, w.slots) for w in live_workers(client, "gpu"))
    slots = sum(1 for w in live_workers(client, "coordinator") if w.lane != "interactive") * max(
        1, settings.coordinator_concurrency)  # an express coordinator never takes batch work
    return max(gpus + 1, 2 * gpus + slots)


def _exclusive(lock_name: str, timeout: int, work: Callable[[redis.Redis], T]) -> T | None:
    """Run ``work`` while holding a redis-py Lock (one coordinator at a time); None when another holds it."""
    client = redis_client(broker_url(get_settings()))
    lock = client.lock(lock_name, timeout=timeout, blocking=False)
    if not lock.acquire(token=runtime.context().name.encode() + b"-" + uuid.uuid4().hex.encode()):
        return None
    try:
        return work(client)
    finally:
        with contextlib.suppress(LockError):  # expired and perhaps taken by another coordinator: not ours to free
            lock.release()


def send_outbox() -> int:
    """Send the ingests the outbox holds (admitted jobs whose message never reached the broker); how many."""
    with session_scope() as session:
        unsent = unsent_ingests(session, get_settings().outbox_grace_s)
    for job_id, priority in unsent:
        log.warning("outbox: sending the ingest of job %s", job_id)
        if not send_ingest(job_id, priority):
            break
    return len(unsent)


def admit_once() -> Admission | None:
    """One admission pass (one coordinator at a time): send the ingests of the batch-lane jobs admitted now,
    notify the webhooks of batches that ended."""

    def work(client: redis.Redis) -> Admission:
        with session_scope() as session:
            result = admission_pass(session, get_settings(), batch_capacity(client))
        for job_id, priority in result.ingest:
            send_ingest(job_id, priority)
        send_outbox()
        for batch_id in result.finished:
            log.info("batch %s finished", batch_id)
            notify_batch.apply_async((batch_id,), queue=COORDINATOR_QUEUE)
        return result

    return _exclusive(ADMISSION_LOCK, 30, work)


def retention_once() -> PruneReport | None:
    """One retention pass (one coordinator at a time): left-behind intermediates, then uploads and outputs older
    than STRATA_RETENTION_DAYS."""

    def work(_: redis.Redis) -> PruneReport:
        with session_scope() as session:
            report = retention_pass(session, get_storage(), get_settings().retention_days)
        if (report.jobs or report.intermediates_swept or report.uploads_aborted or report.partials_swept
                or report.orphans_swept):
            log.info("retention: pruned %d job(s), %d bytes; swept intermediates of %d; aborted %d stale upload(s), "
                     "removed %d half-written file(s) and the uploads of %d unrecorded job(s)", len(report.jobs),
                     report.bytes, len(report.intermediates_swept), report.uploads_aborted, report.partials_swept,
                     len(report.orphans_swept))
        return report

    return _exclusive(RETENTION_LOCK, 600, work)


def admit_soon() -> None:
    """A job ended: run an admission pass now rather than at the next tick, on the coordinator's admission thread
    (the slot that ended the job is free at once: under a batch the pass held it 0.25 s after each finalize), or
    here where this process runs none (skipped if a pass is running elsewhere)."""
    if runtime.wake("admission"):
        return
    try:
        admit_once()
    except Exception:  # noqa: BLE001 - the periodic pass runs again within a second
        log.exception("admission pass failed")


@celery_app.task(name="strata.notify_batch", bind=True, max_retries=None)
def notify_batch(self: Task, batch_id: str) -> None:
    """POST the signed batch.finished message; retried with exponential back-off up to
    STRATA_WEBHOOK_MAX_ATTEMPTS deliveries, each attempt recorded on the batch row."""
    settings = get_settings()
    with session_scope() as session:
        message = notification(session, batch_id)
    if message is None:
        return
    refused = refused_address(message.url, settings.webhook_allow_loopback)
    if refused is not None:  # a host name that resolves to the server itself or a metadata service: never sent
        log.warning("batch %s webhook %s", batch_id, refused)
        with session_scope() as session:
            record_delivery(session, batch_id, refused, False)
        return
    try:
        response = httpx.post(message.url, content=message.body, headers=message.headers,
                              timeout=settings.webhook_timeout_s)
        delivered, status = response.is_success, f"HTTP {response.status_code}"
    except httpx.HTTPError as exc:  # the batch shows the kind of failure; the log has the details
        delivered, status = False, f"not delivered ({type(exc).__name__})"
        log.warning("batch %s webhook: %s: %s", batch_id, type(exc).__name__, exc)
    with session_scope() as session:
        attempts = record_delivery(session, batch_id, status, delivered)
    if not delivered:
        log.warning("batch %s webhook attempt %d: %s", batch_id, attempts, status)
        if attempts < settings.webhook_max_attempts:
            raise self.retry(countdown=settings.webhook_backoff_s * 2 ** (attempts - 1))


@after_setup_logger.connect
def _json_logs(logger: logging.Logger | None = None, **_: object) -> None:
    """STRATA_LOG_FORMAT=json: the worker's log lines become JSON objects too (with job and shard ids)."""
    if get_settings().log_format == "json" and logger is not None:
        from services.logs import JsonFormatter

        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


@worker_init.connect
def _worker_engine(**_: object) -> None:
    mark_worker_process()  # STRATA_WORKER_COMMITS: this worker's commits need not wait for the disk


@worker_process_init.connect
def _fresh_engine(**_: object) -> None:
    reset_engine()  # never share database connections across a fork


@worker_ready.connect
def _on_ready(sender: object = None, **_: object) -> None:
    log.info("database commits of this worker: %s (STRATA_WORKER_COMMITS)", get_settings().worker_commits)
    try:
        runtime.start(getattr(sender, "hostname", "worker"), reconcile=reconcile_once, admit=admit_once,
                      retention=retention_once)
    except Exception:  # noqa: BLE001 - Celery would log it and consume anyway (found: a GPU worker on the CPU)
        log.critical("worker cannot start; exiting", exc_info=True)
        logging.shutdown()
        os._exit(CANNOT_START_EXIT)
    settings = get_settings()
    if settings.worker_kind == "gpu" and settings.gpu_express_lane:  # the launcher resolves the default
        global _express
        _express = ExpressLane(celery_app, INTERACTIVE_GPU_QUEUE, express_shard)
        _express.start()


@worker_shutting_down.connect
def _on_shutting_down(**_: object) -> None:
    runtime.request_stop()  # a start still waiting for its database returns now


@worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    if _express is not None:
        _express.stop()
    runtime.stop()
