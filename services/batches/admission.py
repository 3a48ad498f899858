"""Admission: the batch lane's jobs are sent to the queues a few at a time, fairly, inside their windows.

Run by one coordinator at a time (every STRATA_ADMISSION_INTERVAL_S and whenever a job ends); decided from
database rows only, so it is idempotent and survives restarts. It also ends batches whose last shot ended.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import Row, func, or_, select, update
from sqlalchemy.orm import Session

from services.batches.fairness import Candidate, fair_order
from services.batches.states import NOT_RUN_PREFIX, UNFINISHED, BatchStatus, WindowMissed
from services.batches.windows import Window, WindowState, next_window, studio_zone, window_state
from services.config import Settings
from services.db.models import Batch, Job, as_utc, utcnow
from services.db.session import execute_update
from services.jobs.states import ACTIVE, JobStatus, Priority, Stage


@dataclass
class Admission:
    """What the queue adapter sends after the pass committed."""

    ingest: list[tuple[str, str]] = field(default_factory=list)  # (job id, priority)
    finished: list[str] = field(default_factory=list)  # batches that ended (notify their webhook)


def _lane():  # type: ignore[no-untyped-def]
    return (Job.batch_id.is_not(None)) | (Job.priority == Priority.BATCH)


def in_flight(session: Session) -> int:
    """Batch-lane jobs admitted and not ended (decoding, on the GPUs or encoding)."""
    return int(session.scalar(select(func.count()).select_from(Job).where(
        _lane(), Job.admitted_at.is_not(None), Job.status.in_(ACTIVE))) or 0)


def admission_pass(session: Session, settings: Settings, capacity: int, now: dt.datetime | None = None
                   ) -> Admission:
    """Move windows, skip what a window missed, admit up to ``capacity`` in-flight batch-lane jobs, end batches."""
    now = now or utcnow()
    closed = _apply_windows(session, settings, now)
    result = Admission()
    free = capacity - in_flight(session)
    if free > 0:
        result.ingest = _admit(session, closed, free, now)
    result.finished = finish_batches(session, now)
    return result


def _apply_windows(session: Session, settings: Settings, now: dt.datetime) -> set[str]:
    """Batches whose window is not open now (their jobs are not admitted); a window that ended moves to the next
    day (wait) or its waiting shots end as not run (skip)."""
    zone = studio_zone(settings.timezone)
    closed: set[str] = set()
    batches = session.scalars(select(Batch).where(Batch.status.in_(UNFINISHED), (Batch.not_before.is_not(None))
                                                  | (Batch.not_after.is_not(None)))).all()
    for b in batches:
        window = Window(b.not_before and as_utc(b.not_before), b.not_after and as_utc(b.not_after))
        state = window_state(window, now)
        if state == WindowState.ENDED and (b.on_window_end or settings.batch_window_missed) == WindowMissed.SKIP:
            _skip_waiting(session, b, now)
        elif state == WindowState.ENDED:
            moved = next_window(window, now, zone)
            b.not_before, b.not_after = moved.not_before, moved.not_after
            state = window_state(moved, now)
        if state != WindowState.OPEN:
            closed.add(b.id)
        if state == WindowState.WAITING and b.status == BatchStatus.OPEN:
            b.status = BatchStatus.SCHEDULED
        if state == WindowState.OPEN and b.status == BatchStatus.SCHEDULED:
            b.status = BatchStatus.OPEN
    session.commit()
    return closed


def _skip_waiting(session: Session, batch: Batch, now: dt.datetime) -> None:
    reason = f"{NOT_RUN_PREFIX} the batch window ended at {as_utc(batch.not_after).isoformat()}"  # type: ignore[arg-type]
    session.execute(update(Job).where(Job.batch_id == batch.id, Job.admitted_at.is_(None),
                                      Job.status == JobStatus.QUEUED)
                    .values(status=JobStatus.CANCELLED, stage=Stage.CANCELLED, error=reason, finished_at=now))


def _waiting(session: Session, closed: set[str], free: int) -> list[Row]:
    """The shots :func:`fair_order` may pick: each station's ``free`` oldest waiting outside a closed window (no
    station gets more). Found from outside: every pass (each second) read every waiting shot, 0.63 s a pass with
    40,000 shots of archive batches queued."""
    waiting = [_lane(), Job.admitted_at.is_(None), Job.status == JobStatus.QUEUED]
    if closed:
        waiting.append(or_(Job.batch_id.is_(None), Job.batch_id.not_in(closed)))
    turn = func.row_number().over(partition_by=Job.station_id, order_by=(Job.created_at, Job.id))
    ranked = select(Job.id, Job.station_id, Job.created_at, Job.batch_id, Job.priority,
                    turn.label("turn")).where(*waiting).subquery()
    return list(session.execute(select(ranked).where(ranked.c.turn <= free)).all())


def _admit(session: Session, closed: set[str], free: int, now: dt.datetime) -> list[tuple[str, str]]:
    waiting = _waiting(session, closed, free)
    if not waiting:
        return []
    last = dict(session.execute(select(Job.station_id, func.max(Job.admitted_at)).where(
        _lane(), Job.admitted_at.is_not(None)).group_by(Job.station_id)).all())
    picked = fair_order([Candidate(r.id, r.station_id, as_utc(r.created_at)) for r in waiting],
                        {s: as_utc(t) for s, t in last.items() if t is not None}, free)
    priority = {r.id: r.priority for r in waiting}
    batch_of = {r.id: r.batch_id for r in waiting}
    admitted = []
    for i, c in enumerate(picked):  # distinct times keep the stations' rotation ordered
        at = now + dt.timedelta(microseconds=i)
        if execute_update(session, update(Job).where(Job.id == c.job_id, Job.admitted_at.is_(None),
                                                     Job.status == JobStatus.QUEUED).values(admitted_at=at)):
            admitted.append((c.job_id, priority[c.job_id]))
            if batch_of[c.job_id] is not None:
                session.execute(update(Batch).where(Batch.id == batch_of[c.job_id], Batch.status.in_(UNFINISHED))
                                .values(status=BatchStatus.RUNNING,
                                        started_at=func.coalesce(Batch.started_at, at)))
    session.commit()
    return admitted


def finish_batches(session: Session, now: dt.datetime) -> list[str]:
    """Sealed batches with shots, none of them active: done (some rendered) or failed (none did). Claimed with
    a conditional UPDATE, so exactly one pass reports each."""
    finished = []
    # one grouped query for every open batch (a query each, each pass, was 0.12 s with 200 batches open)
    shots = session.execute(select(Batch.id, func.count().filter(Job.status.in_(ACTIVE)), func.count().filter(
        Job.status == JobStatus.DONE)).join(Job, Job.batch_id == Batch.id)
        .where(Batch.status.in_(UNFINISHED), Batch.sealed.is_(True)).group_by(Batch.id)).all()
    for batch_id, active, done in shots:  # batches with shots only
        if active:
            continue
        status = BatchStatus.DONE if done else BatchStatus.FAILED
        if execute_update(session, update(Batch).where(Batch.id == batch_id, Batch.status.in_(UNFINISHED))
                          .values(status=status, finished_at=now)):
            finished.append(batch_id)
    session.commit()
    return finished


def unsent_notifications(session: Session, stale_after_s: float) -> list[str]:
    """Batches that finished over ``stale_after_s`` ago with a webhook never attempted: their notification
    message was lost (a crash between the commit and the send); the reconciler sends it again."""
    stale = utcnow() - dt.timedelta(seconds=stale_after_s)
    return list(session.scalars(select(Batch.id).where(
        Batch.webhook_url.is_not(None), Batch.webhook_attempts == 0, Batch.webhook_delivered_at.is_(None),
        Batch.status.in_((BatchStatus.DONE, BatchStatus.FAILED)), Batch.finished_at < stale)))
