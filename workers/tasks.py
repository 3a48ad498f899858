"""Thin Celery tasks: open a session, load by id, call one service function, enqueue what it returns."""

from __future__ import annotations

import logging

import redis
from celery import Task
from celery.signals import worker_process_init, worker_ready, worker_shutdown
from sqlalchemy.exc import InterfaceError, OperationalError

from services.config import get_settings
from services.db.models import Job
from services.db.session import reset_engine, session_scope
from services.errors import NotFound
from services.jobs import flow
from services.storage import get_storage
from workers import runtime
from workers.app import COORDINATOR_QUEUE, PRIORITIES, broker_url, celery_app
from workers.registry import live_workers, queue_depths, redis_client

log = logging.getLogger(__name__)


def dispatch_shards(tickets: list[flow.ShardTicket]) -> None:
    """Send shard tasks: to the shared GPU queue, or to one worker's own queue when a split_ratio applies."""
    slots = None
    for t in tickets:
        queue = runtime.SHARED_GPU_QUEUE
        if t.slot is not None:
            if slots is None:
                slots = live_workers(redis_client(broker_url(get_settings())), "gpu")
            if t.slot < len(slots):
                queue = slots[t.slot].queue
        run_shard.apply_async((t.shard_id,), queue=queue, priority=PRIORITIES.get(t.priority, 0))


def dispatch_advance(job_id: str, priority: str) -> None:
    advance.apply_async((job_id,), queue=COORDINATOR_QUEUE, priority=PRIORITIES.get(priority, 0))


def enqueue_ingest(job_id: str, priority: str) -> None:
    ingest.apply_async((job_id,), queue=COORDINATOR_QUEUE, priority=PRIORITIES.get(priority, 0))


def _start_over(exc: flow.IntermediateLost) -> None:
    """A step found an intermediate gone (its host crashed): the job starts over from its uploads."""
    log.warning("job %s: %s", exc.job_id, exc)
    with session_scope() as session:
        job = session.get(Job, exc.job_id)
        priority = job.priority if job is not None else "interactive"
        restart = flow.rewind_job(session, get_storage(), exc.job_id, str(exc))
    if restart:
        enqueue_ingest(exc.job_id, priority)


def _fail(job_id: str, step: str, exc: BaseException) -> None:
    log.exception("%s of job %s failed", step, job_id)
    with session_scope() as session:
        flow.fail_job(session, job_id, f"{step} failed: {exc}", get_storage())


# The database or broker being briefly away is no reason to fail a job: such tasks are retried with back-off
# (and the coordinator's reconciler re-dispatches anything still lost afterwards).
TRANSIENT = (OperationalError, InterfaceError, redis.ConnectionError)
RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": 2, "retry_backoff_max": 60, "max_retries": 20}


@celery_app.task(name="strata.ingest", **RETRY)
def ingest(job_id: str) -> None:
    settings = get_settings()
    try:
        with session_scope() as session:
            tickets = flow.ingest_job(session, get_storage(), settings, job_id, runtime.gpu_worker_count())
    except (NotFound, *TRANSIENT) as exc:
        if isinstance(exc, NotFound):
            return
        raise
    except Exception as exc:  # noqa: BLE001 - any failure ends the job with its reason
        _fail(job_id, "ingest", exc)
        return
    dispatch_shards(tickets)


@celery_app.task(name="strata.run_shard", bind=True, max_retries=get_settings().shard_max_retries)
def run_shard(self: Task, shard_id: int) -> None:
    settings = get_settings()
    ctx = runtime.context()
    try:
        with session_scope() as session:
            outcome = flow.run_shard(session, get_storage(), shard_id, worker=ctx.name, gpu=ctx.gpu,
                                     device=ctx.device, delay_s=settings.fault_shard_delay_s)
    except NotFound:
        return
    except flow.IntermediateLost as exc:
        _start_over(exc)
        return
    except TRANSIENT as exc:
        raise self.retry(exc=exc, countdown=min(2 ** (self.request.retries + 1), 60), max_retries=20) from exc
    except Exception as exc:  # noqa: BLE001 - retried a bounded number of times, then the job fails
        final = self.request.retries >= settings.shard_max_retries
        log.exception("shard %s failed (attempt %d)", shard_id, self.request.retries + 1)
        with session_scope() as session:
            flow.record_shard_failure(session, shard_id, f"{type(exc).__name__}: {exc}", final=final,
                                      storage=get_storage())
        if not final:
            raise self.retry(exc=exc, countdown=1) from exc
        return
    if outcome.phase_complete:
        dispatch_advance(outcome.job_id, outcome.priority)


@celery_app.task(name="strata.advance", **RETRY)
def advance(job_id: str) -> None:
    try:
        with session_scope() as session:
            tickets = flow.advance_job(session, get_storage(), get_settings(), job_id)
    except (NotFound, *TRANSIENT) as exc:
        if isinstance(exc, NotFound):
            return
        raise
    except flow.IntermediateLost as exc:
        _start_over(exc)
        return
    except Exception as exc:  # noqa: BLE001
        _fail(job_id, "advance", exc)
        return
    dispatch_shards(tickets)


def reconcile_once() -> flow.Repairs | None:
    """One reconciliation pass (one coordinator at a time, through a Redis lock): re-dispatch lost work."""
    settings = get_settings()
    client = redis_client(broker_url(settings))
    if not client.set("strata:reconcile-lock", runtime.context().name, nx=True, ex=30):
        return None
    try:
        alive = {w.name for w in live_workers(client, "gpu")}
        backlog = queue_depths(client, [COORDINATOR_QUEUE])[COORDINATOR_QUEUE]
        with session_scope() as session:
            repairs = flow.reconcile(session, alive_workers=alive, coordinator_backlog=backlog,
                                     stale_after_s=max(settings.visibility_timeout_s, 30))
        for job_id, priority in repairs.ingest:
            log.warning("reconcile: re-enqueueing ingest of job %s", job_id)
            enqueue_ingest(job_id, priority)
        if repairs.shards:
            log.warning("reconcile: re-dispatching %d lost shard(s)", len(repairs.shards))
            dispatch_shards(repairs.shards)
        for job_id, priority in repairs.advance:
            log.warning("reconcile: advancing stalled job %s", job_id)
            dispatch_advance(job_id, priority)
        return repairs
    finally:
        client.delete("strata:reconcile-lock")


@worker_process_init.connect
def _fresh_engine(**_: object) -> None:
    reset_engine()  # never share database connections across a fork


@worker_ready.connect
def _on_ready(sender: object = None, **_: object) -> None:
    runtime.start(getattr(sender, "hostname", "worker"))


@worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    runtime.stop()
