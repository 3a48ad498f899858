"""The reconciler: finds work that no queue message will deliver again and says what to re-dispatch.

Work is leased, not timed out: a worker's heartbeat (every few seconds, gone after about three missed beats) says
which shard it computes and which jobs a coordinator ingests or advances. A shard or job the database shows in
progress but that no live heartbeat holds was lost with its worker and is re-dispatched at once, not after the
broker's visibility timeout. When the supervisor of a dead worker saw it die, it hands its leases back at once
(``abandoned``): those are re-dispatched at the next pass, without waiting for the heartbeat to expire or for the
coordinator queue to drain. The broker still redelivers the dead worker's message later; every step is
idempotent, so that duplicate finds its work done and counts nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import and_, not_, select, update
from sqlalchemy.orm import Session, selectinload

from services.db.models import Job, Shard, as_utc, utcnow
from services.db.session import execute_update
from services.jobs.plan import phase_count
from services.jobs.states import ACTIVE, RETRY_AT, JobStatus, ShardStatus, Stage
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


@dataclass(frozen=True)
class Held:
    """What the live workers hold now, read from their heartbeats (after the database rows, so that a step that
    started in between is seen as held)."""

    alive: frozenset[str]
    shards: frozenset[int]
    jobs: frozenset[str]
    # Held by a worker whose supervisor saw it die (its leases handed back): lost now, whatever the timing rules.
    abandoned_jobs: frozenset[str] = frozenset()
    abandoned_shards: frozenset[int] = frozenset()


def reconcile(session: Session, *, alive_workers: set[str], coordinator_backlog: int, stale_after_s: float,
              held: Callable[[], Held | None] | None = None, grace_s: float = 0.0,
              gpu_backlog: int | None = None) -> Repairs:
    """Find work that no message will ever deliver again and say what to re-dispatch.

    ``held`` returns None when the heartbeats cannot be trusted yet (Redis restarted less than a heartbeat's life
    ago): then only the timeout rules apply.

    Everything it returns is idempotent to run twice, so a duplicate of a message still in flight is harmless:
    - shards marked running that no live heartbeat holds (with ``held``: at once; without: running on a worker
      whose heartbeat is gone for ``stale_after_s``); they are marked pending again, so one re-dispatch is sent;
    - shards pinned to a worker's own queue (split_ratio) whose worker is gone;
    - pending shards of the shared queue that no message will deliver: their job's coordinator died between
      committing the phase and sending them (``abandoned_jobs``: at once), or the shared queue is empty
      (``gpu_backlog`` 0) ``grace_s`` after the phase was planned or last repaired (a send the broker refused
      while it restarted, a GPU worker killed after taking the message but before starting the shard);
    - jobs whose ingest (phase -1, running) or advance/finalize no live coordinator holds: put back to queued
      (the ingest is re-sent) or advanced again, ``grace_s`` after their last step when the coordinator queue
      is empty; at once when the coordinator that held it was seen dying (``abandoned_jobs``);
    - queued jobs never ingested while the coordinator queue is empty (their message was lost); jobs of the batch
      lane still waiting for admission (``admitted_at`` null) were never sent and are left to admission.
    """
    now = utcnow()
    stale = now - dt.timedelta(seconds=stale_after_s)
    grace = now - dt.timedelta(seconds=grace_s)
    jobs = _sent_active_jobs(session)
    leases = held() if held is not None else None  # after the rows: a step started in between is seen as held
    repairs = Repairs([], [], [])
    for job in jobs:
        held_job = leases is not None and job.id in leases.jobs
        dropped = leases is not None and not held_job and job.id in leases.abandoned_jobs
        if job.phase < 0:
            _lost_ingest(session, job, repairs, leases, held_job, coordinator_backlog, stale, dropped)
            continue
        finalizing = job.phase >= phase_count(job.params)
        shards = [s for s in job.shards if s.phase == (job.phase - 1 if finalizing else job.phase)]
        if finalizing or (shards and all(s.status == ShardStatus.DONE for s in shards)):
            last = max((s.finished_at for s in shards if s.finished_at), default=None)
            cutoff = grace if leases is not None and coordinator_backlog == 0 and not held_job else stale
            if dropped:  # its coordinator died while advancing it: no advance message is on its way
                cutoff = now
            # Not again until another cutoff has passed since the last re-send (the touch below): found from outside,
            # for the seconds after Redis came back empty no lease could be read, every pass of every coordinator
            # re-sent the advance, and one job was finalized nine times.
            touched = as_utc(job.updated_at or job.created_at) <= cutoff or dropped
            if last is not None and as_utc(last) <= cutoff and touched:
                execute_update(session, update(Job).where(Job.id == job.id).values(updated_at=utcnow()))
                repairs.advance.append((job.id, job.priority))
            continue
        lost = [s for s in shards if _lost_shard(session, s, job, alive_workers, leases, stale, grace)]
        repairs.shards += [ShardTicket(s.id, job.priority, None, job.id) for s in lost]
        unsent = [s for s in shards if s.status == ShardStatus.PENDING and s.payload.get("gpu_slot") is None
                  and s not in lost and not _retry_due_after(s, grace)]
        if unsent and leases is not None and not held_job and (dropped or (
                gpu_backlog == 0 and as_utc(job.updated_at or job.created_at) < grace)):
            # Touched: the next pass waits another grace before sending them again (the queue is no longer empty).
            execute_update(session, update(Job).where(Job.id == job.id).values(updated_at=utcnow()))
            repairs.shards += [ShardTicket(s.id, job.priority, None, job.id) for s in unsent]
    session.commit()
    return repairs


def _sent_active_jobs(session: Session) -> Sequence[Job]:
    """Queued and running jobs with their shards, but not the batch lane's shots waiting for admission: no message
    was ever sent for those (found from outside: with 40,000 of them queued, each pass loaded them all, 3.9 s and
    0.5 GB every 3 s, to skip every one)."""
    waiting = and_(Job.status == JobStatus.QUEUED, Job.admitted_at.is_(None))
    return session.scalars(select(Job).where(Job.status.in_(ACTIVE), not_(waiting))
                           .options(selectinload(Job.shards))).all()


def _lost_ingest(session: Session, job: Job, repairs: Repairs, leases: Held | None, held_job: bool,
                 coordinator_backlog: int, stale: dt.datetime, dropped: bool = False) -> None:
    if job.status == JobStatus.RUNNING:  # decoding: lost when no live coordinator holds it
        if leases is None or held_job:
            return
        if execute_update(session, update(Job).where(Job.id == job.id, Job.status == JobStatus.RUNNING,
                                                     Job.phase == -1)
                          .values(status=JobStatus.QUEUED, stage=Stage.QUEUED)):
            repairs.ingest.append((job.id, job.priority))
        return
    if job.admitted_at is None:  # waiting for admission (batch lane): no message was ever sent
        return
    sent = max(as_utc(job.admitted_at), as_utc(job.updated_at or job.admitted_at))  # a re-send touches updated_at
    if not held_job and (dropped or (coordinator_backlog == 0 and sent < stale)):
        execute_update(session, update(Job).where(Job.id == job.id).values(updated_at=utcnow()))
        repairs.ingest.append((job.id, job.priority))


def _retry_due_after(s: Shard, moment: dt.datetime) -> bool:
    """The shard's retry message (flow.note_retry) is due after ``moment``: it is on its way, not lost."""
    due = s.payload.get(RETRY_AT)
    return isinstance(due, (int, float)) and due > moment.timestamp()


def _lost_shard(session: Session, s: Shard, job: Job, alive_workers: set[str], leases: Held | None,
                stale: dt.datetime, grace: dt.datetime) -> bool:
    started = as_utc(s.started_at or job.created_at)
    if s.status == ShardStatus.PENDING:
        # Handed back by the supervisor of a worker that died after taking its message and listing it in its
        # heartbeat, but before marking it running (found from outside: SIGKILLed in that instant, the shard stayed
        # pending and its message unacknowledged; a shard pinned by STRATA_SPLIT_RATIO waited for the lost-message
        # timeout, 30 s, and one of the shared queue waited for that queue to empty, which a batch keeps from
        # happening). No live heartbeat holds it now and no retry is on its way: lost now, like a running one.
        if (leases is not None and s.id in leases.abandoned_shards and s.id not in leases.shards
                and not _retry_due_after(s, utcnow())):
            return True
        # pinned to a worker that is gone
        return s.payload.get("gpu_slot") is not None and started < stale and not _retry_due_after(s, stale)
    if s.status != ShardStatus.RUNNING:
        return False
    if leases is not None and s.id not in leases.shards and (started < grace or s.id in leases.abandoned_shards):
        lost = True
    else:
        lost = s.worker not in alive_workers and started < stale
    if not lost:
        return False
    # Pending again, for exactly this attempt: the next pass does not send it twice, and a worker that started
    # it meanwhile keeps it.
    return bool(execute_update(session, update(Shard).where(Shard.id == s.id, Shard.status == ShardStatus.RUNNING,
                                                            Shard.attempts == s.attempts)
                               .values(status=ShardStatus.PENDING)))
