"""The reconciler: finds work that no queue message will deliver again and says what to re-dispatch."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Job, as_utc, utcnow
from services.jobs.plan import phase_count
from services.jobs.states import ACTIVE, JobStatus, ShardStatus
from services.jobs.tickets import Repairs, ShardTicket


def unsent_ingests(session: Session, grace_s: float, limit: int = 500) -> list[tuple[str, str]]:
    """The outbox: admitted, still-queued jobs whose ingest message was never handed to the broker (the API or
    the admission pass found it down), oldest first, once ``grace_s`` has passed (their sender may still be at
    it)."""
    cutoff = utcnow() - dt.timedelta(seconds=grace_s)
    rows = session.execute(
        select(Job.id, Job.priority).where(Job.status == JobStatus.QUEUED, Job.phase < 0,
                                           Job.admitted_at.is_not(None), Job.admitted_at < cutoff,
                                           Job.enqueued_at.is_(None))
        .order_by(Job.admitted_at).limit(limit))
    return [(job_id, priority) for job_id, priority in rows]


def reconcile(session: Session, *, alive_workers: set[str], coordinator_backlog: int, stale_after_s: float
              ) -> Repairs:
    """Find work that no message will ever deliver again and say what to re-dispatch.

    Everything it returns is idempotent to run twice, so a duplicate of a message still in flight is harmless:
    - shards marked running on a worker whose heartbeat is gone (redelivered to the shared GPU queue);
    - shards pinned to a worker's own queue (split_ratio) whose worker is gone;
    - running jobs whose current phase is complete but that did not advance;
    - queued jobs never ingested while the coordinator queue is empty (their message was lost); jobs of the batch
      lane still waiting for admission (``admitted_at`` null) were never sent and are left to admission.
    """
    stale = utcnow() - dt.timedelta(seconds=stale_after_s)
    repairs = Repairs([], [], [])
    for job in session.scalars(select(Job).where(Job.status.in_(ACTIVE))).all():
        if job.status == JobStatus.QUEUED and job.phase < 0:
            if job.admitted_at is None:  # waiting for admission (batch lane): no message was ever sent
                continue
            if coordinator_backlog == 0 and as_utc(job.admitted_at) < stale:
                repairs.ingest.append((job.id, job.priority))
            continue
        if job.phase < 0 or job.phase >= phase_count(job.params):
            continue
        shards = [s for s in job.shards if s.phase == job.phase]
        if shards and all(s.status == ShardStatus.DONE for s in shards):
            last = max((s.finished_at for s in shards if s.finished_at), default=None)
            if last is not None and as_utc(last) < stale:
                repairs.advance.append((job.id, job.priority))
            continue
        for s in shards:
            lost_runner = s.status == ShardStatus.RUNNING and s.worker not in alive_workers
            lost_pin = s.status == ShardStatus.PENDING and s.payload.get("gpu_slot") is not None
            if (lost_runner or lost_pin) and as_utc(s.started_at or job.created_at) < stale:
                repairs.shards.append(ShardTicket(s.id, job.priority, None))
    return repairs
