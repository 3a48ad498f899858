"""Batch use cases for the API: create (from server-side paths or empty), add uploaded shots, read, list,
report, cancel. Shots become jobs through the job service (same probe and checks as an upload)."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session, selectinload

from services.batches.paths import raw_files
from services.batches.states import NOT_RUN, NOT_RUN_PREFIX, UNFINISHED, BatchStatus, WindowMissed
from services.batches.webhook import check_url
from services.batches.windows import make_window, studio_zone
from services.config import Settings
from services.db.models import Batch, Job, Station, as_utc, new_id, utcnow
from services.db.session import execute_update
from services.errors import BadInput, Conflict, Forbidden, NotFound
from services.export.recipes import resolve_recipes
from services.jobs import service as jobs
from services.jobs.states import ACTIVE, JobStatus, Priority, parse_enum
from services.stations import ensure_visible, owner_filter
from services.storage import Storage
from services.storage.keys import frame_key, job_prefix


@dataclass(frozen=True)
class BatchRequest:
    name: str
    recipes: tuple[str, ...] = ()
    priority: str | None = None
    not_before: str | None = None
    not_after: str | None = None
    on_window_end: str | None = None
    paths: tuple[str, ...] = ()
    webhook_url: str | None = None
    sealed: bool = True  # False: more shots are coming (uploads); the batch does not end before it is sealed


def _validated(request: BatchRequest, settings: Settings) -> Batch:
    """A new batch row from the request, every field checked (``BadInput`` otherwise); not yet added."""
    if not request.name.strip():
        raise BadInput("name: a batch needs a name")
    recipes = [r.name for r in resolve_recipes(request.recipes)]  # at most MAX_RECIPES_PER_JOB, as every shot
    priority = parse_enum(Priority, request.priority or Priority.BATCH, "priority")
    missed = request.on_window_end and parse_enum(WindowMissed, request.on_window_end, "on_window_end")
    window = make_window(request.not_before, request.not_after, studio_zone(settings.timezone))
    url = check_url(request.webhook_url, settings.webhook_allow_loopback)
    now = utcnow()
    if window.not_after is not None and window.not_after <= now and \
            (missed or settings.batch_window_missed) == WindowMissed.SKIP:
        raise BadInput(f"not_after: the window ended at {window.not_after.isoformat()}, and shots a window missed "
                       f"are skipped (on_window_end=skip): no shot of this batch could run")
    status = BatchStatus.SCHEDULED if window.not_before and window.not_before > now else BatchStatus.OPEN
    return Batch(id=new_id(), name=request.name.strip()[:200], status=status, recipes=recipes, priority=priority,
                 not_before=window.not_before, not_after=window.not_after, on_window_end=missed or None,
                 webhook_url=url, webhook_secret=secrets.token_hex(32) if url else None, webhook_attempts=0,
                 sealed=request.sealed, created_at=now)


def create_batch(session: Session, storage: Storage, settings: Settings, station: Station, request: BatchRequest
                 ) -> Batch:
    """Validate, import the RAW files under ``paths`` (each file one shot) and record the batch and its jobs
    (queued, waiting for admission). Paths given but matching no RAW file are refused."""
    batch = _validated(request, settings)
    files = raw_files(settings.import_root, list(request.paths)) if request.paths else []
    if request.paths and not files:
        raise BadInput("the paths hold no RAW file: a batch of zero shots")
    staged = [(new_id(), f) for f in files]
    received: list[tuple[str, jobs.ReceivedFile]] = []
    try:
        for job_id, f in staged:
            upload = _copy_in(storage, job_id, f, settings.import_root)
            received.append((job_id, jobs.probe_uploads(storage, [upload])[0]))
    except BaseException:
        for job_id, _ in staged:
            storage.delete_prefix(job_prefix(job_id))
        raise
    batch.station_id = station.id
    session.add(batch)
    session.commit()
    for job_id, rf in received:
        jobs.create_job(session, station, job_id, [rf], camera=None, recipe=None, recipes=batch.recipes,
                        priority=batch.priority, sha256=[], batch_id=batch.id)
    return batch


def _copy_in(storage: Storage, job_id: str, path: Path, root: Path | None) -> jobs.Upload:
    """Copy a server-side file into the job's uploads, hashed while written (the original is never touched). Its
    original name is its path under the import root (``night/x/frame_00.dng``), so two shots of one file name
    in different folders stay apart in the report and in ``strata batch download``."""
    name = jobs.safe_name(path.name, 0)
    key = frame_key(job_id, 0, name)
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as src, storage.writer(key) as dst:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
    try:
        original = path.relative_to(root.resolve()).as_posix() if root is not None else path.name
    except ValueError:  # not under the root's resolved form (raw_files checked it is under the root)
        original = path.name
    return jobs.Upload(name=path.name, storage_key=key, sha256=digest.hexdigest(), bytes=size, original_name=original)


def add_shot(session: Session, storage: Storage, station: Station, batch_id: str, job_id: str,
             uploads: Sequence[jobs.Upload], request: jobs.JobRequest) -> Job:
    """An uploaded shot joins an unfinished batch, with the batch's recipes and priority unless the form gives
    them; it waits for admission like the batch's other shots."""
    batch = get_batch(session, station, batch_id)
    if batch.station_id != station.id:  # an admin sees every batch; its shots are its station's own
        raise Forbidden(f"batch {batch_id} belongs to another station: only its station adds shots to it")
    if batch.status not in UNFINISHED:
        raise Conflict(f"batch {batch_id} is {batch.status}; it takes no more shots")
    form = jobs.JobRequest(camera=request.camera, recipes=request.recipe_names or tuple(batch.recipes),
                           priority=request.priority or batch.priority, sha256=request.sha256,
                           naming=request.naming)
    return jobs.submit_job(session, storage, station, job_id, uploads, form, batch_id=batch.id)


def get_batch(session: Session, station: Station, batch_id: str) -> Batch:
    """A batch its station, or an admin, may see (NotFound otherwise, as for one that does not exist)."""
    batch = session.get(Batch, batch_id)
    if batch is None:
        raise NotFound(f"batch {batch_id} not found")
    ensure_visible(station, batch.station_id, f"batch {batch_id}")
    return batch


def list_batches(session: Session, station: Station, *, limit: int, cursor: str | None,
                 station_name: str | None = None) -> tuple[list[Batch], str | None]:
    """The batches this principal sees (a station: its own; an admin: all, or ``station_name``'s), newest first,
    keyset-paged like jobs."""
    owner = owner_filter(station, station_name, session)
    stmt = select(Batch).order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit + 1)
    if owner is not None:
        stmt = stmt.where(Batch.station_id == owner)
    if cursor:
        created, batch_id = jobs.decode_cursor(cursor)
        stmt = stmt.where(or_(Batch.created_at < created, and_(Batch.created_at == created, Batch.id < batch_id)))
    batches = list(session.scalars(stmt))
    last = batches[limit - 1] if len(batches) > limit else None
    return batches[:limit], None if last is None else jobs.encode_cursor(as_utc(last.created_at), last.id)


def batch_jobs(session: Session, batch: Batch) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.batch_id == batch.id)
                                .options(selectinload(Job.frames), selectinload(Job.outputs))
                                .order_by(Job.created_at, Job.id)))


@dataclass
class Tally:
    """A batch's shots counted by shot status (:func:`shot_status`), and its done shots' finish times."""

    counts: dict[str, int] = field(default_factory=dict)
    done_finished: int = 0  # done shots with a finish time
    last_done_at: dt.datetime | None = None


def batch_tallies(session: Session, batch_ids: Sequence[str]) -> dict[str, Tally]:
    """Each batch's :class:`Tally` (an empty one for a batch with no shot), counted by the database in one query
    for all of them. Found from outside: the batch list loaded every shot of every batch it showed, with frames and
    outputs, three queries a batch (the dashboard's poll of 50 batches, three of them 1,000-shot nights: 0.85 s)."""
    prefix = func.substr(Job.error, 1, len(NOT_RUN_PREFIX)) == NOT_RUN_PREFIX  # LIKE ignores case in SQLite
    shot = case((and_(Job.status == JobStatus.CANCELLED, prefix), NOT_RUN), else_=Job.status)
    # grouped outside a subquery: PostgreSQL does not see CASE ... $1 and CASE ... $5 as one expression
    shots = select(Job.batch_id, shot.label("shot"), Job.finished_at).where(Job.batch_id.in_(batch_ids)).subquery()
    rows = session.execute(select(shots.c.batch_id, shots.c.shot, func.count(), func.count(shots.c.finished_at),
                                  func.max(shots.c.finished_at)).group_by(shots.c.batch_id, shots.c.shot)).all()
    tallies = {batch_id: Tally() for batch_id in batch_ids}
    for batch_id, status, count, finished, last in rows:
        tally = tallies[batch_id]
        tally.counts[str(status)] = count
        if status == JobStatus.DONE:
            tally.done_finished, tally.last_done_at = finished, last
    return tallies


def shot_status(job: Job) -> str:
    """A job's status in batch terms: a shot its window skipped is ``not_run``."""
    if job.status == JobStatus.CANCELLED and (job.error or "").startswith(NOT_RUN_PREFIX):
        return NOT_RUN
    return str(job.status)


def seal_batch(session: Session, station: Station, batch_id: str) -> Batch:
    """No more shots are coming: the batch ends once every shot it has is over (at the next admission pass); one
    that got no shot at all ends cancelled now (an empty batch otherwise waits for shots for good). Sealing a
    sealed or ended batch changes nothing."""
    batch = get_batch(session, station, batch_id)  # its station's or an admin's, as cancel
    if not batch.sealed and batch.status in UNFINISHED:
        empty = not batch_jobs(session, batch)
        values = {"status": BatchStatus.CANCELLED, "finished_at": utcnow()} if empty else {}
        execute_update(session, update(Batch).where(Batch.id == batch_id, Batch.status.in_(UNFINISHED))
                       .values(sealed=True, **values))
        session.commit()
        session.refresh(batch)
    return batch


def cancel_batch(session: Session, storage: Storage, station: Station, batch_id: str) -> Batch:
    """Cancel the batch and every shot of it still queued or running (through the job service's cancel)."""
    batch = get_batch(session, station, batch_id)
    if not execute_update(session, update(Batch).where(Batch.id == batch_id, Batch.status.in_(UNFINISHED))
                          .values(status=BatchStatus.CANCELLED, finished_at=utcnow())):
        raise Conflict(f"batch {batch_id} is already {batch.status}")
    session.commit()
    for job in batch_jobs(session, batch):
        if job.status in ACTIVE:
            with contextlib.suppress(Conflict):  # it ended meanwhile
                jobs.cancel_job(session, storage, station, job.id)
    session.refresh(batch)
    return batch


def record_delivery(session: Session, batch_id: str, status: str, delivered: bool) -> int:
    """Note one webhook attempt on the batch row; returns the attempts so far."""
    batch = session.get(Batch, batch_id)
    if batch is None:
        return 0
    batch.webhook_attempts += 1
    batch.webhook_status = status[:200]
    if delivered:
        batch.webhook_delivered_at = utcnow()
    session.commit()
    return batch.webhook_attempts


def elapsed_s(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((as_utc(end) - as_utc(start)).total_seconds(), 3)
