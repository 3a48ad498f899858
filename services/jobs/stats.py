"""Counts read from the database at scrape time (the metrics endpoint's gauges)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.db.models import Job
from services.jobs.service import STATUSES


def jobs_by_status(session: Session) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for status, n in session.execute(select(Job.status, func.count()).group_by(Job.status)):
        counts[status] = int(n)
    return counts


def decode_failures(session: Session) -> int:
    """Jobs that failed because a frame could not be decoded."""
    return int(session.scalar(select(func.count()).where(Job.status == "failed",
                                                         Job.error.like("decode failed%"))) or 0)
