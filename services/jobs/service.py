"""Job use cases for the API: create from received uploads, read, list, cancel."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, selectinload

from services.db.models import Frame, Job, Station, as_utc, utcnow
from services.db.session import execute_update
from services.errors import BadInput, ChecksumMismatch, Conflict, NotFound
from services.export.recipes import get_recipe
from services.jobs.cameras import resolve_camera

STATUSES = ("queued", "running", "done", "failed", "cancelled")
PRIORITIES = ("interactive", "batch")


@dataclass(frozen=True)
class ReceivedFile:
    """A fully received upload, already in storage under ``storage_key``."""

    name: str
    storage_key: str
    sha256: str
    bytes: int
    model: str  # camera model from the file's metadata ("" if unknown)


def safe_name(name: str, index: int) -> str:
    """A file name safe to use in storage keys and downloads."""
    base = Path(name.replace("\\", "/")).name
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).strip("._") or f"frame_{index:02d}"
    return cleaned[:200]


def create_job(
    session: Session,
    station: Station,
    job_id: str,
    files: list[ReceivedFile],
    *,
    camera: str | None,
    recipe: str | None,
    priority: str | None,
    sha256: list[str],
) -> Job:
    """Validate the request against the received files and record the job (status ``queued``)."""
    if not files:
        raise BadInput("no frames: upload one or more RAW files under the form field 'frames'")
    priority = (priority or "interactive").strip().lower()
    if priority not in PRIORITIES:
        raise BadInput(f"unknown priority {priority!r}; expected one of {', '.join(PRIORITIES)}")
    recipe_obj = get_recipe(recipe)
    if sha256:
        if len(sha256) != len(files):
            raise BadInput(f"got {len(sha256)} sha256 values for {len(files)} frames; give one per frame, in order")
        for i, (want, got) in enumerate(zip(sha256, files, strict=True)):
            if want.strip().lower() != got.sha256:
                raise ChecksumMismatch(f"frame {i} ({got.name}): sha256 {got.sha256} does not match {want.strip()}")
    profile = resolve_camera(camera, [f.model for f in files], len(files))
    job = Job(id=job_id, station_id=station.id, status="queued", camera=profile.name, recipe=recipe_obj.name,
              priority=priority, stage="queued", params={})
    job.frames = [Frame(index=i, name=f.name, sha256=f.sha256, bytes=f.bytes, storage_key=f.storage_key)
                  for i, f in enumerate(files)]
    session.add(job)
    session.commit()
    return job


def get_job(session: Session, station: Station, job_id: str) -> Job:
    job = session.scalars(
        select(Job).where(Job.id == job_id)
        .options(selectinload(Job.frames), selectinload(Job.shards), selectinload(Job.outputs))
    ).one_or_none()
    if job is None or job.station_id != station.id:
        raise NotFound(f"job {job_id} not found")
    return job


def _encode_cursor(job: Job) -> str:
    created = as_utc(job.created_at)
    return base64.urlsafe_b64encode(json.dumps([created.isoformat(), job.id]).encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        created, job_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return dt.datetime.fromisoformat(created), str(job_id)
    except (ValueError, TypeError) as exc:
        raise BadInput("invalid cursor") from exc


def list_jobs(
    session: Session, station: Station, *, status: str | None, limit: int, cursor: str | None
) -> tuple[list[Job], str | None]:
    """The station's jobs, newest first, keyset-paged; returns (jobs, next cursor or None)."""
    if status is not None and status not in STATUSES:
        raise BadInput(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
    stmt = (select(Job).where(Job.station_id == station.id)
            .options(selectinload(Job.frames), selectinload(Job.shards), selectinload(Job.outputs))
            .order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1))
    if status:
        stmt = stmt.where(Job.status == status)
    if cursor:
        created, job_id = _decode_cursor(cursor)
        stmt = stmt.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    jobs = list(session.scalars(stmt))
    next_cursor = _encode_cursor(jobs[limit - 1]) if len(jobs) > limit else None
    return jobs[:limit], next_cursor


def cancel_job(session: Session, station: Station, job_id: str) -> Job:
    """Cancel a queued or running job; shards not yet started are skipped by the workers."""
    job = get_job(session, station, job_id)
    done = execute_update(
        session,
        update(Job).where(Job.id == job_id, Job.status.in_(("queued", "running")))
        .values(status="cancelled", stage="cancelled", finished_at=utcnow())
    )
    session.commit()
    if not done:
        raise Conflict(f"job {job_id} is already {job.status}")
    session.refresh(job)
    return job


def output_of(job: Job, name: str):  # type: ignore[no-untyped-def]
    for out in job.outputs:
        if out.name == name:
            return out
    raise NotFound(f"job {job.id} has no output {name!r}")
